"""The fused tail inside a real model, and one tail against the ops it replaces at three sizes.

    python -m bench.real_model                              # this device, every part
    python -m bench.real_model --shapes smollm2 --formats affine4 --tokens 16 --rounds 3   # a quick CPU run

* **decode**: SmolLM2-135M's (Q4_1 GGUF) greedy tokens a second and a CPU second, after :data:`WARMUP` untimed
  steps, with mlx-lm's layers (``reference``, ``reference-qkv``) and the fused tail in all 30 layers
  (:func:`decode_variants`); every variant's tokens must equal the reference's. Each step is also split into
  building, encoding and waiting, and timed as mlx-lm's own loop runs it; ``--profile`` (CUDA) and
  ``--host-profile`` add where the device's and the host's time goes.
* **one tail**: one evaluation and ``--chain`` tails in one evaluation, at SmolLM2's shape (layer ``--layer``
  and synthetic), a 1B Llama's and Bonsai-27B's, in bf16 and affine 4-bit: the ops mlx-lm runs (``reference``)
  against the fused tail's variants (:func:`tail_variants`), each first checked against the float64 host
  tail (2e-4), beside the floor (weight bytes over this device's copy bandwidth).

Variants are interleaved round by round, so drift in a shared machine's load hits each alike. Prints tables and
writes ``data/bench/real_model-<device>-<UTC time>.json`` unless ``--no-record``
(``workbench.reports.real_model`` reads it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import cli, record, step_profile, timing
from workbench import backends, tail
from workbench.fold import QuantizedBase, WeightMatrix
from workbench.kernels import OneLaunchTail, fits, prepared, shape_for
from workbench.models import BONSAI_SHAPE
from workbench.real_models import (
    LAZY_BACKENDS,
    PROMPT,
    capture_layers,
    fused_tails,
    model_graph_tail,
    smollm2,
    stacked_qkv,
    stored_dtype,
    vector_tail,
)
from workbench.reports import real_model as real_model_report
from workbench.tail import SEED_TOL, compare

#: The synthetic shapes (hidden, branch, ffn) beside SmolLM2's own layer.
SHAPES: dict[str, tuple[int, int, int]] = {
    "smollm2": (576, 576, 1536),
    "mid": (2048, 2048, 8192),
    "bonsai": BONSAI_SHAPE,
}

#: The weight formats of the per-layer comparison: ``TailWeights.random`` arguments.
FORMATS: dict[str, dict[str, Any]] = {
    "bf16": {"dtype": "bfloat16"},
    "affine4": {"dtype": "float16", "quantize": {"mode": "affine", "bits": 4, "group_size": 32}},
}

#: The one launch's candidate shapes, as changes to the rule's (``one_launch.shape_for``).
CANDIDATES: dict[str, dict[str, Any]] = {
    "rule": {},
    "full": {"groups": None},
    "g64": {"groups": 64},
    "g32": {"groups": 32},
    "g16": {"groups": 16},
    "nt256": {"nt": 256, "groups": None},
    "nt256-g32": {"nt": 256, "groups": 32},
}


#: Greedy steps run after the prefill and before the clock starts, in every variant alike:
#: the first steps trace what ``mx.compile`` traces for one position (the reference's
#: compiled SwiGLU, a fused graph tail) and load kernels; the timed steps are the steady
#: state a decoder runs in.
WARMUP = 2


def _primed(model: Any, prompt: tuple[int, ...], warmup: int, pipelined: bool = False) -> tuple[Any, list[int]]:
    """mlx-lm's KV cache with ``prompt`` prefilled and ``warmup`` greedy steps taken, and the
    tokens so far. ``pipelined``: the warm-up steps in the pipelined loop, as the timed ones
    will run (its token goes in as argmax's uint32, not int32: other kernels, compiled on first use)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([list(prompt)], dtype=mx.int32), cache=cache)[0, -1]
    out = [int(mx.argmax(logits).item())]
    if pipelined and warmup:
        _pipelined_steps(model, cache, out, warmup)
    else:
        _steps(model, cache, out, warmup)
    return cache, out


def _step(model: Any, cache: Any, tok: int) -> mx.array:
    """One greedy decode step's lazy token after ``tok``, through mlx-lm's KV cache."""
    return mx.argmax(model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1])


