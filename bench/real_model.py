"""SmolLM2-135M with mlx-lm's layers against the workbench's fused tail in every layer.

    python -m bench.real_model                       # this device: graph (and every kernel backend present)
    python -m bench.real_model --tokens 32 --rounds 5 --backends graph,cuda

Two measurements, each variant side by side in one run, interleaved round by round (so
drift in a shared machine's load hits every variant alike):

* **decode tokens/s**: the prompt prefilled once into mlx-lm's KV cache (not timed), then
  ``--tokens`` greedy steps timed, with mlx-lm's layers (``reference``) and with the fused
  tail swapped into all 30 layers (``fused-<backend>``); the tokens of every variant are
  checked equal to the reference's first (a variant that decodes something else is not
  timed, it is reported);
* **ms per layer tail** at one position (a decode step's shape): mlx-lm's own modules
  (``o_proj``, the add, the norm, the MLP, the add: ``reference``), the workbench's
  unfused tail (two waits) and the fused tail per backend, all checked against the float64
  host tail first; beside them the floor, the tail's weight bytes over this device's
  measured copy bandwidth.

Prints both tables and writes a record (device, date, MLX version, command) to
``data/bench/`` unless ``--no-record``.
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
import numpy as np

from bench.common import record
from workbench import backends, tail
from workbench.tail.comparison import compare
from workbench.real_models.end_to_end import PROMPT, smollm2
from workbench.real_models.reference_model import capture_layers, fused_tails


def decode_rate(model: Any, prompt: tuple[int, ...], n: int) -> tuple[float, list[int]]:
    """Seconds for ``n`` greedy decode steps after a prefilled prompt, and the tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([list(prompt)], dtype=mx.int32), cache=cache)[0, -1]
    tok = int(mx.argmax(logits).item())
    out = [tok]
    t0 = time.perf_counter()
    for _ in range(n):
        logits = model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1]
        tok = int(mx.argmax(logits).item())  # the read is the step's one wait
        out.append(tok)
    return time.perf_counter() - t0, out


def bench_decode(rm: Any, names: list[str], tokens: int, rounds: int) -> dict[str, Any]:
    weights = rm.tail_weights()
    variants: dict[str, list[float]] = {"reference": []}
    variants.update({f"fused-{b}": [] for b in names})
    seqs: dict[str, list[int]] = {}
    for _ in range(rounds):
        for name in variants:
            if name == "reference":
                secs, seq = decode_rate(rm.model, rm.prompt_ids, tokens)
            else:
                with fused_tails(rm.model, weights, backend=name.split("-", 1)[1]):
                    secs, seq = decode_rate(rm.model, rm.prompt_ids, tokens)
            variants[name].append(tokens / secs)
            seqs.setdefault(name, seq)
    ref = seqs["reference"]
    return {name: {"tokens_per_s_median": float(np.median(v)), "tokens_per_s": v, "same_tokens": seqs[name] == ref,
                   "tokens": seqs[name]} for name, v in variants.items()}


