"""Seeded sweeps of the fused tail against the float64 truth: what a correct tail's error looks like.

frink-models' test checks ONE case at ``|x - y| <= 2e-4 * max(|y|, 1)``. A sweep measures
the error of a CORRECT fused tail over many cases (shapes, seeds, weight dtypes, folds,
quantization), one row per case, so ``workbench.studies.calibration`` can pick the tolerance a
correct tail exceeds with a stated small probability; :func:`mutation_sweep` runs
deliberately wrong tails on the same cases, to see which tolerances catch them.

Nothing here is a second tail. Both sides of every comparison are ``workbench.tail``'s two
pure functions of arrays, which accept a leading batch axis on the weights too:

* the truth: :func:`workbench.tail.tail_np` in float64 on the STORED weights (dtype-rounded,
  folded, dequantized), i.e. exactly what ``tail.host_tail(w, ..., dtype=np.float64)``
  computes for one case;
* the fused tail (``backend="graph"``): :func:`workbench.tail.tail_mx`, the graph that
  ``tail.fused_tail`` evaluates, here on a whole block of cases in one ``mx.eval``.

The metrics are ``workbench.tail.comparison``'s per-case functions. Two references, two questions:

* ``worst``, ``max_abs``, ``nmse``, ``ulp_*``, ``torch_ratio``: the fused tail against the
  float64 truth of the SAME stored weights. That is what a kernel test compares (the kernel
  and the host tail read the same weights), so the tolerances are calibrated on these.
* ``model_worst``, ``model_nmse``: against the float64 truth of the float32 MASTER weights,
  before any dtype rounding, fold or quantization. That is where bf16 and 4-bit weights
  show, and where a fold helps (it spreads outliers before the group scales are chosen).

The cases are ``workbench.studies.cases``'. MLX on the CPU is bit-for-bit deterministic, so
a sweep is reproducible.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.backends import BACKENDS, resolve_backend
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import DENSE_DTYPES, QuantizedBase, QuantSpec, WeightMatrix
from workbench.studies.cases import (
    BYTES_PER_CASE_FLOAT,
    CASE_BLOCK,
    CaseArrays,
    case_floats,
    case_row_weights,
    check_case_memory,
    check_fold,
    check_outliers,
    check_quant_fits,
    check_seeds,
    check_shape,
    draw_block,
    fold_label,
    quant_spec,
    with_outliers,
)
from workbench.tail.comparison import (
    max_abs_error,
    max_rel_error,
    nmse,
    torch_ratio,
    ulp_distance,
    worst_scaled_error,
)
from workbench.tail.faults import TailVariant, apply_fault, fault_docs
from workbench.tail.ops import tail_mx, tail_np
from workbench.tail.paths import fused_tail
from workbench.tail.weights import DEFAULT_EPS

#: The deliberately wrong tails (see :func:`mutation_sweep`): the five of the tail's one fault
#: vocabulary (``workbench.tail.faults``) that the batched graph tail can run, as inputs.
MUTATIONS: tuple[str, ...] = (
    "dropped_residual",
    "wrong_eps",
    "rotation_skipped",
    "sign_flipped",
    "norm_wrong_length",
)

#: What each mutation does, for tables (the registry's words).
MUTATION_DOC: dict[str, str] = fault_docs(MUTATIONS)


@dataclass
class _Stored:
    """A block's weights as one configuration stores them: numpy float64 (for the truth) and
    what the graph reads (mx arrays in the dtype, or batched quantized ``WeightMatrix``)."""

    np64: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None  # wo, gate, up, down; None: the masters
    graph: tuple[Any, Any, Any, Any]
    quantized: bool


def _fold_rows(w64: np.ndarray, fold: Any, signs: np.ndarray) -> np.ndarray:
    """Fold a batch of wo's, float64: ``W R^T`` (site INPUT, rows rotated) or ``R W`` (OUTPUT).

    ``WeightMatrix.fold_hadamard``'s math on a batch: ``rotate`` of each row; an int block
    uses each case's own signs (``D``), then the shared block transform.
    """
    if isinstance(fold, HadamardFold):
        if fold.site is FoldSite.INPUT:
            return fold.rotate(w64)
        return np.swapaxes(fold.rotate(np.swapaxes(w64, -1, -2)), -1, -2)
    return hadamard.block_transform(w64 * signs[:, None, :].astype(np.float64), int(fold))


def _to_np64(a: mx.array) -> np.ndarray:
    return np.asarray(a.astype(mx.float32)).astype(np.float64)


def _store(
    c: CaseArrays, dtype: str, fold: Any, spec: QuantSpec | None, master64: tuple[np.ndarray, ...] | None = None
) -> _Stored:
    """What ``TailWeights.from_arrays(..., fold=, dtype=, quantize=)`` stores, for a batch.

    Order as there: round to ``dtype``; fold wo in float64 from the rounded weights, store the
    fold as float32 then ``dtype``; quantize last (wo after its fold).
    """
    dt = DENSE_DTYPES[dtype]
    mats = [mx.array(a).astype(dt) for a in (c.wo, c.gate, c.up, c.down)]
    if fold is not None:
        folded = _fold_rows(_to_np64(mats[0]), fold, c.signs)
        mats[0] = mx.array(folded.astype(np.float32)).astype(dt)
    if spec is None:
        if dtype == "float32" and fold is None:  # the master arrays themselves: skip the round trip
            np64 = master64[:4] if master64 is not None else None  # None: made by _truth when asked
        else:
            np64 = tuple(_to_np64(m) for m in mats)
        return _Stored(np64, tuple(mats), False)  # type: ignore[arg-type]
    graph, np64 = [], []
    for m in mats:
        parts = mx.quantize(m, **spec.as_quantize())
        wq, scales = parts[0], parts[1]
        biases = parts[2] if len(parts) > 2 else None
        _, o, i = m.shape
        qb = QuantizedBase(wq, scales, biases, spec, (int(o), int(i)))
        # A WeightMatrix over a BATCH of quantized bases: tail_mx calls its matvec_base,
        # i.e. mx.quantized_matmul, as fused_tail does; the activations get a row axis.
        graph.append(WeightMatrix(qb))
        np64.append(_to_np64(qb.dequantize()))
    return _Stored(tuple(np64), tuple(graph), True)  # type: ignore[arg-type]


def _graph_fold(fold: Any) -> HadamardFold | None:
    """The fold the batched graph applies after the per-case signs are already on the branch."""
    if fold is None or isinstance(fold, HadamardFold):
        return fold
    return HadamardFold(int(fold))  # B only: D (this case's signs) is applied to the branch first


def _variant_args(c: CaseArrays, fold: Any, eps: float, mutation: str | None) -> dict[str, Any]:
    """The tail's inputs, float32, for the correct tail (``None``) or one mutation.

    Every mutation is the SAME tail given one wrong thing (``workbench.tail.faults`` says which
    and applies it), so none needs a graph of its own. Two switches of a variant become inputs
    of the graph here: ``rotations == 0`` drops the fold and the per-case signs (wo still
    stores ``W R^T``); ``norm_length = n'`` (the mean square over ``n'`` instead of ``hidden``)
    is ``rsqrt(S / n + eps n' / n)`` times ``sqrt(n / n')``, i.e. the norm weight and eps rescaled,
    since the graph's mean divides by the vector's own length.
    """
    h = c.shape[0]
    # The fault sees the branch before D: negating an element commutes with D's signs, exactly.
    v = apply_fault(
        mutation, TailVariant(None, None, None, None, c.ffn_norm, eps, c.branch, c.residual), allowed=MUTATIONS
    )
    signs_applied = fold is not None and not isinstance(fold, HadamardFold) and v.rotations == 1
    gfold = None if v.rotations == 0 else _graph_fold(fold)
    branch = v.branch * c.signs if signs_applied else v.branch  # exact: D x
    norm, e = v.ffn_norm, v.eps
    if v.norm_length is not None:
        norm = (norm.astype(np.float64) * math.sqrt(h / v.norm_length)).astype(np.float32)
        e = v.eps * v.norm_length / h
    return {"fold": gfold, "ffn_norm": norm, "eps": e, "branch": branch, "residual": v.residual}


def _truth(st: _Stored, c: CaseArrays, fold: Any, eps: float) -> np.ndarray:
    """float64 truth on the stored weights: ``tail_np`` (what ``host_tail`` computes)."""
    a = _variant_args(c, fold, eps, None)
    wo, g, u, d = st.np64 if st.np64 is not None else _master64(c)[:4]
    return tail_np(
        wo,
        a["fold"],
        a["ffn_norm"].astype(np.float64),
        g,
        u,
        d,
        a["eps"],
        a["branch"].astype(np.float64),
        a["residual"].astype(np.float64),
    )


def _master64(c: CaseArrays) -> tuple[np.ndarray, ...]:
    """The master arrays in float64 (exact): wo, gate, up, down, ffn_norm, branch, residual."""
    return tuple(a.astype(np.float64) for a in (c.wo, c.gate, c.up, c.down, c.ffn_norm, c.branch, c.residual))


def _model_truth(c: CaseArrays, eps: float, master64: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """float64 truth of the float32 master weights: no rounding, no fold, no quantization."""
    wo, g, u, d, norm, branch, residual = master64 if master64 is not None else _master64(c)
    return tail_np(wo, None, norm, g, u, d, eps, branch, residual)


def _graph_start(st: _Stored, c: CaseArrays, fold: Any, eps: float, mutation: str | None) -> mx.array:
    """The fused graph (``tail_mx``) on a batch, its one evaluation started (``mx.async_eval``):
    MLX evaluates it on its own thread while the caller computes the float64 truth, so on two
    cores the two overlap. The same graph, the same bits as evaluating it at once."""
    a = _variant_args(c, fold, eps, mutation)
    lift = (lambda v: mx.array(v)[:, None, :]) if st.quantized else mx.array
    wo, g, u, d = st.graph
    # A batch is several rows of x for each quantized product: where MLX's CUDA product is
    # wrong for several rows (an in dimension one group long), WeightMatrix.matvec_base runs
    # that product on MLX's CPU (weights.cuda_quantized_rows_wrong).
    out = tail_mx(wo, a["fold"], lift(a["ffn_norm"]), g, u, d, a["eps"], lift(a["branch"]), lift(a["residual"]))
    if st.quantized:
        out = out[:, 0, :]
    mx.async_eval(out)
    return out


def _graph(st: _Stored, c: CaseArrays, fold: Any, eps: float, mutation: str | None) -> np.ndarray:
    """The fused graph (``tail_mx``) on a batch, evaluated once: float32 [S, hidden]."""
    return np.array(_graph_start(st, c, fold, eps, mutation))


def _metrics(actual: np.ndarray, truth: np.ndarray, model: np.ndarray | None) -> dict[str, np.ndarray]:
    ulp = ulp_distance(actual, truth)
    out = {
        "worst": worst_scaled_error(actual, truth),
        "max_abs": max_abs_error(actual, truth),
        "max_rel": max_rel_error(actual, truth),
        "nmse": nmse(actual, truth),
        "torch_ratio": torch_ratio(actual, truth),
        "ulp_max": ulp.max(axis=-1),
        "ulp_mean": ulp.mean(axis=-1),
    }
    if model is truth:  # float32 weights, no fold, no quantization: the stored weights are the masters
        out["model_worst"], out["model_nmse"] = out["worst"], out["nmse"]
    elif model is not None:
        out["model_worst"] = worst_scaled_error(actual, model)
        out["model_nmse"] = nmse(actual, model)
    return out


def _configs(
    dtypes: Sequence[str],
    folds: Sequence[Any],
    quantize: Sequence[Any],
    backends: Sequence[str],
    shape: tuple[int, int, int],
) -> list[tuple[str, Any, str, QuantSpec | None, str]]:
    out = []
    for d in dtypes:
        validate.one_of("dtypes", d, tuple(DENSE_DTYPES))
    for bk in backends:
        validate.one_of("backends", bk, tuple(b for b in BACKENDS if b != "auto"))  # a sweep names its backends
        resolve_backend(bk)  # BackendUnavailable, saying what is missing, for an absent one
    for f in folds:
        check_fold(f, shape)
    for d in dtypes:
        for f in folds:
            for q in quantize:
                label, spec = quant_spec(q)
                check_quant_fits(spec, shape)
                for bk in backends:
                    out.append((d, f, label, spec, bk))
    return out


def _progress(total: int, progress: bool | None, desc: str):
    show = total * CASE_BLOCK >= 50_000 if progress is None else bool(progress)
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="block", file=sys.stderr)


def _run(
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    dtypes: Sequence[str],
    folds: Sequence[Any],
    quantize: Sequence[Any],
    backends: Sequence[str],
    eps: float,
    mutations: Sequence[str | None],
    progress: bool | None,
    desc: str,
    wo_outliers: int,
):
    eps = validate.number("eps", eps, minimum=0, exclusive_minimum=True)
    if progress is not None:
        progress = validate.flag("progress", progress)
    seeds_arr = check_seeds(seeds)
    shapes = [check_shape(s) for s in validate.sequence("shapes", shapes, what="(hidden, branch, ffn) triples")]
    dtypes = validate.sequence("dtypes", dtypes, what=f"dtypes in {tuple(DENSE_DTYPES)}")
    folds = validate.sequence("folds", folds, what="None, block sizes or HadamardFolds")
    quantize = validate.sequence("quantize", quantize, what="None, format names or dicts")
    backends = validate.sequence("backends", backends, what="backend names")
    per_block = min(CASE_BLOCK, len(np.unique(seeds_arr)))
    for shp in shapes:
        check_case_memory(shp, per_block)  # before any work: a block is held at once
    plan = [(shp, _configs(dtypes, folds, quantize, backends, shp)) for shp in shapes]
    ks = [check_outliers(wo_outliers, shp[1]) for shp in shapes]
    blocks = np.unique(seeds_arr // CASE_BLOCK)
    bar = _progress(len(blocks) * len(shapes), progress, desc)
    frames = []
    try:
        for si, ((shp, configs), k) in enumerate(zip(plan, ks)):

            def draw(blk: int, shp: tuple[int, int, int] = shp, k: int = k) -> CaseArrays:
                want = seeds_arr[seeds_arr // CASE_BLOCK == blk]
                return with_outliers(draw_block(shp, int(blk), np.unique(want) - blk * CASE_BLOCK), k)

            # The next block is drawn while this block's last graphs evaluate on MLX's thread,
            # where two blocks fit in memory at once.
            ahead = 2 * BYTES_PER_CASE_FLOAT * per_block * case_floats(shp) <= validate.memory_cap_bytes()
            c_next = draw(blocks[0])
            for bi in range(len(blocks)):
                c, c_next = c_next, None
                m64 = model = None
                for ci, (dtype, fold, qlabel, spec, bk) in enumerate(configs):
                    st = _store(c, dtype, fold, spec, m64)
                    plain = dtype == "float32" and fold is None and spec is None
                    # The graphs first (MLX evaluates them on its thread), then the float64 truths here.
                    runs = [
                        (mi, mut, _graph_start(st, c, fold, eps, mut) if bk == "graph" else None)
                        for mi, mut in enumerate(mutations)
                        if not (mut == "rotation_skipped" and fold is None)
                    ]  # no fold: no rotation to skip
                    if model is None:
                        m64 = _master64(c)
                        model = _model_truth(c, eps, m64)
                    truth = model if plain else _truth(st, c, fold, eps)
                    if ahead and ci == len(configs) - 1 and bi + 1 < len(blocks):
                        c_next = draw(blocks[bi + 1])
                    for mi, mut, started in runs:
                        if started is not None:
                            actual = np.array(started)  # waits for the graph's evaluation
                        else:
                            actual = _kernel_rows(shp, c, dtype, fold, spec, bk, eps, mut)
                        m = _metrics(actual, truth, None if mut is not None else model)
                        meta = (shp[0], shp[1], shp[2], k, dtype, fold_label(fold), qlabel, bk)
                        order = (si * len(configs) + ci) * len(mutations) + mi  # sorted on below
                        frames.append((order, meta, mut, c.seeds, m))
                if c_next is None and bi + 1 < len(blocks):
                    c_next = draw(blocks[bi + 1])
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    out = _frame(frames, with_mutation=mutations != [None])
    # One tidy order whatever the blocking: shape, then configuration (as given), then
    # mutation, then seed.
    out = out.sort_values(["_order", "seed"], kind="stable")
    out = out.drop(columns="_order").reset_index(drop=True)
    for col in ("dtype", "fold", "quant", "backend") + (("mutation",) if mutations != [None] else ()):
        out[col] = out[col].astype("category")
    return out


#: The columns that say which case a row is, before ``seed`` and the metrics.
_META = ("hidden", "branch", "ffn", "wo_outliers", "dtype", "fold", "quant", "backend")


def _frame(parts: list, *, with_mutation: bool):
    """One DataFrame from every block's ``(order, meta, mutation, seeds, metrics)``, built once:
    a frame a block, each column inserted, cost more than the graph at the test shape.
    Columns: :data:`_META`, ``mutation`` (mutation sweeps), ``seed``, the metrics, ``_order``."""
    import pandas as pd

    lengths = [len(p[3]) for p in parts]
    data: dict[str, np.ndarray] = {}
    for j, name in enumerate(_META):
        values = [p[1][j] for p in parts]
        data[name] = np.repeat(np.array(values, dtype=np.int64 if j < 4 else object), lengths)
    if with_mutation:
        data["mutation"] = np.repeat(np.array([p[2] for p in parts], dtype=object), lengths)
    data["seed"] = np.concatenate([p[3] for p in parts])
    for name in parts[0][4]:
        data[name] = np.concatenate([p[4][name] for p in parts])
    data["_order"] = np.repeat(np.array([p[0] for p in parts], dtype=np.int64), lengths)
    return pd.DataFrame(data)


def _kernel_rows(shp, c: CaseArrays, dtype, fold, spec, backend, eps, mutation) -> np.ndarray:
    """A kernel backend, case by case through ``tail.fused_tail`` (kernels take one weight set)."""
    if mutation is not None:
        raise ValueError("mutations are defined on the graph backend only (backend 'graph')")
    rows = []
    for i in range(len(c.seeds)):
        w, branch, residual = case_row_weights(c, i, dtype=dtype, fold=fold, spec=spec, eps=eps)
        rows.append(fused_tail(w, branch, residual, backend=backend))
    return np.stack(rows)


def sweep(
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    dtypes: Sequence[str] = ("float32",),
    folds: Sequence[Any] = (None,),
    quantize: Sequence[Any] = (None,),
    backends: Sequence[str] = ("graph",),
    eps: float = DEFAULT_EPS,
    wo_outliers: int = 0,
    progress: bool | None = None,
):
    """The correct fused tail against the float64 truth, every combination, one row per case.

    ``shapes``: (hidden, branch, ffn) triples; ``seeds``: non-negative ints (a case depends
    only on its seed and shape; repeats are swept once); ``dtypes``: weight dtypes in
    ``weights.DENSE_DTYPES``; ``folds``:
    ``None``, a block size (per-case random signs on wo's input, as frink-models' test folds it) or a
    ``HadamardFold`` (the same one for every case); ``quantize``: ``None``, a name in
    :data:`~workbench.fold.weights.QUANT_FORMATS` or a dict of mode/bits/group_size (all four matrices, wo folded
    first); ``backends``: ``"graph"`` (batched, one ``mx.eval`` per block of
    :data:`CASE_BLOCK` cases) or a kernel backend (case by case; absent ones raise
    ``BackendUnavailable``). ``wo_outliers``: that many of wo's input columns
    :data:`OUTLIER_SCALE` times larger (what a fold is for). ``progress``: a tqdm bar on
    stderr (``None``: only for 50,000 cases and up).

    Returns a tidy ``pandas.DataFrame``: ``hidden, branch, ffn, wo_outliers, dtype, fold, quant,
    backend, seed``, then against the truth of the stored weights ``worst`` (the criterion's worst
    ``|x - y| / max(|y|, 1)``), ``max_abs``, ``max_rel``, ``nmse``, ``torch_ratio`` (<= 1
    passes torch's float32 defaults), ``ulp_max``, ``ulp_mean`` (float32 ulps), and against
    the truth of the float32 master weights ``model_worst``, ``model_nmse``. Rows are
    ordered by shape, configuration (dtypes x folds x quantize x backends, as given), seed.
    """
    return _run(
        shapes=shapes,
        seeds=seeds,
        dtypes=dtypes,
        folds=folds,
        quantize=quantize,
        backends=backends,
        eps=eps,
        mutations=[None],
        progress=progress,
        desc="sweep",
        wo_outliers=wo_outliers,
    )


def mutation_sweep(
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    dtypes: Sequence[str] = ("float32",),
    folds: Sequence[Any] = (None,),
    quantize: Sequence[Any] = (None,),
    mutations: Sequence[str] = MUTATIONS,
    eps: float = DEFAULT_EPS,
    wo_outliers: int = 0,
    progress: bool | None = None,
):
    """Deliberately wrong tails (:data:`MUTATIONS`) against the truth of the correct one.

    Same cases and columns as :func:`sweep` (graph backend), plus ``mutation``; no
    ``model_*`` columns. ``rotation_skipped`` has rows only for folded configurations (a
    skipped rotation is invisible without a fold). Feed the result to ``calibration.catch_rates``.
    """
    mutations = validate.sequence("mutations", mutations, what=f"mutation names in {MUTATIONS}")
    for m in mutations:
        validate.one_of("mutations", m, MUTATIONS)
    return _run(
        shapes=shapes,
        seeds=seeds,
        dtypes=dtypes,
        folds=folds,
        quantize=quantize,
        backends=("graph",),
        eps=eps,
        mutations=list(mutations),
        progress=progress,
        desc="mutations",
        wo_outliers=wo_outliers,
    )
