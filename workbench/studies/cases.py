"""The cases a sweep draws: blocks of seeded random tails, following the one recipe.

Cases are drawn in blocks of :data:`CASE_BLOCK` seeds from one numpy stream per block
(``default_rng([SWEEP_SALT, hidden, branch, ffn, seed // CASE_BLOCK])``): one bulk
float32 draw per block is what makes 100,000 cases a minute's work (a generator per seed
costs more than the whole tail), and a case still depends only on its own seed and
shape, never on what else is swept. Every tensor follows ``workbench.tail.case_recipe``,
the recipe ``TailWeights.random`` draws from too (here from float32 uniforms, in bulk).

:func:`case_weights` rebuilds any one row as ``TailWeights``, so a sweep's row can be
checked against ``tail.host_tail`` / ``tail.fused_tail`` case by case (a test does).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench import validate
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import DENSE_DTYPES, QUANT_FORMATS, QuantSpec, check_quant_spec
from workbench.tail.frink_case import SEED_LCG_START
from workbench.tail.weights import DEFAULT_EPS, TailWeights, case_recipe

#: Salt of the sweep's streams: frink-models' test's LCG start value, for want of a better number.
SWEEP_SALT = SEED_LCG_START

#: Seeds per bulk draw (and per batched evaluation). Part of the case definition: changing
#: it changes every case, so it is a constant, not a parameter.
CASE_BLOCK = 256

#: How much larger an outlier column of wo is than the others (``wo_outliers``).
OUTLIER_SCALE = 10.0


#: Bytes a case of ``case_arrays`` / a sweep holds per float of its recipe: the float32
#: draw (4), the float64 masters the truth is computed from (8), the stored weights and
#: the batched products' temporaries (about 8 more). Used to refuse, before any work, a
#: call that would need more than :func:`workbench.validate.memory_cap_bytes`.
BYTES_PER_CASE_FLOAT = 20

#: The largest seed: a seed picks its block (seed // CASE_BLOCK) in an int64 stream key.
MAX_SEED = 2**62


def check_shape(shape: Any) -> tuple[int, int, int]:
    """``shape`` as a (hidden, branch, ffn) triple of positive ints, or ``ValueError`` naming ``shapes``."""
    try:
        vals = tuple(shape)
    except TypeError:
        vals = ()
    if (
        isinstance(shape, (str, bytes))
        or len(vals) != 3
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0 for v in vals)
    ):
        raise ValueError(
            f"shapes: must hold (hidden, branch, ffn) triples of positive ints, got {validate.describe(shape)}"
        )
    h, b, f = (int(v) for v in vals)
    return h, b, f


def case_floats(shape: tuple[int, int, int]) -> int:
    """Floats one case of ``shape`` draws (every tensor of ``tail.case_recipe``)."""
    return sum(math.prod(d.shape) for d in case_recipe(*shape))


def check_case_memory(shape: tuple[int, int, int], n_cases: int) -> None:
    """``ValueError`` naming ``shapes`` when ``n_cases`` cases of ``shape`` at once would not fit in memory."""
    validate.within_memory(
        "shapes", BYTES_PER_CASE_FLOAT * n_cases * case_floats(shape), f"{n_cases} case(s) at shape {shape}"
    )


def check_seeds(seeds: Iterable[int]) -> np.ndarray:
    """``seeds`` as a 1-D int64 array of non-negative ints, or ``ValueError`` naming ``seeds``."""
    allowed = "a non-empty 1-D sequence of ints in 0..2**62 (e.g. range(1000))"
    if isinstance(seeds, (range, np.ndarray)):
        s = np.asarray(seeds)
    else:
        items = validate.sequence("seeds", seeds, what="ints", non_empty=False)
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in items):
            raise ValueError(f"seeds: must be {allowed}, got {validate.describe(seeds)}")
        s = np.asarray(items, dtype=object if any(abs(int(v)) > MAX_SEED for v in items) else np.int64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"seeds: must be {allowed}, got {validate.describe(seeds)}")
    if s.dtype == object or not np.issubdtype(s.dtype, np.integer) or (s < 0).any() or (s > MAX_SEED).any():
        raise ValueError(f"seeds: must be {allowed}, got {validate.describe(seeds)}")
    return s.astype(np.int64)


@dataclass(frozen=True)
class CaseArrays:
    """The float32 master arrays of a batch of cases (leading axis: cases), before any dtype
    rounding, fold or quantization, one field per tensor of ``tail.case_recipe`` (whose
    docstring says the distributions); ``signs`` (+-1 over the branch) are the fold's ``D``
    when a case is folded with a block size."""

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

    def rows(self, idx: Any) -> CaseArrays:
        return CaseArrays(*(getattr(self, k)[idx] for k in self.__dataclass_fields__))


def _uniforms(shape: tuple[int, int, int], block: int, rows: np.ndarray, n: int) -> np.ndarray:
    """The float32 uniforms of ``rows`` of ``block`` (``n`` a case), exactly as one bulk draw of
    the whole block would give them, without drawing the other rows.

    The block's stream is numpy's PCG64; a float32 uniform takes 32 bits, two to each 64-bit
    step (low half first). Row ``i`` starts ``i * n`` floats in: the generator is advanced
    (jumped, in O(log) time) past the whole steps before it, and one half is thrown away
    when the row starts mid-step. So one case of a block costs one case's memory and time,
    not the block's (Bonsai's shape: 1.2 GB, not 306 GB). A test holds it to the bulk draw.
    """
    key = [SWEEP_SALT, *shape, block]
    if len(rows) == CASE_BLOCK and np.array_equal(rows, np.arange(CASE_BLOCK)):
        return np.random.default_rng(key).random((CASE_BLOCK, n), dtype=np.float32)
    out = np.empty((len(rows), n), dtype=np.float32)
    for j, i in enumerate(rows):
        rng = np.random.default_rng(key)
        start = int(i) * n
        rng.bit_generator.advance(start // 2)
        if start % 2:
            rng.random(1, dtype=np.float32)
        out[j] = rng.random(n, dtype=np.float32)
    return out


def draw_block(shape: tuple[int, int, int], block: int, rows: Any = None) -> CaseArrays:
    """Cases of one block (``rows``: their indices in it, ascending; ``None``: all CASE_BLOCK): ONE
    bulk float32 draw for a whole block, split per case in recipe order; only the rows asked
    for are drawn (:func:`_uniforms`)."""
    recipe = case_recipe(*shape)
    n = sum(math.prod(d.shape) for d in recipe)
    idx = np.arange(CASE_BLOCK) if rows is None else np.asarray(rows, dtype=np.int64)
    u = _uniforms(shape, block, idx, n)
    out: dict[str, np.ndarray] = {}
    o = 0
    for d in recipe:
        k = math.prod(d.shape)
        v = u[:, o : o + k]
        o += k
        if d.signs:
            v = np.where(v < 0.5, np.float32(-1.0), np.float32(1.0))
        else:
            # centre + U(-w, w) as float32 (u * 2w - w) + centre: the product lands in a new
            # contiguous array (the tensor's own, read once from the draw), the rest in place,
            # so each float is touched by one pass a step, since drawing is a third of a sweep.
            v = np.multiply(v, np.float32(2 * d.half_width))
            v -= np.float32(d.half_width)
            if d.centre:
                v += np.float32(d.centre)
        out[d.name] = v.reshape((len(idx),) + d.shape)
    seeds = block * CASE_BLOCK + idx
    return CaseArrays(seeds=seeds, **out)


def check_outliers(k: Any, branch: int) -> int:
    """``wo_outliers`` as an int in [0, branch], or ``ValueError`` naming it."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or not 0 <= k <= branch:
        raise ValueError(f"wo_outliers: must be an int in [0, {branch}] (the branch width), got {validate.describe(k)}")
    return int(k)