def bench_tail(rm: Any, layer: int, names: list[str], repeats: int, warmup: int, bandwidth: float) -> dict[str, Any]:
    cap = capture_layers(rm.model, rm.prompt_ids)[layer]
    br, res = cap.branch[-1:], cap.residual[-1:]  # the last position: one decode step's tail
    w = rm.checkpoint.tail_weights(layer)
    block = rm.model.layers[layer]
    truth = tail.host_tail(w, br, res)
    br_mx, res_mx = mx.array(br), mx.array(res)

    def reference() -> np.ndarray:
        h = res_mx + block.self_attn.o_proj(br_mx)
        out = h + block.mlp(block.post_attention_layernorm(h))
        return np.asarray(out)

    fns = {"reference": reference, "unfused": lambda: tail.unfused_tail(w, br, res)}
    for b in names:
        fns[f"fused-{b}"] = (lambda b=b: tail.fused_tail(w, br, res, backend=b))
    checks = {k: compare(fn(), truth) for k, fn in fns.items()}
    failed = {k: str(c) for k, c in checks.items() if not c.passed}
    if failed:
        raise SystemExit(f"a tail disagrees with the float64 host tail: {failed}")
    times = record.time_rounds(fns, repeats, warmup)
    floor_ms = w.nbytes / bandwidth * 1e3
    return {
        "layer": layer,
        "weight_bytes": w.nbytes,
        "floor_ms": floor_ms,
        "variants": {k: {**record.summarize(ts), "worst_vs_float64": checks[k].worst} for k, ts in times.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = record.parser("real_model", __doc__)
    kernel_names = [b for b in backends.BACKENDS if b not in ("auto",)]
    p.add_argument("--backends", default=",".join(backends.available_backends()),
                   help="fused backends to run, comma-separated (default: every one this machine has)")
    p.add_argument("--tokens", type=int, default=16, help="greedy decode steps timed per round (default 16)")
    p.add_argument("--rounds", type=int, default=3, help="decode rounds per variant (default 3)")
    p.add_argument("--repeats", type=int, default=50, help="timed tail runs per variant (default 50)")
    p.add_argument("--layer", type=int, default=15, help="the layer whose tail is timed (default 15)")
    args = p.parse_args(argv)
    names = record.comma_list(p, "--backends", args.backends, kernel_names)
    for flag, v in (("--tokens", args.tokens), ("--rounds", args.rounds), ("--repeats", args.repeats)):
        if v < 1:
            p.error(f"{flag} must be >= 1; got {v}")
    if not 0 <= args.layer < 30:
        p.error(f"--layer must be in 0..29; got {args.layer}")
    for b in names:
        backends.resolve_backend(b)  # BackendUnavailable names what is missing

    rm = smollm2()
    bandwidth = record.copy_bandwidth(1 << 26)
    tail_result = bench_tail(rm, args.layer, names, args.repeats, warmup=5, bandwidth=bandwidth)
    decode = bench_decode(rm, names, args.tokens, args.rounds)

    ref_tps = decode["reference"]["tokens_per_s_median"]
    print(f"\nSmolLM2-135M Q4_1, prompt {PROMPT!r} ({len(rm.prompt_ids)} tokens), {args.tokens} decode steps x {args.rounds} rounds")
    print(f"{'variant':<16}{'tokens/s':>10}{'vs reference':>14}{'same tokens':>13}")
    for name, d in decode.items():
        print(f"{name:<16}{d['tokens_per_s_median']:>10.2f}{d['tokens_per_s_median'] / ref_tps:>13.2f}x"
              f"{str(d['same_tokens']):>13}")
    ref_ms = tail_result["variants"]["reference"]["median_ms"]
    print(f"\nlayer {args.layer}'s tail at one position: {tail_result['weight_bytes'] / 1e6:.2f} MB of weights, "
          f"floor {tail_result['floor_ms']:.4f} ms at {bandwidth / 1e9:.1f} GB/s")
    print(f"{'variant':<16}{'median ms':>11}{'vs reference':>14}{'x floor':>10}{'worst vs f64':>14}")
    for name, v in tail_result["variants"].items():
        print(f"{name:<16}{v['median_ms']:>11.3f}{ref_ms / v['median_ms']:>13.2f}x"
              f"{v['median_ms'] / tail_result['floor_ms']:>10.1f}{v['worst_vs_float64']:>14.2e}")

    rec = {
        **record.provenance("real_model", argv),
        "model": str(rm.checkpoint.config.name),
        "checkpoint": rm.checkpoint.source,
        "prompt": PROMPT,
        "prompt_tokens": list(rm.prompt_ids),
        "bandwidth_bytes_per_s": bandwidth,
        "decode": decode,
        "tail": tail_result,
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("real_model", rec["device"].get("device_name")),
                     force=args.force)
    return rec


if __name__ == "__main__":
    main()