def _steps(
    model: Any, cache: Any, out: list[int], n: int, split: list[tuple[float, float, float]] | None = None
) -> None:
    """``n`` greedy steps from ``out[-1]``, their tokens appended to ``out``; with
    ``split``, each step's seconds appended to it in three parts: building the step's
    graph (Python and MLX making the ops), encoding it (``mx.async_eval``: MLX turning the
    ops into device work, on this thread) and waiting for the token (the read)."""
    tok = out[-1]
    for _ in range(n):
        t0 = time.perf_counter()
        y = _step(model, cache, tok)
        t1 = time.perf_counter()
        mx.async_eval(y)
        t2 = time.perf_counter()
        tok = int(y.item())  # the read is the step's one wait
        if split is not None:
            split.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        out.append(tok)


def _pipelined_steps(model: Any, cache: Any, out: list[int], n: int) -> None:
    """``n`` greedy steps as mlx-lm's ``generate_step`` runs them: step k+1's graph is built
    from step k's lazy token and handed to the device before step k's token is read, so
    the host builds one step while the device runs the one before."""

    def step(tok: mx.array) -> mx.array:
        return mx.argmax(model(tok.reshape(1, 1), cache=cache)[0, -1])

    y = step(mx.array(out[-1], dtype=mx.int32))
    mx.async_eval(y)
    for i in range(n):
        nxt = step(y) if i + 1 < n else None
        if nxt is not None:
            mx.async_eval(nxt)
        out.append(int(y.item()))
        y = nxt


def decode_rate(
    model: Any,
    prompt: tuple[int, ...],
    n: int,
    warmup: int = WARMUP,
    split: list[tuple[float, float, float]] | None = None,
    pipelined: bool = False,
) -> tuple[float, float, list[int]]:
    """Wall seconds and this process's CPU seconds for ``n`` greedy decode steps after a
    prefilled prompt and ``warmup`` untimed steps, and the tokens. The CPU seconds (all
    threads) are what a variant costs on a CPU shared with other work, where the wall
    clock also counts the waits for a core. ``split``: as for :func:`_steps`.
    ``pipelined``: the steps as mlx-lm's generation loop runs them (:func:`_pipelined_steps`)."""
    cache, out = _primed(model, prompt, warmup, pipelined)
    t0, c0 = time.perf_counter(), time.process_time()
    if pipelined:
        _pipelined_steps(model, cache, out, n)
    else:
        _steps(model, cache, out, n, split)
    return time.perf_counter() - t0, time.process_time() - c0, out


def step_ops(model: Any, prompt: tuple[int, ...]) -> dict[str, int]:
    """The ops in one decode step's graph (``step_profile.graph_ops``), after the warm-up."""
    cache, out = _primed(model, prompt, WARMUP)
    logits = model(mx.array([[out[-1]]], dtype=mx.int32), cache=cache)[0, -1]
    ops = step_profile.graph_ops(mx.argmax(logits))
    mx.eval(logits)
    return ops


def host_profile(model: Any, prompt: tuple[int, ...], steps: int) -> list[dict[str, Any]]:
    """The top functions of ``steps`` decode steps' graph building (``step_profile.build_profile``),
    after the warm-up, step after step."""
    cache, out = _primed(model, prompt, WARMUP)
    tok = [out[-1]]

    def build() -> mx.array:
        return _step(model, cache, tok[0])

    def take(y: mx.array) -> None:
        tok[0] = int(y.item())

    return step_profile.build_profile(build, take, steps)


