"""Error metrics, seeded sweeps of the fused tail against the float64 truth, tolerance calibration.

The seed checks ONE case at ``|x - y| <= 2e-4 * max(|y|, 1)``. This module measures what the
error of a CORRECT fused tail looks like over many cases (shapes, seeds, weight dtypes,
folds, quantization), picks the tolerance a correct tail exceeds with a stated small
probability, and checks which tolerances catch deliberately wrong tails.

Nothing here is a second tail. Both sides of every comparison are ``workbench.tail``'s two
pure functions of arrays, which accept a leading batch axis on the weights too:

* the truth: :func:`workbench.tail.tail_np` in float64 on the STORED weights (dtype-rounded,
  folded, dequantized), i.e. exactly what ``tail.host_tail(w, ..., dtype=np.float64)``
  computes for one case;
* the fused tail (``backend="graph"``): :func:`workbench.tail.tail_mx`, the graph that
  ``tail.fused_tail`` evaluates, here on a whole block of cases in one ``mx.eval``.

``tests/test_errors.py`` holds the batched path to ``tail.host_tail`` / ``tail.fused_tail``
case by case (:func:`case_weights` rebuilds any row as a ``TailWeights``).

Two references, two questions:

* ``margin``, ``max_abs``, ``nmse``, ``ulp_*``, ``torch_ratio``: the fused tail against the
  float64 truth of the SAME stored weights. That is what a kernel test compares (the kernel
  and the host tail read the same weights), so the tolerances are calibrated on these.
* ``model_margin``, ``model_nmse``: against the float64 truth of the float32 MASTER weights,
  before any dtype rounding, fold or quantization. That is where bf16 and 4-bit weights show,
  and where a fold helps (it spreads outliers before the group scales are chosen).

Cases are drawn in blocks of :data:`CASE_BLOCK` seeds from one numpy stream per block
(``default_rng([SWEEP_SALT, hidden, branch, ffn, seed // CASE_BLOCK])``): one bulk draw per
block is what makes 100,000 cases a minute's work (a generator per seed costs more than the
whole tail), and a case still depends only on its own seed and shape, never on what else is
swept. MLX on the CPU is bit-for-bit deterministic, so a sweep is reproducible.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from workbench import hadamard, tail
from workbench.fold import FoldSite, HadamardFold
from workbench.weights import QuantizedBase, QuantSpec, WeightMatrix, check_quant_spec

#: Salt of the sweep's streams (the seed test's LCG start value, for want of a better number).
SWEEP_SALT = 6_180_339

#: Seeds per bulk draw (and per batched evaluation). Part of the case definition: changing
#: it changes every case, so it is a constant, not a parameter.
CASE_BLOCK = 256

#: Weight dtypes a sweep accepts (activations and accumulation stay float32, as in tail.py).
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

_MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

#: Named quantization formats (``mx.quantize`` arguments), as the notebooks label them.
QUANT_FORMATS: dict[str, dict[str, Any]] = {
    "affine4": {"mode": "affine", "bits": 4, "group_size": 64},
    "affine8": {"mode": "affine", "bits": 8, "group_size": 64},
    "mxfp4": {"mode": "mxfp4", "bits": 4, "group_size": 32},
    "nvfp4": {"mode": "nvfp4", "bits": 4, "group_size": 16},
    "mxfp8": {"mode": "mxfp8", "bits": 8, "group_size": 32},
}

#: ``torch.testing.assert_close`` defaults (rtol, atol) per dtype (reference/tolerances.md);
#: the tail's output is float32, so ``torch_ratio`` uses the float32 pair.
TORCH_DEFAULTS: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}

#: Reference tolerances from trusted projects (reference/tolerances.md), as
#: ``name -> (metric column, limit)``: a case passes when ``column <= limit``.
REFERENCE_TOLERANCES: dict[str, tuple[str, float]] = {
    # the seed's criterion, |x - y| <= 2e-4 max(|y|, 1) per element
    "seed 2e-4": ("margin", tail.SEED_TOL),
    # torch.testing.assert_close float32 defaults: |x - y| <= 1e-5 + 1.3e-6 |y|
    "torch f32 defaults": ("torch_ratio", 1.0),
    # MLX python/tests/test_fast.py: rms_norm max abs error vs an fp32 reference, fp32 / bf16
    "MLX test_fast fp32 1e-6": ("max_abs", 1e-6),
    "MLX test_fast bf16 1e-2": ("max_abs", 1e-2),
    # llama.cpp test-backend-ops NMSE limits: default (rms_norm too), mul_mat, fused mul_mat_vec
    "llama.cpp NMSE 1e-7": ("nmse", 1e-7),
    "llama.cpp NMSE 5e-4": ("nmse", 5e-4),
    "llama.cpp NMSE 5e-3": ("nmse", 5e-3),
}

#: The deliberately wrong tails (see :func:`mutation_sweep`).
MUTATIONS: tuple[str, ...] = (
    "dropped_residual",
    "wrong_eps",
    "rotation_skipped",
    "sign_flipped",
    "norm_wrong_length",
)

#: What each mutation does, for tables.
MUTATION_DOC: dict[str, str] = {
    "dropped_residual": "the residual is never read (zero): both adds lose it",
    "wrong_eps": "eps ten times too large (1e-5 for 1e-6: Llama's default for Qwen's)",
    "rotation_skipped": "wo's fold rotation not applied to the branch (only folded cases)",
    "sign_flipped": "one sign of the branch flipped (with a fold: one sign of D)",
    "norm_wrong_length": "RMS norm's mean over the branch length instead of hidden",
}


# =======================================================================================
# Metrics: per case (the last axis is the output vector; leading axes are cases)
# =======================================================================================


def _pair(actual: Any, expected: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(actual, dtype=np.float64)
    y = np.asarray(expected, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"actual and expected must have the same shape; got {x.shape} and {y.shape}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"actual and expected need a non-empty last axis (the output vector); got shape {x.shape}")
    return x, y


def worst_margin(actual: Any, expected: Any) -> np.ndarray:
    """The seed's criterion per case: ``max_i |x_i - y_i| / max(|y_i|, 1)`` over the last axis.

    A case passes the seed's test when this is ``<= 2e-4``. Elementwise it is
    ``tail.scaled_error`` (the same function ``tail.compare`` uses); NaN anywhere gives NaN.
    """
    x, y = _pair(actual, expected)
    e = tail.scaled_error(x, y)
    return e.max(axis=-1)  # np.max propagates NaN, which is what a failing case should show


def max_abs_error(actual: Any, expected: Any) -> np.ndarray:
    """``max_i |x_i - y_i|`` per case (MLX's test_fast criterion)."""
    x, y = _pair(actual, expected)
    return np.abs(x - y).max(axis=-1)


def max_rel_error(actual: Any, expected: Any) -> np.ndarray:
    """``max_i |x_i - y_i| / |y_i|`` per case, over the elements with ``y_i != 0`` (NaN if none)."""
    x, y = _pair(actual, expected)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(y != 0, np.abs(x - y) / np.abs(y), -np.inf)
    m = r.max(axis=-1)
    return np.where(np.isneginf(m), np.nan, m)


def nmse(actual: Any, expected: Any) -> np.ndarray:
    """``sum (x - y)^2 / sum y^2`` per case, ``y`` the reference (llama.cpp's test-backend-ops)."""
    x, y = _pair(actual, expected)
    num = np.sum((x - y) ** 2, axis=-1)
    den = np.sum(y * y, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num == 0, 0.0, np.inf))