def with_outliers(c: CaseArrays, k: int) -> CaseArrays:
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
    shp = check_shape(shape)
    s = check_seeds(seeds)
    k = check_outliers(wo_outliers, shp[1])
    check_case_memory(shp, len(np.unique(s)))
    parts = []
    for blk in np.unique(s // CASE_BLOCK):
        want = np.unique(s[s // CASE_BLOCK == blk])
        parts.append(draw_block(shp, int(blk), want - blk * CASE_BLOCK))
    cat = CaseArrays(*(np.concatenate([getattr(p, k) for p in parts]) for k in CaseArrays.__dataclass_fields__))
    order = {int(v): i for i, v in enumerate(cat.seeds)}
    return with_outliers(cat.rows(np.array([order[int(v)] for v in s])), k)


def quant_spec(q: Any) -> tuple[str, QuantSpec | None]:
    """``None`` / a :data:`~workbench.fold.weights.QUANT_FORMATS` name / a dict of mode, bits,
    group_size -> (label, spec)."""
    if q is None:
        return "none", None
    if isinstance(q, str):
        if q not in QUANT_FORMATS:
            raise ValueError(
                f"quantize: entries must be None, a dict of mode/bits/group_size, or one of "
                f"{sorted(QUANT_FORMATS)}, got {q!r}"
            )
        return str(QUANT_FORMATS[q]), QUANT_FORMATS[q]
    if not isinstance(q, Mapping) or set(q) - {"mode", "bits", "group_size"}:
        raise ValueError(
            f"quantize: entries must be None, a name in {sorted(QUANT_FORMATS)} or a dict of "
            f"mode/bits/group_size, got {validate.describe(q)}"
        )
    spec = check_quant_spec(q.get("mode", "affine"), q.get("bits", 4), q.get("group_size", 64))
    return str(spec), spec


def check_quant_fits(spec: QuantSpec | None, shape: tuple[int, int, int]) -> None:
    """``ValueError`` naming ``quantize`` unless every matrix's in axis (branch for wo, hidden for
    gate/up, ffn for down) is a multiple of ``spec``'s group: ``mx.quantize`` groups along it."""
    if spec is not None and any(n % spec.group_size for n in shape):
        raise ValueError(
            f"quantize: {spec} needs hidden, branch and ffn {shape} to be multiples of its group_size {spec.group_size}"
        )


def quantize_args(spec: QuantSpec | None) -> dict[str, Any] | None:
    """``spec`` as the keyword arguments of ``WeightMatrix.quantize`` (``TailWeights``' ``quantize``)."""
    return None if spec is None else spec.as_quantize()


def fold_label(fold: Any) -> str:
    """How a sweep's ``fold`` column names a fold: ``none``, ``b16`` (a block size), ``shared b64 input``."""
    if fold is None:
        return "none"
    if isinstance(fold, HadamardFold):
        return f"shared b{fold.block} {fold.site.name.lower()}"
    return f"b{int(fold)}"


def check_fold(fold: Any, shape: tuple[int, int, int]) -> None:
    """``ValueError`` unless ``fold`` (None, a block size or a ``HadamardFold``) fits ``shape``'s wo."""
    h, b, _ = shape
    if fold is None:
        return
    if isinstance(fold, HadamardFold):
        fold.check_width(b if fold.site is FoldSite.INPUT else h)
        return
    if isinstance(fold, (bool, np.bool_)) or not isinstance(fold, (int, np.integer)):
        raise ValueError(
            f"folds: entries must be None, a block size (int) or a HadamardFold, got {validate.describe(fold)}"
        )
    try:
        hadamard.factor_block(int(fold))
    except ValueError as e:
        raise ValueError(f"folds: {e}") from None
    if b % int(fold):
        raise ValueError(f"folds: block {fold} must divide the branch width {b} (a fold on wo's input)")


def fold_for_case(fold: Any, signs: np.ndarray) -> HadamardFold | None:
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
    eps: float = DEFAULT_EPS,
    wo_outliers: int = 0,
) -> tuple[TailWeights, np.ndarray, np.ndarray]:
    """One sweep row as ``(TailWeights, branch, residual)``, for ``tail.host_tail`` / ``tail.fused_tail``.

    ``fold``: ``None``, a block size (this case's random signs, no permutation, site INPUT,
    as frink-models' test folds wo) or a ``HadamardFold`` (used as given). ``quantize``:
    ``None``, a ``weights.QUANT_FORMATS`` name or a dict for ``WeightMatrix.quantize``.
    """
    shp = check_shape(shape)
    seed = validate.integer("seed", seed, minimum=0, maximum=MAX_SEED)
    validate.one_of("dtype", dtype, tuple(DENSE_DTYPES))
    eps = validate.number("eps", eps, minimum=0, exclusive_minimum=True)
    check_fold(fold, shp)
    _, spec = quant_spec(quantize)
    check_quant_fits(spec, shp)
    c = case_arrays(shp, [seed], wo_outliers=wo_outliers)
    return case_row_weights(c, 0, dtype=dtype, fold=fold, spec=spec, eps=eps)


def case_row_weights(
    c: CaseArrays, i: int, *, dtype: str, fold: Any, spec: QuantSpec | None, eps: float
) -> tuple[TailWeights, np.ndarray, np.ndarray]:
    """Row ``i`` of ``c`` as ``(TailWeights, branch, residual)``: what one case stores."""
    w = TailWeights.from_arrays(
        c.wo[i],
        c.ffn_norm[i],
        c.gate[i],
        c.up[i],
        c.down[i],
        eps=eps,
        fold=fold_for_case(fold, c.signs[i]),
        dtype=dtype,
        quantize=quantize_args(spec),
    )
    return w, c.branch[i], c.residual[i]