def bench_decode(
    rm: Any, variants: dict[str, Callable[[], Any]], tokens: int, rounds: int, profile: bool = False, host: bool = False
) -> dict[str, Any]:
    """``variants``: name -> a context manager factory (``None`` for mlx-lm's own layers).
    ``profile``: also each variant's kernels a step (``step_profile.device_profile``);
    ``host``: also where building a step spends the host's time (:func:`host_profile`)."""
    rates: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    piped: dict[str, list[float]] = {k: [] for k in variants}
    splits: dict[str, list[tuple[float, float, float]]] = {k: [] for k in variants}
    seqs: dict[str, list[int]] = {}
    piped_same: dict[str, bool] = {}
    ops: dict[str, dict[str, int]] = {}
    prof: dict[str, dict[str, Any]] = {}
    hosts: dict[str, list[dict[str, Any]]] = {}
    order = list(variants)
    for i in range(rounds):
        for name in order if i % 2 == 0 else order[::-1]:  # no variant always first after the prefill
            ctx = variants[name]
            with ctx() if ctx is not None else contextlib.nullcontext():
                secs, cpu_secs, seq = decode_rate(rm.model, rm.prompt_ids, tokens, split=splits[name])
                p_secs, _, p_seq = decode_rate(rm.model, rm.prompt_ids, tokens, pipelined=True)
                piped[name].append(tokens / p_secs)
                piped_same[name] = piped_same.get(name, True) and p_seq == seq
                if i == 0:
                    ops[name] = step_ops(rm.model, rm.prompt_ids)
                if profile and i == rounds - 1:
                    cache, out = _primed(rm.model, rm.prompt_ids, WARMUP)
                    prof[name] = step_profile.device_profile(
                        lambda c=cache, o=out: _steps(rm.model, c, o, tokens), tokens
                    )
                if host and i == rounds - 1:
                    hosts[name] = host_profile(rm.model, rm.prompt_ids, tokens)
            rates[name].append(tokens / secs)
            cpu[name].append(tokens / cpu_secs)
            seqs.setdefault(name, seq)
    ref = seqs["reference"]

    def paired(a: list[float], b: list[float]) -> float:
        return float(np.median(np.asarray(a) / np.asarray(b)))

    def split_ms(name: str) -> dict[str, float]:
        parts = np.asarray(splits[name]) * 1e3
        return {k: float(np.median(parts[:, j])) for j, k in enumerate(("build_ms", "encode_ms", "wait_ms"))}

    return {
        name: {
            "tokens_per_s_median": float(np.median(v)),
            "tokens_per_s": v,
            "tokens_per_cpu_s_median": float(np.median(cpu[name])),
            "tokens_per_cpu_s": cpu[name],
            "pipelined_tokens_per_s_median": float(np.median(piped[name])),
            "pipelined_tokens_per_s": piped[name],
            "pipelined_same_tokens": piped_same[name],
            # the ratio to the reference round by round (the same round's load on both), median
            "vs_reference_paired": paired(v, rates["reference"]),
            "pipelined_vs_reference_paired": paired(piped[name], piped["reference"]),
            "step_split_ms": split_ms(name),
            "same_tokens": seqs[name] == ref,
            "tokens": seqs[name],
            "ops_per_step": sum(ops[name].values()),
            "ops": ops[name],
            **({"device_profile": prof[name]} if name in prof else {}),
            **({"build_profile": hosts[name]} if name in hosts else {}),
        }
        for name, v in rates.items()
    }


# -- one tail ------------------------------------------------------------------------------


def mlx_lm_style(launch: tail.TailLaunch, act: Any) -> Callable[[mx.array, mx.array], mx.array]:
    """The tail as mlx-lm's modules run it (``QuantizedLinear`` / ``Linear``, ``RMSNorm``,
    its SwiGLU), activations in ``act``; no fold (the synthetic tails carry none)."""

    def lin(m: WeightMatrix) -> Callable[[mx.array], mx.array]:
        base, _ = m.launch_parts()
        if isinstance(base, QuantizedBase):
            q = base
            return lambda x: mx.quantized_matmul(
                x,
                q.w,
                q.scales,
                q.biases,
                transpose=True,
                group_size=q.spec.group_size,
                bits=q.spec.bits,
                mode=q.spec.mode,
            )
        w = base.astype(act)
        return lambda x: x @ w.T

    wo, gate, up, down = lin(launch.wo), lin(launch.gate), lin(launch.up), lin(launch.down)
    norm = launch.ffn_norm.astype(act)
    swiglu = mx.compile(lambda g, u: g * mx.sigmoid(g) * u)  # mlx-lm's swiglu is compiled too

    def run(b: mx.array, r: mx.array) -> mx.array:
        h = r + wo(b[None])[0]
        n = mx.fast.rms_norm(h, norm, launch.eps)
        return h + down(swiglu(gate(n[None]), up(n[None])))[0]

    return run