def torch_ratio(actual: Any, expected: Any, *, dtype: str = "float32") -> np.ndarray:
    """``max_i |x_i - y_i| / (atol + rtol |y_i|)`` per case with torch's defaults for ``dtype``.

    ``torch.testing.assert_close(x, y)`` passes exactly when this is ``<= 1``.
    """
    if dtype not in TORCH_DEFAULTS:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DEFAULTS)}; got {dtype!r}")
    rtol, atol = TORCH_DEFAULTS[dtype]
    x, y = _pair(actual, expected)
    return (np.abs(x - y) / (atol + rtol * np.abs(y))).max(axis=-1)


def _bf16_bits(x32: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as int32 for arithmetic."""
    b = x32.view(np.uint32).astype(np.uint64)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    nan = np.isnan(x32)
    return np.where(nan, 0x7FC0, r).astype(np.int64)


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Sign-magnitude bit patterns -> integers in the order of the values they encode.

    +0 and -0 both map to 0, and adjacent floats to adjacent integers, so the difference of
    two mapped values is their distance in units in the last place.
    """
    sign = np.int64(1) << (width - 1)
    mag = bits & (sign - 1)
    return np.where(bits & sign, -mag, mag)


def ulp_distance(actual: Any, expected: Any, *, dtype: str = "float32") -> np.ndarray:
    """Elementwise distance in units in the last place of ``dtype`` (float64 result, exact integers).

    Both sides are rounded to ``dtype`` first (``expected`` is usually the float64 truth), so
    0 means ``actual`` IS the correctly rounded truth, 1 its neighbour, and so on; across zero
    the count runs through the subnormals. NaN where either side is NaN. bfloat16 rounds via
    float32 (a double rounding that can differ from a direct one only on exact ties).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}; got {dtype!r}")
    x = np.asarray(actual, dtype=np.float64)
    y = np.asarray(expected, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"actual and expected must have the same shape; got {x.shape} and {y.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float32":
            bx = x.astype(np.float32).view(np.uint32).astype(np.int64)
            by = y.astype(np.float32).view(np.uint32).astype(np.int64)
            width = 32
        elif dtype == "float16":
            bx = x.astype(np.float16).view(np.uint16).astype(np.int64)
            by = y.astype(np.float16).view(np.uint16).astype(np.int64)
            width = 16
        else:
            bx = _bf16_bits(np.ascontiguousarray(x.astype(np.float32)))
            by = _bf16_bits(np.ascontiguousarray(y.astype(np.float32)))
            width = 16
    d = np.abs(_ordered(bx, width) - _ordered(by, width)).astype(np.float64)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, d)


# =======================================================================================
# Cases
# =======================================================================================


def _check_shape(shape: Any) -> tuple[int, int, int]:
    try:
        h, b, f = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shapes must hold (hidden, branch, ffn) triples of positive ints; got {shape!r}") from None
    if min(h, b, f) <= 0 or tuple(shape) != (h, b, f):
        raise ValueError(f"shapes must hold (hidden, branch, ffn) triples of positive ints; got {shape!r}")
    return h, b, f


def _check_seeds(seeds: Iterable[int]) -> np.ndarray:
    s = np.asarray(list(seeds) if not isinstance(seeds, (range, np.ndarray)) else seeds)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("seeds must be a non-empty 1-D sequence of non-negative ints (e.g. range(1000))")
    if not np.issubdtype(s.dtype, np.integer) or (s < 0).any():
        raise ValueError("seeds must be non-negative ints (e.g. range(1000))")
    return s.astype(np.int64)


@dataclass(frozen=True)
class CaseArrays:
    """The float32 master arrays of a batch of cases (leading axis: cases), before any dtype
    rounding, fold or quantization. Distributions as ``TailWeights.random`` /
    ``tail.random_inputs``: matrices ``U(-a, a)``, ``a = sqrt(3 / fan_in)`` (variance
    ``1 / fan_in``), ``ffn_norm = 1 + U(-0.25, 0.25)``, branch and residual ``U(-1, 1)``
    (llama.cpp's inputs); ``signs`` (+-1 over the branch) are the fold's ``D`` when folded."""

    seeds: np.ndarray
    wo: np.ndarray  # [S, hidden, branch]
    gate: np.ndarray  # [S, ffn, hidden]
    up: np.ndarray  # [S, ffn, hidden]
    down: np.ndarray  # [S, hidden, ffn]
    ffn_norm: np.ndarray  # [S, hidden]
    branch: np.ndarray  # [S, branch]
    residual: np.ndarray  # [S, hidden]
    signs: np.ndarray  # [S, branch]

    @property
    def shape(self) -> tuple[int, int, int]:
        _, h, b = self.wo.shape
        return h, b, self.gate.shape[1]

    def rows(self, idx: Any) -> "CaseArrays":
        return CaseArrays(*(getattr(self, k)[idx] for k in self.__dataclass_fields__))


def _draw_block(shape: tuple[int, int, int], block: int) -> CaseArrays:
    """All CASE_BLOCK cases of one block: ONE bulk float32 draw, split per case in a fixed order."""
    h, b, f = shape
    sizes = [("wo", (h, b), b), ("gate", (f, h), h), ("up", (f, h), h), ("down", (h, f), f),
             ("ffn_norm", (h,), None), ("branch", (b,), None), ("residual", (h,), None), ("signs", (b,), None)]
    n = sum(math.prod(s) for _, s, _ in sizes)
    rng = np.random.default_rng([SWEEP_SALT, h, b, f, block])
    u = rng.random((CASE_BLOCK, n), dtype=np.float32)
    out: dict[str, np.ndarray] = {}
    o = 0
    for name, s, fan_in in sizes:
        k = math.prod(s)
        v = u[:, o:o + k]
        o += k
        # In place on the draw (no temporaries: this is a third of a sweep's time); each
        # value is still the float32 result of (u * 2a) - a, rounded as written.
        if fan_in is not None:  # U(-a, a) with variance 1 / fan_in, in float32
            a = math.sqrt(3.0 / fan_in)
            v *= np.float32(2 * a)
            v -= np.float32(a)
        elif name == "ffn_norm":  # 1 + (u * 0.5 - 0.25)
            v *= np.float32(0.5)
            v -= np.float32(0.25)
            v += np.float32(1.0)
        elif name == "signs":
            v = np.where(v < 0.5, np.float32(-1.0), np.float32(1.0))
        else:
            v *= np.float32(2.0)
            v -= np.float32(1.0)
        out[name] = np.ascontiguousarray(v).reshape((CASE_BLOCK,) + s)
    seeds = np.arange(block * CASE_BLOCK, (block + 1) * CASE_BLOCK, dtype=np.int64)
    return CaseArrays(seeds=seeds, **out)


#: How much larger an outlier column of wo is than the others (``wo_outliers``).
OUTLIER_SCALE = 10.0


def _check_outliers(k: Any, branch: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= branch:
        raise ValueError(f"wo_outliers must be an int in [0, {branch}] (the branch width); got {k!r}")
    return int(k)


def _with_outliers(c: CaseArrays, k: int) -> CaseArrays:
    """wo with ``k`` input columns (spread evenly: ``j * branch // k``) scaled by OUTLIER_SCALE.

    The shape of the problem a fold solves: trained LLM weights carry a few outlier input
    channels, and a quantization group that holds one spends its scale on it. Uniform
    random weights have none, and there a fold cannot help (it makes a flat distribution
    Gaussian, which quantizes slightly worse).
    """
    if k == 0:
        return c
    _, b, _ = c.shape
    wo = c.wo.copy()
    cols = (np.arange(k) * b) // k
    wo[:, :, cols] *= np.float32(OUTLIER_SCALE)
    return CaseArrays(c.seeds, wo, c.gate, c.up, c.down, c.ffn_norm, c.branch, c.residual, c.signs)


def case_arrays(shape: Sequence[int], seeds: Iterable[int], *, wo_outliers: int = 0) -> CaseArrays:
    """The master arrays of the given seeds at ``shape`` (hidden, branch, ffn), in seed order given."""
    shp = _check_shape(shape)
    s = _check_seeds(seeds)
    k = _check_outliers(wo_outliers, shp[1])
    parts = []
    for blk in np.unique(s // CASE_BLOCK):
        want = s[s // CASE_BLOCK == blk]
        parts.append(_draw_block(shp, int(blk)).rows(want - blk * CASE_BLOCK))
    cat = CaseArrays(*(np.concatenate([getattr(p, k) for p in parts]) for k in CaseArrays.__dataclass_fields__))
    order = {int(v): i for i, v in enumerate(cat.seeds)}
    return _with_outliers(cat.rows(np.array([order[int(v)] for v in s])), k)


def _quant_spec(q: Any) -> tuple[str, QuantSpec | None]:
    """``None`` / a :data:`QUANT_FORMATS` name / a dict of mode, bits, group_size -> (label, spec)."""
    if q is None:
        return "none", None
    if isinstance(q, str):
        if q not in QUANT_FORMATS:
            raise ValueError(f"quantize entries must be None, a dict of mode/bits/group_size, or one of "
                             f"{sorted(QUANT_FORMATS)}; got {q!r}")
        q = QUANT_FORMATS[q]
    if not isinstance(q, Mapping) or set(q) - {"mode", "bits", "group_size"}:
        raise ValueError(f"quantize entries must be None, a name in {sorted(QUANT_FORMATS)} or a dict of "
                         f"mode/bits/group_size; got {q!r}")
    spec = check_quant_spec(q.get("mode", "affine"), q.get("bits", 4), q.get("group_size", 64))
    return str(spec), spec


def _fold_label(fold: Any) -> str:
    if fold is None:
        return "none"
    if isinstance(fold, HadamardFold):
        return f"shared b{fold.block} {fold.site.name.lower()}"
    return f"b{int(fold)}"


def _check_fold(fold: Any, shape: tuple[int, int, int]) -> None:
    h, b, _ = shape
    if fold is None:
        return
    if isinstance(fold, HadamardFold):
        fold.check_width(b if fold.site is FoldSite.INPUT else h)
        return
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)):
        raise ValueError(f"folds entries must be None, a block size (int) or a HadamardFold; got {fold!r}")
    hadamard.factor_block(int(fold))
    if b % int(fold):
        raise ValueError(f"folds: block {fold} must divide the branch width {b} (a fold on wo's input)")


def _fold_for_case(fold: Any, signs: np.ndarray) -> HadamardFold | None:
    """The HadamardFold a single case's ``TailWeights`` carries (an int block -> that case's signs)."""
    if fold is None or isinstance(fold, HadamardFold):
        return fold
    return HadamardFold(int(fold), signs, None, FoldSite.INPUT)


def case_weights(
    shape: Sequence[int],
    seed: int,
    *,
    dtype: str = "float32",
    fold: Any = None,
    quantize: Any = None,
    eps: float = tail.SEED_EPS,
    wo_outliers: int = 0,
) -> tuple["tail.TailWeights", np.ndarray, np.ndarray]:
    """One sweep row as ``(TailWeights, branch, residual)``, for ``tail.host_tail`` / ``tail.fused_tail``.

    ``fold``: ``None``, a block size (this case's random signs, no permutation, site INPUT,
    as the seed folds wo) or a ``HadamardFold`` (used as given). ``quantize``: ``None``, a
    :data:`QUANT_FORMATS` name or a dict for ``WeightMatrix.quantize``.
    """
    shp = _check_shape(shape)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}; got {dtype!r}")
    _check_fold(fold, shp)
    _, spec = _quant_spec(quantize)
    c = case_arrays(shp, [seed], wo_outliers=wo_outliers).rows(0)
    q = None if spec is None else {"mode": spec.mode, "bits": spec.bits, "group_size": spec.group_size}
    w = tail.TailWeights.from_arrays(c.wo, c.ffn_norm, c.gate, c.up, c.down, eps=eps,
                                     fold=_fold_for_case(fold, c.signs), dtype=dtype, quantize=q)
    return w, c.branch, c.residual


# =======================================================================================
# The batched tail: stored weights, truth, graph
# =======================================================================================


@dataclass
class _Stored:
    """A block's weights as one configuration stores them: numpy float64 (for the truth) and
    what the graph reads (mx arrays in the dtype, or batched quantized ``WeightMatrix``)."""

    np64: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # wo, gate, up, down
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


def _store(c: CaseArrays, dtype: str, fold: Any, spec: QuantSpec | None,
           master64: tuple[np.ndarray, ...] | None = None) -> _Stored:
    """What ``TailWeights.from_arrays(..., fold=, dtype=, quantize=)`` stores, for a batch.

    Order as there: round to ``dtype``; fold wo in float64 from the rounded weights, store the
    fold as float32 then ``dtype``; quantize last (wo after its fold).
    """
    dt = _MX_DTYPES[dtype]
    mats = [mx.array(a).astype(dt) for a in (c.wo, c.gate, c.up, c.down)]
    if fold is not None:
        folded = _fold_rows(_to_np64(mats[0]), fold, c.signs)
        mats[0] = mx.array(folded.astype(np.float32)).astype(dt)
    if spec is None:
        if dtype == "float32" and fold is None:  # the master arrays themselves: skip the round trip
            np64 = master64[:4] if master64 is not None else tuple(
                a.astype(np.float64) for a in (c.wo, c.gate, c.up, c.down))
        else:
            np64 = tuple(_to_np64(m) for m in mats)
        return _Stored(np64, tuple(mats), False)  # type: ignore[arg-type]
    graph, np64 = [], []
    for m in mats:
        parts = mx.quantize(m, group_size=spec.group_size, bits=spec.bits, mode=spec.mode)
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

    Every mutation is the SAME tail given one wrong thing, so none needs a graph of its own:

    * ``dropped_residual``: the residual is zeros (the kernel never reads it);
    * ``wrong_eps``: ``10 * eps``;
    * ``rotation_skipped``: no rotation, though wo stores ``W R^T`` (folded cases only);
    * ``sign_flipped``: the branch's first element negated (with a per-case fold that is
      exactly one of ``D``'s signs flipped, since ``D`` is applied first);
    * ``norm_wrong_length``: the mean square over ``n' = branch`` (``hidden + 1`` if equal)
      instead of ``hidden``: ``rsqrt(S / n' + eps)`` is ``rsqrt(S / n + eps n' / n)`` times
      ``sqrt(n / n')``, so it is the norm weight and eps rescaled.
    """
    h, b, _ = c.shape
    branch = c.branch
    signs_applied = fold is not None and not isinstance(fold, HadamardFold)
    gfold = _graph_fold(fold)
    norm, e, residual = c.ffn_norm, eps, c.residual
    if mutation == "rotation_skipped":
        gfold, signs_applied = None, False
    if signs_applied:
        branch = branch * c.signs  # exact: D x
    if mutation == "sign_flipped":
        branch = branch.copy()
        branch[:, 0] = -branch[:, 0]
    elif mutation == "dropped_residual":
        residual = np.zeros_like(residual)
    elif mutation == "wrong_eps":
        e = 10.0 * eps
    elif mutation == "norm_wrong_length":
        n_wrong = b if b != h else h + 1
        norm = (norm.astype(np.float64) * math.sqrt(h / n_wrong)).astype(np.float32)
        e = eps * n_wrong / h
    elif mutation not in (None, "rotation_skipped"):
        raise ValueError(f"mutation must be one of {MUTATIONS}; got {mutation!r}")
    return {"fold": gfold, "ffn_norm": norm, "eps": e, "branch": branch, "residual": residual}


def _truth(st: _Stored, c: CaseArrays, fold: Any, eps: float) -> np.ndarray:
    """float64 truth on the stored weights: ``tail.tail_np`` (what ``host_tail`` computes)."""
    a = _variant_args(c, fold, eps, None)
    wo, g, u, d = st.np64
    return tail.tail_np(wo, a["fold"], a["ffn_norm"].astype(np.float64), g, u, d, a["eps"],
                        a["branch"].astype(np.float64), a["residual"].astype(np.float64))


def _master64(c: CaseArrays) -> tuple[np.ndarray, ...]:
    """The master arrays in float64 (exact): wo, gate, up, down, ffn_norm, branch, residual."""
    return tuple(a.astype(np.float64) for a in (c.wo, c.gate, c.up, c.down, c.ffn_norm, c.branch, c.residual))


def _model_truth(c: CaseArrays, eps: float, master64: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """float64 truth of the float32 master weights: no rounding, no fold, no quantization."""
    wo, g, u, d, norm, branch, residual = master64 if master64 is not None else _master64(c)
    return tail.tail_np(wo, None, norm, g, u, d, eps, branch, residual)


def _graph(st: _Stored, c: CaseArrays, fold: Any, eps: float, mutation: str | None) -> np.ndarray:
    """The fused graph (``tail.tail_mx``) on a batch, evaluated once: float32 [S, hidden]."""
    a = _variant_args(c, fold, eps, mutation)
    lift = (lambda v: mx.array(v)[:, None, :]) if st.quantized else mx.array
    wo, g, u, d = st.graph
    out = tail.tail_mx(wo, a["fold"], lift(a["ffn_norm"]), g, u, d, a["eps"], lift(a["branch"]), lift(a["residual"]))
    if st.quantized:
        out = out[:, 0, :]
    mx.eval(out)
    return np.array(out)


def _metrics(actual: np.ndarray, truth: np.ndarray, model: np.ndarray | None) -> dict[str, np.ndarray]:
    ulp = ulp_distance(actual, truth)
    out = {
        "margin": worst_margin(actual, truth),
        "max_abs": max_abs_error(actual, truth),
        "max_rel": max_rel_error(actual, truth),
        "nmse": nmse(actual, truth),
        "torch_ratio": torch_ratio(actual, truth),
        "ulp_max": ulp.max(axis=-1),
        "ulp_mean": ulp.mean(axis=-1),
    }
    if model is not None:
        out["model_margin"] = worst_margin(actual, model)
        out["model_nmse"] = nmse(actual, model)
    return out


# =======================================================================================
# Sweeps
# =======================================================================================


def _configs(dtypes: Sequence[str], folds: Sequence[Any], quantize: Sequence[Any],
             backends: Sequence[str], shape: tuple[int, int, int]) -> list[tuple[str, Any, str, QuantSpec | None, str]]:
    from workbench import backends as be

    if isinstance(dtypes, str) or isinstance(backends, str):
        raise ValueError("dtypes and backends must be sequences (e.g. dtypes=('float32',)), not a bare string")
    out = []
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"dtypes entries must be in {DTYPES}; got {d!r}")
    for bk in backends:
        be.resolve_backend(bk)  # ValueError for a non-backend, BackendUnavailable for an absent one
        if bk == "auto":
            raise ValueError("backends entries must name a backend ('graph', 'metal', 'cuda'), not 'auto'")
    for f in folds:
        _check_fold(f, shape)
    for d in dtypes:
        for f in folds:
            for q in quantize:
                label, spec = _quant_spec(q)
                # mx.quantize groups along each matrix's IN axis: branch (wo), hidden (gate,
                # up) and ffn (down) must all be multiples of the group.
                if spec is not None and any(n % spec.group_size for n in shape):
                    raise ValueError(f"quantize {label}: hidden, branch and ffn {shape} must be multiples of "
                                     f"group_size {spec.group_size}")
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
    import pandas as pd

    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite float; got {eps!r}")
    seeds_arr = _check_seeds(seeds)
    shapes = [_check_shape(s) for s in shapes]
    if not shapes:
        raise ValueError("shapes must hold at least one (hidden, branch, ffn) triple")
    plan = [(shp, _configs(dtypes, folds, quantize, backends, shp)) for shp in shapes]
    ks = [_check_outliers(wo_outliers, shp[1]) for shp in shapes]
    blocks = np.unique(seeds_arr // CASE_BLOCK)
    bar = _progress(len(blocks) * len(shapes), progress, desc)
    frames = []
    try:
        for si, ((shp, configs), k) in enumerate(zip(plan, ks)):
            for blk in blocks:
                want = seeds_arr[seeds_arr // CASE_BLOCK == blk]
                c = _with_outliers(_draw_block(shp, int(blk)).rows(np.unique(want) - blk * CASE_BLOCK), k)
                m64 = _master64(c)
                model = _model_truth(c, eps, m64)
                for ci, (dtype, fold, qlabel, spec, bk) in enumerate(configs):
                    st = _store(c, dtype, fold, spec, m64)
                    plain = dtype == "float32" and fold is None and spec is None
                    truth = model if plain else _truth(st, c, fold, eps)
                    for mi, mut in enumerate(mutations):
                        if mut == "rotation_skipped" and fold is None:
                            continue  # without a fold there is no rotation to skip
                        if bk == "graph":
                            actual = _graph(st, c, fold, eps, mut)
                        else:
                            actual = _kernel_rows(shp, c, dtype, fold, spec, bk, eps, mut)
                        m = _metrics(actual, truth, None if mut is not None else model)
                        df = pd.DataFrame(m)
                        df.insert(0, "seed", c.seeds)
                        for i, (name, v) in enumerate((("hidden", shp[0]), ("branch", shp[1]), ("ffn", shp[2]),
                                                        ("wo_outliers", k), ("dtype", dtype),
                                                        ("fold", _fold_label(fold)), ("quant", qlabel),
                                                        ("backend", bk))):
                            df.insert(i, name, v)
                        if mut is not None:
                            df.insert(8, "mutation", mut)
                        df["_order"] = (si * len(configs) + ci) * len(mutations) + mi  # sorted on below
                        frames.append(df)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    # One tidy order whatever the blocking: shape, then configuration (as given), then
    # mutation, then seed.
    out = pd.concat(frames, ignore_index=True).sort_values(["_order", "seed"], kind="stable")
    out = out.drop(columns="_order").reset_index(drop=True)
    for col in ("dtype", "fold", "quant", "backend") + (("mutation",) if mutations != [None] else ()):
        out[col] = out[col].astype("category")
    return out


def _kernel_rows(shp, c: CaseArrays, dtype, fold, spec, backend, eps, mutation) -> np.ndarray:
    """A kernel backend, case by case through ``tail.fused_tail`` (kernels take one weight set)."""
    if mutation is not None:
        raise ValueError("mutations are defined on the graph backend only (backend 'graph')")
    q = None if spec is None else {"mode": spec.mode, "bits": spec.bits, "group_size": spec.group_size}
    rows = []
    for i in range(len(c.seeds)):
        w = tail.TailWeights.from_arrays(c.wo[i], c.ffn_norm[i], c.gate[i], c.up[i], c.down[i], eps=eps,
                                         fold=_fold_for_case(fold, c.signs[i]), dtype=dtype, quantize=q)
        rows.append(tail.fused_tail(w, c.branch[i], c.residual[i], backend=backend))
    return np.stack(rows)


def sweep(
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    dtypes: Sequence[str] = ("float32",),
    folds: Sequence[Any] = (None,),
    quantize: Sequence[Any] = (None,),
    backends: Sequence[str] = ("graph",),
    eps: float = tail.SEED_EPS,
    wo_outliers: int = 0,
    progress: bool | None = None,
):
    """The correct fused tail against the float64 truth, every combination, one row per case.

    ``shapes``: (hidden, branch, ffn) triples; ``seeds``: non-negative ints (a case depends
    only on its seed and shape; repeats are swept once); ``dtypes``: weight dtypes in :data:`DTYPES`; ``folds``:
    ``None``, a block size (per-case random signs on wo's input, as the seed folds it) or a
    ``HadamardFold`` (the same one for every case); ``quantize``: ``None``, a name in
    :data:`QUANT_FORMATS` or a dict of mode/bits/group_size (all four matrices, wo folded
    first); ``backends``: ``"graph"`` (batched, one ``mx.eval`` per block of
    :data:`CASE_BLOCK` cases) or a kernel backend (case by case; absent ones raise
    ``BackendUnavailable``). ``wo_outliers``: that many of wo's input columns
    :data:`OUTLIER_SCALE` times larger (what a fold is for). ``progress``: a tqdm bar on
    stderr (``None``: only for 50,000 cases and up).

    Returns a tidy ``pandas.DataFrame``: ``hidden, branch, ffn, wo_outliers, dtype, fold, quant,
    backend, seed``, then against the truth of the stored weights ``margin`` (the seed's worst
    ``|x - y| / max(|y|, 1)``), ``max_abs``, ``max_rel``, ``nmse``, ``torch_ratio`` (<= 1
    passes torch's float32 defaults), ``ulp_max``, ``ulp_mean`` (float32 ulps), and against
    the truth of the float32 master weights ``model_margin``, ``model_nmse``. Rows are
    ordered by shape, configuration (dtypes x folds x quantize x backends, as given), seed.
    """
    return _run(shapes=shapes, seeds=seeds, dtypes=dtypes, folds=folds, quantize=quantize, backends=backends,
                eps=eps, mutations=[None], progress=progress, desc="sweep", wo_outliers=wo_outliers)


def mutation_sweep(
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    dtypes: Sequence[str] = ("float32",),
    folds: Sequence[Any] = (None,),
    quantize: Sequence[Any] = (None,),
    mutations: Sequence[str] = MUTATIONS,
    eps: float = tail.SEED_EPS,
    wo_outliers: int = 0,
    progress: bool | None = None,
):
    """Deliberately wrong tails (:data:`MUTATIONS`) against the truth of the correct one.

    Same cases and columns as :func:`sweep` (graph backend), plus ``mutation``; no
    ``model_*`` columns. ``rotation_skipped`` has rows only for folded configurations (a
    skipped rotation is invisible without a fold). Feed the result to :func:`catch_rates`.
    """
    for m in mutations:
        if m not in MUTATIONS:
            raise ValueError(f"mutations entries must be in {MUTATIONS}; got {m!r}")
    if not mutations:
        raise ValueError(f"mutations must name at least one of {MUTATIONS}")
    return _run(shapes=shapes, seeds=seeds, dtypes=dtypes, folds=folds, quantize=quantize, backends=("graph",),
                eps=eps, mutations=list(mutations), progress=progress, desc="mutations",
                wo_outliers=wo_outliers)


_GROUP = ["dtype", "fold", "quant"]


def catch_rates(mutants, tolerances: Mapping[str, tuple[str, float]], *, by: Sequence[str] = ("mutation",)):
    """Fraction of mutant cases each tolerance CATCHES (``metric > limit``, or NaN), per group.

    ``tolerances``: ``name -> (metric column, limit)``, e.g. :data:`REFERENCE_TOLERANCES` plus
    calibrated ones (:meth:`Tolerance.as_criterion`). Returns a DataFrame, one row per group
    (``by`` columns, default per mutation), one column per tolerance.
    """
    import pandas as pd

    if not tolerances:
        raise ValueError("tolerances must name at least one (metric, limit) pair")
    cols = {}
    for name, (metric, limit) in tolerances.items():
        if metric not in mutants.columns:
            raise ValueError(f"tolerances[{name!r}]: metric must be a column of the sweep; got {metric!r}")
        v = mutants[metric]
        cols[name] = (v > limit) | v.isna()
    caught = pd.DataFrame(cols)
    for b in by:
        caught[b] = mutants[b]
    return caught.groupby(list(by), observed=True).mean()


def pass_rates(errors, tolerances: Mapping[str, tuple[str, float]], *, by: Sequence[str] = _GROUP):
    """Fraction of CORRECT cases each tolerance passes (``metric <= limit``), per group."""
    import pandas as pd

    cols = {name: errors[metric] <= limit for name, (metric, limit) in tolerances.items()}
    ok = pd.DataFrame(cols)
    for b in by:
        ok[b] = errors[b]
    return ok.groupby(list(by), observed=True).mean()


# =======================================================================================
# Calibration
# =======================================================================================


@dataclass(frozen=True)
class Tolerance:
    """A calibrated tolerance and how it was found.

    ``value``: the point estimate of the level a correct tail exceeds with probability
    ``flake_rate`` per case; ``low`` / ``high``: a bootstrap interval (``level``) around it;
    ``recommended``: ``high`` rounded UP to two significant figures, the figure to use in a
    test (erring, at the rate asked, on the side of not flaking). ``xi`` / ``sigma`` /
    ``threshold`` / ``n_tail``: the fitted generalized Pareto tail; ``observed_max``: the
    largest error seen; ``extrapolation``: ``1 / (flake_rate * n)``, how far beyond the data
    the fit reaches (> 1: past the largest error one would expect to see).
    """

    value: float
    low: float
    high: float
    recommended: float
    flake_rate: float
    level: float
    n: int
    threshold: float
    n_tail: int
    xi: float
    sigma: float
    observed_max: float
    method: str = field(default="")

    @property
    def extrapolation(self) -> float:
        return 1.0 / (self.flake_rate * self.n)

    def as_criterion(self, metric: str = "margin") -> tuple[str, float]:
        """``(metric, recommended)``, for :func:`catch_rates` / :func:`pass_rates`."""
        return (metric, self.recommended)

    def __str__(self) -> str:
        return (f"tolerance {self.value:.3g} (bootstrap {100 * self.level:.0f}%: {self.low:.3g} .. {self.high:.3g}); "
                f"recommended {self.recommended:.2g} at flake rate {self.flake_rate:g}/case; "
                f"GPD xi {self.xi:.3f}, sigma {self.sigma:.3g} over {self.n_tail} of {self.n} above "
                f"{self.threshold:.3g}; observed max {self.observed_max:.3g}")


def _gpd_pwm(y: np.ndarray) -> tuple[float, float]:
    """Generalized Pareto (xi, sigma) from exceedances ``y > 0`` by probability-weighted moments.

    Hosking & Wallis (1987), Technometrics 29(3): with ``a0 = mean(y)`` and
    ``a1 = mean((1 - p_i) y_(i))`` (``p_i = (i - 0.35) / n``, ``y`` ascending), Hosking's shape
    ``k = a0 / (a0 - 2 a1) - 2`` and scale ``sigma = 2 a0 a1 / (a0 - 2 a1)``; ``xi = -k`` in
    the convention ``P(Y > y) = (1 + xi y / sigma)^(-1 / xi)``. Closed form, so a bootstrap
    of a thousand refits is cheap, and it is well behaved for the light tails (xi <= 0)
    that rounding errors have, where maximum likelihood is not (it is irregular for xi < -0.5).
    """
    y = np.sort(y, axis=-1)
    n = y.shape[-1]
    p = (np.arange(1, n + 1) - 0.35) / n
    a0 = y.mean(axis=-1)
    a1 = ((1.0 - p) * y).mean(axis=-1)
    d = a0 - 2.0 * a1
    k = a0 / d - 2.0
    return -k, 2.0 * a0 * a1 / d


def _gpd_level(u: float | np.ndarray, xi: Any, sigma: Any, q: float) -> Any:
    """``u + y`` with ``P(Y > y) = q`` under the fitted tail."""
    xi = np.asarray(xi, dtype=np.float64)
    small = np.abs(xi) < 1e-9
    safe = np.where(small, 1.0, xi)
    y = np.where(small, sigma * -math.log(q), sigma / safe * (q ** (-safe) - 1.0))
    return u + y


def _round_up(x: float, sig: int = 2) -> float:
    if not math.isfinite(x) or x <= 0:
        return x
    e = math.floor(math.log10(x)) - (sig - 1)
    return math.ceil(x / 10.0**e - 1e-9) * 10.0**e


def calibrate_tolerance(
    errors: Any,
    *,
    flake_rate: float = 1e-6,
    tail_fraction: float = 0.02,
    min_tail: int = 50,
    n_boot: int = 400,
    level: float = 0.9,
    seed: int = 0,
) -> Tolerance:
    """The tolerance a correct implementation exceeds with probability ``flake_rate`` per case.

    Method: peaks over threshold. ``errors`` are per-case worst errors of a CORRECT tail
    (e.g. a sweep's ``margin``). The threshold ``u`` is the empirical quantile leaving the
    top ``max(min_tail, tail_fraction * n)`` cases above it; their excesses are fitted with a
    generalized Pareto distribution (Pickands-Balkema-de Haan: excesses over a high threshold
    tend to one) by probability-weighted moments (:func:`_gpd_pwm`), and the tolerance is
    the level ``t`` with ``P(E > t) = (n_tail / n) P(Y > t - u) = flake_rate``. When
    ``flake_rate >= tail_fraction`` it is the plain empirical quantile.

    Uncertainty: a bootstrap (``n_boot`` resamples of the cases, seeded by ``seed``), each
    re-choosing the threshold and refitting; ``low`` / ``high`` are the ``level`` percentile
    interval. The extrapolation from n cases to a rate of 1e-6 is long when n is small: the
    interval says how long.
    """
    e = np.asarray(errors, dtype=np.float64).ravel()
    if e.size < 100:
        raise ValueError(f"errors must hold at least 100 per-case errors to fit a tail; got {e.size}")
    if not np.isfinite(e).all() or (e < 0).any():
        raise ValueError("errors must be finite and >= 0 (per-case worst errors of a correct tail)")
    if not (0 < flake_rate < 1):
        raise ValueError(f"flake_rate must be in (0, 1); got {flake_rate!r}")
    if not (0 < tail_fraction < 0.5):
        raise ValueError(f"tail_fraction must be in (0, 0.5); got {tail_fraction!r}")
    if not (0 < level < 1):
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 10:
        raise ValueError(f"n_boot must be an int >= 10; got {n_boot!r}")
    n = e.size
    k = int(min(n - 1, max(min_tail, math.ceil(tail_fraction * n))))

    def fit(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows of samples -> (level, u, xi, sigma) per row."""
        part = np.partition(sample, n - k - 1, axis=-1)
        u = part[..., n - k - 1]
        top = part[..., n - k:]
        xi, sigma = _gpd_pwm(top - u[..., None])
        if flake_rate >= k / n:
            lvl = np.quantile(sample, 1.0 - flake_rate, axis=-1)
        else:
            lvl = _gpd_level(u, xi, sigma, flake_rate * n / k)
        return lvl, u, xi, sigma

    lvl, u, xi, sigma = fit(e[None, :])
    rng = np.random.default_rng(seed)
    boots = []
    for start in range(0, n_boot, 50):  # chunks keep the resample matrix small
        m = min(50, n_boot - start)
        boots.append(fit(e[rng.integers(0, n, size=(m, n))])[0])
    b = np.concatenate(boots)
    lo, hi = np.quantile(b, [(1 - level) / 2, (1 + level) / 2])
    method = (f"peaks over threshold: generalized Pareto fitted by probability-weighted moments to the top "
              f"{k} of {n} cases; bootstrap x{n_boot} ({100 * level:.0f}% interval); recommended = upper bound "
              f"rounded up to 2 significant figures")
    return Tolerance(value=float(lvl[0]), low=float(lo), high=float(hi), recommended=_round_up(float(hi)),
                     flake_rate=float(flake_rate), level=float(level), n=int(n), threshold=float(u[0]),
                     n_tail=int(k), xi=float(xi[0]), sigma=float(sigma[0]), observed_max=float(e.max()),
                     method=method)


def calibrate_by(errors, *, metric: str = "margin", by: Sequence[str] = _GROUP, flake_rate: float = 1e-6,
                 **kw: Any):
    """:func:`calibrate_tolerance` for each group of a sweep; a DataFrame, one row per group."""
    import pandas as pd

    if metric not in errors.columns:
        raise ValueError(f"metric must be a column of the sweep; got {metric!r}")
    rows = []
    for key, g in errors.groupby(list(by), observed=True):
        t = calibrate_tolerance(g[metric].to_numpy(), flake_rate=flake_rate, **kw)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "n": t.n, "observed_max": t.observed_max, "tolerance": t.value,
                     "low": t.low, "high": t.high, "recommended": t.recommended, "xi": t.xi})
    return pd.DataFrame(rows).set_index(list(by))