def act_dtype(w: tail.TailWeights) -> Any:
    """The activations' dtype mlx-lm keeps for weights like ``w``'s: their float dtype (a
    quantized matrix's: its scales'), ``graph_tail.stored_dtype``."""
    return stored_dtype(tail.tail_launch(w))


def tail_variants(
    w: tail.TailWeights, cuda: bool, act: Any = mx.float32
) -> dict[str, Callable[[mx.array, mx.array], mx.array]]:
    """Every fused variant of ``w``'s tail as a lazy function of (branch, residual) float32
    vectors: ``graph`` (as ``fused_tails`` runs it, weights prepared once, compiled), ``graph-eager``
    (not compiled), ``graph-ops`` (``tail_graph``'s ops as written: what the preparation saves) and, on
    CUDA, ``cuda-3`` (three launches) and ``cuda-1:<shape>`` (one launch a candidate shape; ``annotated``:
    the rule's shape with its comments handed to MLX). With ``act`` (the activations' dtype the reference
    runs in) half precision, also the graph tail in it (``graph-stored``: reported, not judged)."""
    launch = tail.tail_launch(w)
    fns: dict[str, Callable[[mx.array, mx.array], mx.array]] = {
        "graph": vector_tail(launch, "graph"),
        "graph-eager": model_graph_tail(launch, compiled=False),
        "graph-ops": mx.compile(lambda b, r: tail.tail_graph(launch, b, r)),
    }
    if act != mx.float32 and stored_dtype(launch) == act:  # the activations as mlx-lm keeps them
        fns[real_model_report.STORED_GRAPH] = model_graph_tail(launch, activations="stored")
    if cuda:
        prep = prepared(launch, "cuda")
        fns["cuda-3"] = prep.compiled()
        rule = shape_for(prep)
        for name, change in CANDIDATES.items():
            shape = dataclasses.replace(rule, **change)
            if fits(prep, shape):
                fns[f"cuda-1:{name}"] = OneLaunchTail(prep, shape).compiled()
        if fits(prep, rule):  # the rule's shape, its text handed to MLX with the comments
            fns["cuda-1:annotated"] = OneLaunchTail(prep, rule, compact_source=False).compiled()
    return fns


def time_tail(
    fns: dict[str, Callable[[mx.array, mx.array], mx.array]], b: mx.array, r: mx.array, repeats: int, chain: int
) -> dict[str, dict[str, float]]:
    """Per variant: one tail in one evaluation (ms, median of ``repeats``) and a tail in a
    chain of ``chain`` in one evaluation (ms a tail, median of ``max(5, repeats // 5)``
    chains, each also split into build, encode and wait: :func:`chain_split`)."""

    def one(fn: Callable) -> Callable[[], None]:
        return lambda: mx.eval(fn(b, r))

    single = timing.time_rounds({k: one(f) for k, f in fns.items()}, repeats, warmup=5)
    chains = chain_split(fns, b, r, max(5, repeats // 5), chain)
    return {k: {**timing.summarize(single[k]), **chains[k]} for k in fns}


def chain_split(
    fns: dict[str, Callable[[mx.array, mx.array], mx.array]],
    b: mx.array,
    r: mx.array,
    rounds: int,
    chain: int,
    warmup: int = 2,
) -> dict[str, dict[str, float]]:
    """Per variant, a chain of ``chain`` tails in one evaluation: ``chain_ms_per_tail`` (the
    whole chain's wall time, median over ``rounds``, a tail's share) and the chain split as a
    decode step is (``_steps``) into building its graph, encoding it (``mx.async_eval``) and
    the wait, each a median in us a tail; variants interleaved round by round, the order
    reversed every other round. Where a model's decode is the host's, build and encode are
    what a tail costs it."""
    parts: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
    order = list(fns)
    for i in range(warmup + rounds):
        for k in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            out = r
            for _ in range(chain):
                out = fns[k](b, out)
            t1 = time.perf_counter()
            mx.async_eval(out)
            t2 = time.perf_counter()
            mx.eval(out)
            t3 = time.perf_counter()
            if i >= warmup:
                parts[k].append((t1 - t0, t2 - t1, t3 - t2))
    out: dict[str, dict[str, float]] = {}
    for k, v in parts.items():
        a = np.asarray(v)
        m = np.median(a, axis=0) * 1e6 / chain
        out[k] = {
            "chain_ms_per_tail": float(np.median(a.sum(axis=1))) * 1e3 / chain,
            "chain_build_us": float(m[0]),
            "chain_encode_us": float(m[1]),
            "chain_wait_us": float(m[2]),
        }
    return out


def bench_shape(
    label: str,
    w: tail.TailWeights,
    reference: Callable[[mx.array, mx.array], mx.array] | None,
    act: Any,
    cuda: bool,
    repeats: int,
    chain: int,
    bandwidth: float,
    seed: int = 0,
) -> dict[str, Any]:
    """One tail's variants at one shape and format: checked against float64, then timed."""
    br, res = tail.random_inputs(w, seed=seed)
    return bench_tail_inputs(label, w, br, res, reference, act, cuda, repeats, chain, bandwidth)


def bench_tail_inputs(
    label: str,
    w: tail.TailWeights,
    br: np.ndarray,
    res: np.ndarray,
    reference: Callable[[mx.array, mx.array], mx.array] | None,
    act: Any,
    cuda: bool,
    repeats: int,
    chain: int,
    bandwidth: float,
) -> dict[str, Any]:
    truth = tail.host_tail(w, br, res)
    launch = tail.tail_launch(w)
    fused = tail_variants(w, cuda, act)
    ref = reference or mlx_lm_style(launch, act)
    b32, r32 = mx.array(br.astype(np.float32)), mx.array(res.astype(np.float32))
    b_act = b32.astype(act)
    mx.eval(b_act)

    def reference_fn(b: mx.array, r: mx.array) -> mx.array:
        # The residual goes in as given: in a chain each tail takes the previous one's output
        # (already in the activations' dtype, so no cast is timed); a reference that ignored it
        # would leave all but the last tail of a chain out of the evaluated graph.
        return ref(b_act, r if r.dtype == act else r.astype(act))

    fns: dict[str, Callable[[mx.array, mx.array], mx.array]] = {"reference": reference_fn}
    fns.update(fused)
    checks = {k: compare(np.asarray(fn(b32, r32).astype(mx.float32)), truth) for k, fn in fns.items()}
    # the reference and the stored-activation graph round their activations where they are
    # half precision: reported, not judged (mlx-lm's rounding)
    judged = {k: c for k, c in checks.items() if k not in real_model_report.UNJUDGED or act == mx.float32}
    failed = {k: str(c) for k, c in judged.items() if not c.passed}
    if failed:
        raise SystemExit(f"{label}: a tail disagrees with the float64 host tail: {failed}")
    times = time_tail(fns, b32, r32, repeats, chain)
    hidden, branch, ffn = w.shape
    return {
        "label": label,
        "hidden": hidden,
        "branch": branch,
        "ffn": ffn,
        "weights": w.wo.dtype,
        "activations": str(act).replace("mlx.core.", ""),
        "weight_bytes": int(w.nbytes),
        "floor_ms": w.nbytes / bandwidth * 1e3,
        "variants": {k: {**times[k], "worst_vs_float64": checks[k].worst, "passed": checks[k].passed} for k in fns},
    }


def best_one_launch(row: dict[str, Any], key: str = "chain_ms_per_tail") -> str | None:
    """The one-launch candidate with the least ``key`` in a shape's row (None without CUDA)."""
    cands = {
        k: v[key] for k, v in row["variants"].items() if k.startswith("cuda-1:") and k.split(":", 1)[1] in CANDIDATES
    }
    return min(cands, key=cands.get) if cands else None


# -- the command ---------------------------------------------------------------------------


def print_tails(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        ref = row["variants"]["reference"]
        print(
            f"\n{row['label']}: hidden {row['hidden']}, branch {row['branch']}, FFN {row['ffn']}, {row['weights']} "
            f"({row['weight_bytes'] / 1e6:.2f} MB), reference activations {row['activations']}, "
            f"floor {row['floor_ms']:.4f} ms"
        )
        print(
            f"{'variant':<20}{'one eval ms':>12}{'vs ref':>8}{'chain ms/tail':>15}{'vs ref':>8}{'x floor':>9}"
            f"{'worst vs f64':>14}{'build us':>10}{'encode us':>11}{'wait us':>9}"
        )
        for k, v in row["variants"].items():
            print(
                f"{k:<20}{v['median_ms']:>12.4f}{ref['median_ms'] / v['median_ms']:>7.2f}x"
                f"{v['chain_ms_per_tail']:>15.4f}{ref['chain_ms_per_tail'] / v['chain_ms_per_tail']:>7.2f}x"
                f"{v['median_ms'] / row['floor_ms']:>9.1f}{v['worst_vs_float64']:>14.2e}"
                f"{v['chain_build_us']:>10.2f}{v['chain_encode_us']:>11.2f}{v['chain_wait_us']:>9.2f}"
            )


def decode_variants(model: Any, weights: list[Any], names: list[str]) -> dict[str, Callable[[], Any] | None]:
    """The decode comparison's variants, each a factory of the context manager it runs in
    (``None``: mlx-lm's own layers), for the fused backends ``names``; nothing is built until
    a factory is called."""
    variants: dict[str, Callable[[], Any] | None] = {"reference": None}
    for b in names:
        variants[f"fused-{b}"] = lambda b=b: fused_tails(model, weights, backend=b)
    for b in names:  # the same, each block norming its own input: what carrying the norm saves
        variants[f"fused-{b}-own-norm"] = lambda b=b: fused_tails(model, weights, backend=b, carry_norm=False)
    # each attention's q, k, v as one product: in mlx-lm's layers alone, and beside the fused tails
    variants["reference-qkv"] = lambda: stacked_qkv(model)
    for b in names:
        variants[f"fused-{b}-qkv"] = lambda b=b: fused_tails(model, weights, backend=b, stack_qkv=True)
    for b in (n for n in names if n in ("graph", "cuda")):  # the two with a choice of trace
        variants[f"fused-{b}-qkv-per-layer"] = lambda b=b: fused_tails(
            model, weights, backend=b, stack_qkv=True, trace="per-layer"
        )
    return variants


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("real_model", __doc__)
    lazy = [b for b in LAZY_BACKENDS]
    p.add_argument(
        "--backends",
        default=",".join(b for b in backends.available_backends() if b in lazy),
        help="fused backends of the decode comparison, comma-separated (default: every lazy one here)",
    )
    p.add_argument(
        "--variants", default="", help="decode variants to run, comma-separated (default: all; reference is always run)"
    )
    p.add_argument("--tokens", type=int, default=32, help="greedy decode steps timed per round")
    p.add_argument("--rounds", type=int, default=5, help="decode rounds per variant")
    p.add_argument("--repeats", type=int, default=50, help="timed one-evaluation runs of each tail variant")
    p.add_argument("--chain", type=int, default=30, help="tails in one evaluation for the in-graph figure")
    p.add_argument("--layer", type=int, default=15, help="SmolLM2's layer whose tail is timed")
    p.add_argument("--shapes", default=",".join(SHAPES), help="synthetic shapes of the per-layer comparison")
    p.add_argument("--formats", default=",".join(FORMATS), help="weight formats of the per-layer comparison")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also each decode variant's kernels and device time a step (PyTorch's profiler, CUDA only)",
    )
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="also where building a decode step spends the host's time, per variant (Python's profiler)",
    )
    args = p.parse_args(argv)
    names = cli.comma_list(p, "--backends", args.backends, lazy)
    shapes = cli.comma_list(p, "--shapes", args.shapes, list(SHAPES)) if args.shapes else []
    formats = cli.comma_list(p, "--formats", args.formats, list(FORMATS)) if args.formats else []
    for flag, v in (
        ("--tokens", args.tokens),
        ("--rounds", args.rounds),
        ("--repeats", args.repeats),
        ("--chain", args.chain),
    ):
        if v < 1:
            p.error(f"{flag} must be >= 1; got {v}")
    if not 0 <= args.layer < 30:
        p.error(f"--layer must be in 0..29; got {args.layer}")
    for b in names:
        backends.resolve_backend(b)  # BackendUnavailable names what is missing
    # checked now, not after the minutes the tails take: every name the decode can run (the
    # variants' factories are only named here, not called; the best shape's is added later)
    known = list(decode_variants(None, [], names))
    known += [f"fused-cuda-{c}" for c in CANDIDATES if c != "rule" and "cuda" in names]
    asked = cli.comma_list(p, "--variants", args.variants, known) if args.variants else known
    if args.profile:
        try:
            step_profile.check_available()
        except step_profile.ProfileUnavailable as e:
            p.error(f"--profile: {e}")
    cuda = "cuda" in backends.available_backends()

    rm = smollm2()
    bandwidth = timing.copy_bandwidth(1 << 28)

    # one tail: SmolLM2's real layer first, then the synthetic shapes
    cap = capture_layers(rm.model, rm.prompt_ids)[args.layer]
    block = rm.model.layers[args.layer]

    def model_ops(b: mx.array, r: mx.array) -> mx.array:
        # one row, not a vector: MLX 0.32.4's CUDA quantized_matmul fails on 1-D input
        h = r[None] + block.self_attn.o_proj(b[None])
        return (h + block.mlp(block.post_attention_layernorm(h)))[0]

    rows = [
        bench_tail_inputs(
            f"SmolLM2-135M layer {args.layer} (real, Q4_1)",
            rm.checkpoint.tail_weights(args.layer),
            cap.branch[-1],
            cap.residual[-1],
            model_ops,
            mx.float32,
            cuda,
            args.repeats,
            args.chain,
            bandwidth,
        )
    ]
    for s in shapes:
        for f in formats:
            w = tail.TailWeights.random(*SHAPES[s], seed=0, **FORMATS[f])
            rows.append(bench_shape(f"{s} {f}", w, None, act_dtype(w), cuda, args.repeats, args.chain, bandwidth))
            del w
    print_tails(rows)

    # decode: mlx-lm's layers against every lazy backend; with CUDA, also the one launch in
    # the candidate shape that was fastest in a chain at the real layer, where it is not the rule
    weights = rm.tail_weights()
    variants = decode_variants(rm.model, weights, names)
    best = best_one_launch(rows[0])
    chosen = None
    if cuda and "cuda" in names and best is not None and best != "cuda-1:rule":
        launch = tail.tail_launch(weights[args.layer])
        rule = shape_for(prepared(launch, "cuda"))
        chosen = dataclasses.replace(rule, **CANDIDATES[best.split(":", 1)[1]])

        @contextlib.contextmanager
        def best_shape() -> Any:
            with fused_tails(rm.model, weights, backend="cuda", shape=chosen):
                yield

        variants[f"fused-cuda-{best.split(':', 1)[1]}"] = best_shape
    if args.variants:
        variants = {k: v for k, v in variants.items() if k == "reference" or k in asked}
    decode = bench_decode(rm, variants, args.tokens, args.rounds, profile=args.profile, host=args.host_profile)
    ref_tps = decode["reference"]["tokens_per_s_median"]
    print(
        f"\nSmolLM2-135M Q4_1, prompt {PROMPT!r} ({len(rm.prompt_ids)} tokens), {args.tokens} decode steps x "
        f"{args.rounds} rounds"
    )
    ref_cpu = decode["reference"]["tokens_per_cpu_s_median"]
    print(
        f"{'variant':<28}{'tokens/s':>10}{'vs reference':>14}{'paired':>8}{'tokens/CPU s':>14}{'vs reference':>14}"
        f"{'ops a step':>12}{'same tokens':>13}"
    )
    for name, d in decode.items():
        print(
            f"{name:<28}{d['tokens_per_s_median']:>10.2f}{d['tokens_per_s_median'] / ref_tps:>13.2f}x"
            f"{d['vs_reference_paired']:>7.2f}x"
            f"{d['tokens_per_cpu_s_median']:>14.2f}{d['tokens_per_cpu_s_median'] / ref_cpu:>13.2f}x"
            f"{d['ops_per_step']:>12d}{str(d['same_tokens']):>13}"
        )
    ref_piped = decode["reference"]["pipelined_tokens_per_s_median"]
    print(
        f"\n{'variant':<28}{'build ms':>10}{'encode ms':>11}{'wait ms':>9}"
        f"{'pipelined tok/s':>17}{'vs reference':>14}{'paired':>8}{'same tokens':>13}"
    )
    for name, d in decode.items():
        sp = d["step_split_ms"]
        print(
            f"{name:<28}{sp['build_ms']:>10.3f}{sp['encode_ms']:>11.3f}{sp['wait_ms']:>9.3f}"
            f"{d['pipelined_tokens_per_s_median']:>17.2f}{d['pipelined_tokens_per_s_median'] / ref_piped:>13.2f}x"
            f"{d['pipelined_vs_reference_paired']:>7.2f}x{str(d['pipelined_same_tokens']):>13}"
        )
    if args.host_profile:
        for name, d in decode.items():
            print(f"\n{name}: building a step, the functions with the most own time (us a step, profiled)")
            for f in d["build_profile"][:10]:
                print(
                    f"  {f['own_us_per_step']:>9.1f} own {f['cum_us_per_step']:>9.1f} cum "
                    f"{f['calls_per_step']:>7.1f} calls"
                    f"  {f['function']}"
                )
    if args.profile:
        print(f"\n{'variant':<28}{'kernels a step':>16}{'device us a step':>18}{'graph launches':>16}")
        for name, d in decode.items():
            pr = d["device_profile"]
            print(
                f"{name:<28}{pr['kernels_per_step']:>16.1f}{pr['device_us_per_step']:>18.1f}"
                f"{pr['graph_launches_per_step']:>16.1f}"
            )
        for name, d in decode.items():
            calls = d["device_profile"]["host_api"]
            print(
                f"\n{name}: CUDA API calls, host us a step: "
                + ", ".join(f"{c['name']} {c['us_per_step']:.1f} ({c['per_step']:.0f})" for c in calls)
            )

    rec = {
        **record.provenance("real_model", argv),
        "model": str(rm.checkpoint.config.name),
        "checkpoint": rm.checkpoint.source,
        "prompt": PROMPT,
        "prompt_tokens": list(rm.prompt_ids),
        "bandwidth_bytes_per_s": bandwidth,
        "decode": decode,
        "tail": rows[0],  # SmolLM2's real layer (the record kind's one-tail field)
        "tails": rows,
        "one_launch_candidates": CANDIDATES,
        "decode_best_shape": None if chosen is None else dataclasses.asdict(chosen),
        "decode_warmup_steps": WARMUP,
        "tolerance": SEED_TOL,
    }
    if not args.no_record:
        record.write(
            rec, args.out_dir, record.record_stem("real_model", rec["device"].get("device_name")), force=args.force
        )
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.real_model"))
