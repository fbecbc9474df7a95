"""The attention layer's tail, three ways: the oracle, the engine before the fusion, fused.

    out = residual + ffn(rms_norm(residual + wo(branch)))      ffn(x) = down(silu(gate x) * up x)

``branch`` is the attention output BEFORE ``wo``; ``wo`` usually carries a block-Hadamard
fold. The seed (``frink-models``' ``fused_attention_tail``) runs this in one Metal
submission instead of two; this module is the workbench's version of that change:

* :func:`host_tail` -- the oracle, op by op in numpy, the five ops the seed's test
  composes (wo with its rotation, residual add, RMS norm, SwiGLU FFN, residual add).
  float64 is the truth; float32 is "the host".
* :func:`unfused_tail` -- the engine before the fusion: ``wo`` as one MLX submission, the
  add and the norm on the host, the FFN as a second submission, the last add on the host.
  Two waits.
* :func:`fused_tail` -- one submission. ``backend="graph"`` builds the whole tail as MLX
  ops and evaluates it once (any MLX device); ``"metal"`` / ``"cuda"`` are the kernel
  backends (``workbench.backends``); every backend goes through ONE launch builder,
  :func:`tail_launch`, which asks the refusal body first, as the seed's
  ``attn_tail_launch`` does.
* :func:`count_waits` -- measures "two waits versus one" instead of asserting it.
* :func:`compare` -- the seed's criterion ``|x - y| <= tol * max(|y|, 1)`` plus max abs,
  max relative and NMSE.

The math lives in two pure functions of arrays, one per library, so the sweeps of
``workbench.errors`` can vectorise them (a leading batch axis on the activations AND on
the weights): :func:`tail_np` (numpy, any float dtype) and :func:`tail_mx` (MLX graph,
float32 activations and accumulation). Everything else here is plumbing around them.

Precision: weights may be bf16 / f16 / quantized, but activations and accumulation are
float32 on the MLX paths: a graph that cast the normed vector to bf16 was seen 1.5e-2 off
the float64 truth, forty times the seed's tolerance.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import mlx.core as mx
import numpy as np

from workbench.fold import FoldPlan, FoldSite, HadamardFold
from workbench.weights import WeightMatrix

#: The seed's tolerance: ``|x - y| <= 2e-4 * max(|y|, 1)`` per element, float32 device
#: against float32 host (its test ``the_fused_attention_tail_matches_the_host_tail``).
SEED_TOL = 2e-4

#: The seed test's shape (hidden, branch, ffn) and norm epsilon.
SEED_SHAPE = (64, 96, 80)
SEED_EPS = 1e-6
#: The seed test's LCG start value (u32).
SEED_LCG_START = 6_180_339

#: Bonsai-27B's tail (hidden, branch = 24 q heads x 256, ffn); reference/models.md.
BONSAI_SHAPE = (5120, 6144, 17408)

_DTYPES = ("float32", "float16", "bfloat16")


class TailRefused(ValueError):
    """The fused path refuses this layer; ``reasons`` lists every ``Refusal`` that applies.

    A ``ValueError`` because it is the weights given (the layer they were built for) that
    the fusion does not serve; the caller's fallback is :func:`unfused_tail`, exactly as
    the seed's caller projects on the host when ``attn_tail_launch`` returns ``None``.
    """

    def __init__(self, reasons: Sequence[Any], where: str = "") -> None:
        self.reasons = list(reasons)
        names = ", ".join(getattr(r, "name", str(r)) for r in self.reasons)
        super().__init__(f"the fused tail refuses {where or 'this layer'}: {names}")


# ---------------------------------------------------------------------------------------
# The seed's inputs
# ---------------------------------------------------------------------------------------


def lcg_stream(n: int, scale: float, state: int) -> tuple[np.ndarray, int]:
    """``n`` values of the seed's u32 LCG, and the state after them.

    ``state = state * 1664525 + 1013904223 (mod 2^32)``, then the value is
    ``((state >> 9) / 2^23 - 0.5) * scale`` computed in float32, exactly as the Rust test
    computes it (every step is exact in float32 for power-of-two scales, so the values
    are bit-for-bit the Rust ones). Sequential on purpose: it is the order that matters.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0; got {n}")
    out = np.empty(n, dtype=np.uint32)
    s = int(state) & 0xFFFFFFFF
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out[i] = s >> 9
    vals = (out.astype(np.float32) / np.float32(1 << 23) - np.float32(0.5)) * np.float32(scale)
    return vals.astype(np.float32), s


@dataclass(frozen=True)
class SeedArrays:
    """The seed test's raw inputs, float32, in the shapes the Rust test builds."""

    wo: np.ndarray  # [hidden, branch], BEFORE the fold (the test folds it afterwards)
    gate: np.ndarray  # [ffn, hidden]
    up: np.ndarray  # [ffn, hidden]
    down: np.ndarray  # [hidden, ffn]
    ffn_norm: np.ndarray  # [hidden], 1 + rnd(0.5)
    branch: np.ndarray  # [branch]
    residual: np.ndarray  # [hidden]
    signs: np.ndarray  # [branch], +1/-1
    eps: float


def seed_arrays() -> SeedArrays:
    """The seed test's inputs in its draw order (design.md, "Seed test case")."""
    hidden, branch_dim, ffn_dim = SEED_SHAPE
    state = SEED_LCG_START

    def rnd(n: int, scale: float) -> np.ndarray:
        nonlocal state
        v, state = lcg_stream(n, scale, state)
        return v

    wo = rnd(hidden * branch_dim, 1.0).reshape(hidden, branch_dim)
    gate = rnd(ffn_dim * hidden, 1.0).reshape(ffn_dim, hidden)
    up = rnd(ffn_dim * hidden, 1.0).reshape(ffn_dim, hidden)
    down = rnd(hidden * ffn_dim, 1.0).reshape(hidden, ffn_dim)
    ffn_norm = (np.float32(1.0) + rnd(hidden, 0.5)).astype(np.float32)  # f32 add, as in Rust
    branch = rnd(branch_dim, 1.0)
    residual = rnd(hidden, 1.0)
    signs = np.where(rnd(branch_dim, 2.0) < 0, np.float32(-1.0), np.float32(1.0)).astype(np.float32)
    return SeedArrays(wo, gate, up, down, ffn_norm, branch, residual, signs, SEED_EPS)


# ---------------------------------------------------------------------------------------
# The weights
# ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class TailWeights:
    """The weights of one attention layer's tail.

    ``wo`` [hidden, branch] (usually folded), ``gate`` / ``up`` [ffn, hidden], ``down``
    [hidden, ffn] as :class:`~workbench.weights.WeightMatrix`; ``ffn_norm`` [hidden]
    float32 (plain weights, ``x * rsqrt(mean x^2 + eps) * w``, not zero-centred); ``eps``.

    ``config`` / ``layer``: the model layer these weights stand for, which is what the
    refusal rules are asked about. ``None`` means a plain GQA layer with a dense SwiGLU
    FFN (``workbench.model``'s synthetic config), which nothing refuses.
    """

    wo: WeightMatrix
    ffn_norm: np.ndarray
    gate: WeightMatrix
    up: WeightMatrix
    down: WeightMatrix
    eps: float = SEED_EPS
    config: Any = None
    layer: int | None = None
    _host: dict = field(default_factory=dict, repr=False)
    _mx_norm: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("wo", "gate", "up", "down"):
            if not isinstance(getattr(self, name), WeightMatrix):
                raise ValueError(f"{name} must be a WeightMatrix; got {type(getattr(self, name)).__name__}")
        hidden, branch = self.wo.shape
        ffn = self.gate.shape[0]
        want = {"gate": (ffn, hidden), "up": (ffn, hidden), "down": (hidden, ffn)}
        for name, shape in want.items():
            if getattr(self, name).shape != shape:
                raise ValueError(
                    f"{name} must be {shape[0]}x{shape[1]} for wo {hidden}x{branch} and ffn {ffn}; "
                    f"got {getattr(self, name).shape[0]}x{getattr(self, name).shape[1]}"
                )
        norm = np.asarray(self.ffn_norm)
        if norm.shape != (hidden,):
            raise ValueError(f"ffn_norm must have shape ({hidden},) (wo's out dimension); got {norm.shape}")
        if not np.issubdtype(norm.dtype, np.floating):
            raise ValueError(f"ffn_norm must be a float array; got dtype {norm.dtype}")
        self.ffn_norm = norm.astype(np.float32)
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be a positive finite float; got {self.eps!r}")
        self.eps = float(self.eps)
        if (self.config is None) != (self.layer is None):
            raise ValueError("config and layer must be given together (or neither, for a plain GQA layer)")
        if self.config is not None:
            self.config.layer(self.layer)  # raises ValueError naming the allowed range
            if int(self.config.hidden_size) != hidden:
                raise ValueError(
                    f"wo's out dimension {hidden} must equal config.hidden_size {self.config.hidden_size} "
                    f"({getattr(self.config, 'name', 'the model')})"
                )

    # -- description --------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(hidden, branch, ffn)``."""
        hidden, branch = self.wo.shape
        return hidden, branch, self.gate.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of weights one tail streams (the four matrices and the norm)."""
        return self.wo.nbytes + self.gate.nbytes + self.up.nbytes + self.down.nbytes + self.ffn_norm.nbytes

    def __repr__(self) -> str:
        h, b, f = self.shape
        where = "plain GQA layer" if self.config is None else f"{getattr(self.config, 'name', 'model')} layer {self.layer}"
        return (
            f"TailWeights(hidden={h}, branch={b}, ffn={f}, wo={self.wo.dtype}, ffn={self.gate.dtype}, "
            f"fold={self.wo.fold!r}, eps={self.eps:g}, {where})"
        )

    # -- host copies --------------------------------------------------------------------

    def host_arrays(self, dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(wo_base, ffn_norm, gate, up, down)`` as numpy in ``dtype``, cached.

        The STORED bases (for a folded ``wo``, ``W R^T`` or ``R W``), dequantized; the
        rotation is applied by :func:`tail_np` around ``wo_base``. Converting the
        MLX-stored weights reads them once per dtype (a host read that
        :func:`count_waits` would see); later oracle calls read nothing from MLX.
        """
        dt = np.dtype(dtype)
        if not np.issubdtype(dt, np.floating):
            raise ValueError(f"dtype must be a numpy float dtype (float64 for the truth, float32 for the host); got {dt}")
        key = dt.str
        if key not in self._host:
            mats = tuple(m.dense(np.float64).astype(dt) if dt == np.float64 else m.dense(np.float32).astype(dt)
                         for m in (self.wo, self.gate, self.up, self.down))
            for a in mats:
                a.flags.writeable = False
            norm = self.ffn_norm.astype(dt)
            norm.flags.writeable = False
            self._host[key] = (mats[0], norm, mats[1], mats[2], mats[3])
        return self._host[key]

    def mx_norm(self) -> mx.array:
        """``ffn_norm`` as a float32 ``mx.array`` (made once)."""
        if self._mx_norm is None:
            self._mx_norm = mx.array(self.ffn_norm)
        return self._mx_norm

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_arrays(
        cls,
        wo: Any,
        ffn_norm: Any,
        gate: Any,
        up: Any,
        down: Any,
        *,
        eps: float = SEED_EPS,
        fold: HadamardFold | None = None,
        dtype: str = "float32",
        quantize: dict | None = None,
        config: Any = None,
        layer: int | None = None,
    ) -> "TailWeights":
        """Tail weights from dense [out, in] arrays (the UNFOLDED ``wo``; ``fold`` is folded in).

        ``dtype``: what the matrices are stored in (``float32``, ``float16``,
        ``bfloat16``); ``quantize``: ``None`` or the keyword arguments of
        ``WeightMatrix.quantize`` (``mode``, ``bits``, ``group_size``), applied to all four
        matrices (wo is folded first, then quantized, as an engine stores it).
        """
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}; got {dtype!r}")
        if quantize is not None and not isinstance(quantize, dict):
            raise ValueError(f"quantize must be None or a dict of mode/bits/group_size; got {quantize!r}")
        mdt = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[dtype]

        def mat(a: Any, f: HadamardFold | None = None) -> WeightMatrix:
            base = mx.array(np.asarray(a, dtype=np.float32)).astype(mdt)
            if quantize is not None:
                return WeightMatrix.quantize(base, fold=f, **quantize)
            m = WeightMatrix(base)
            return m.fold_hadamard(f) if f is not None else m

        return cls(mat(wo, fold), np.asarray(ffn_norm, dtype=np.float32), mat(gate), mat(up), mat(down),
                   eps=eps, config=config, layer=layer)

    @classmethod
    def random(
        cls,
        hidden: int,
        branch: int,
        ffn: int,
        *,
        seed: int,
        fold_block: int | None = None,
        fold_site: FoldSite = FoldSite.INPUT,
        fold_permute: bool = False,
        dtype: str = "float32",
        quantize: dict | None = None,
        eps: float = SEED_EPS,
        config: Any = None,
        layer: int | None = None,
    ) -> "TailWeights":
        """Random tail weights, seeded.

        Entries uniform with variance ``1 / fan_in`` (``U(-a, a)``, ``a = sqrt(3 / fan_in)``),
        so activations stay O(1) at every shape, as in a trained model (at Bonsai's shape
        the seed's unscaled ``U(-0.5, 0.5)`` would put FFN outputs in the thousands and
        turn the tolerance into a purely relative one). ``ffn_norm = 1 + U(-0.25, 0.25)``
        as in the seed. ``fold_block``: fold a random-sign fold of that block into ``wo``
        at ``fold_site`` (INPUT rotates the branch, width ``branch``; OUTPUT rotates wo's
        output, width ``hidden``).
        """
        for name, v in (("hidden", hidden), ("branch", branch), ("ffn", ffn)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if not isinstance(fold_site, FoldSite):
            raise ValueError(f"fold_site must be FoldSite.INPUT or FoldSite.OUTPUT; got {fold_site!r}")
        rng = np.random.default_rng(seed)

        def u(rows: int, cols: int) -> np.ndarray:
            a = math.sqrt(3.0 / cols)
            return rng.uniform(-a, a, size=(rows, cols)).astype(np.float32)

        wo, gate, up, down = u(hidden, branch), u(ffn, hidden), u(ffn, hidden), u(hidden, ffn)
        ffn_norm = (1.0 + rng.uniform(-0.25, 0.25, size=hidden)).astype(np.float32)
        fold = None
        if fold_block is not None:
            width = branch if fold_site is FoldSite.INPUT else hidden
            fold = HadamardFold.random(width, fold_block, seed=int(rng.integers(2**31)), permute=fold_permute,
                                       site=fold_site)
        return cls.from_arrays(wo, ffn_norm, gate, up, down, eps=eps, fold=fold, dtype=dtype, quantize=quantize,
                               config=config, layer=layer)

    @classmethod
    def for_layer(cls, config: Any, layer: int, *, seed: int, **kwargs: Any) -> "TailWeights":
        """Random weights of the shapes of ``config``'s layer ``layer``, carrying that layer.

        ``hidden`` is the model's, ``branch`` = q heads x head_dim (hidden for a layer
        that is not attention, which the rules refuse anyway), ``ffn`` the layer's FFN
        width (hidden where it has none). The refusal rules are then asked about THAT
        layer, so an output bias, a scale companion, a post-attention norm ... refuse.
        ``kwargs`` go to :meth:`random` (``fold_block``, ``dtype``, ...).
        """
        lc = config.layer(layer)
        hidden = int(config.hidden_size)
        branch = lc.num_q_heads * lc.head_dim or hidden
        ffn = lc.ffn_dim or hidden
        kwargs.setdefault("eps", float(config.rms_norm_eps))
        return cls.random(hidden, branch, ffn, seed=seed, config=config, layer=layer, **kwargs)


def random_inputs(w: TailWeights, *, seed: int, batch: int | tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """``(branch, residual)``, float32, uniform in [-1, 1) (llama.cpp's test inputs), seeded.

    ``batch``: leading axes, e.g. ``batch=8`` gives ``[8, branch]`` and ``[8, hidden]``.
    """
    hidden, branch, _ = w.shape
    lead = (batch,) if isinstance(batch, (int, np.integer)) else tuple(batch)
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, size=lead + (branch,)).astype(np.float32),
            rng.uniform(-1, 1, size=lead + (hidden,)).astype(np.float32))


@dataclass(frozen=True)
class SeedCase:
    """The seed test's case: its weights (wo folded with block 16 and its signs), branch, residual."""

    weights: TailWeights
    branch: np.ndarray
    residual: np.ndarray
    tol: float = SEED_TOL


def seed_case() -> SeedCase:
    """The seed test's inputs exactly, bit for bit the Rust test's (as float32).

    ``wo`` is folded with block 16, the drawn signs, no permutation, site INPUT, as the
    Rust test folds it (``wo.fold_hadamard(fold)``: the stored base becomes ``W R^T``,
    the map stays ``W``).
    """
    a = seed_arrays()
    fold = HadamardFold(16, a.signs, None, FoldSite.INPUT)
    w = TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, eps=a.eps, fold=fold)
    return SeedCase(w, a.branch, a.residual)


# ---------------------------------------------------------------------------------------
# The math: one numpy function, one MLX function
# ---------------------------------------------------------------------------------------


def _mv_np(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``w @ x`` along the last axis; ``w`` [out, in] or batched [..., out, in]."""
    if w.ndim == 2:
        return x @ w.T
    return (w @ x[..., None])[..., 0]


def rms_norm_np(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x * rsqrt(mean(x^2) + eps) * weight`` along the last axis (frink_core::rms_norm)."""
    dt = x.dtype
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + dt.type(eps))) * weight


def silu_np(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``; exp overflow for very negative x gives the right limit, -0."""
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def tail_np(
    wo: np.ndarray,
    fold: HadamardFold | None,
    ffn_norm: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    eps: float,
    branch: np.ndarray,
    residual: np.ndarray,
) -> np.ndarray:
    """The five ops in numpy, in the dtype of the arrays given (float64: the truth).

    ``wo`` is the STORED base (``W R^T`` / ``R W`` when folded) and ``fold`` its rotation,
    applied as the host applies it (INPUT: rotate the branch first; OUTPUT: unrotate wo's
    output). Every weight may carry leading batch axes equal to the activations' (one
    weight set per row: ``wo`` [S, hidden, branch], ``ffn_norm`` [S, hidden], branch
    [S, branch]), so a sweep over seeds is one call; 2-D weights serve any batch.
    """
    x = fold.rotate(branch) if fold is not None and fold.site is FoldSite.INPUT else branch
    projected = _mv_np(wo, x)
    if fold is not None and fold.site is FoldSite.OUTPUT:
        projected = fold.unrotate(projected)
    h = residual + projected  # op 2: the first residual add
    normed = rms_norm_np(h, ffn_norm, eps)  # op 3
    ffn = _mv_np(down, silu_np(_mv_np(gate, normed)) * _mv_np(up, normed))  # op 4: SwiGLU
    return h + ffn  # op 5: the second residual add


def _mv_mx(w: Any, x: mx.array) -> mx.array:
    """``w @ x`` along the last axis in MLX, accumulating in float32.

    ``w``: a ``WeightMatrix`` (its stored base, no rotation; quantized bases go through
    ``mx.quantized_matmul``) or a dense ``mx.array`` [out, in] / [..., out, in].
    """
    if isinstance(w, WeightMatrix):
        return w.matvec_base(x)
    w = w.astype(mx.float32)
    if w.ndim == 2:
        return x @ w.T
    return (w @ x[..., None])[..., 0]


def _rotate_mx(fold: HadamardFold, x: mx.array, inverse: bool) -> mx.array:
    return fold.unrotate(x) if inverse else fold.rotate(x)


def tail_mx(
    wo: Any,
    fold: HadamardFold | None,
    ffn_norm: mx.array,
    gate: Any,
    up: Any,
    down: Any,
    eps: float,
    branch: mx.array,
    residual: mx.array,
    *,
    normed_dtype: Any = None,
) -> mx.array:
    """The five ops as ONE lazy MLX graph, float32 activations; nothing is evaluated here.

    Same arguments as :func:`tail_np`, with MLX arrays; the matrices may also be
    ``WeightMatrix`` objects (their stored bases are used, so a quantized base stays
    quantized). Rotations go through ``mx.hadamard_transform`` (``HadamardFold``).

    ``normed_dtype``: round the normed vector to this MLX dtype before the FFN (e.g.
    ``mx.bfloat16``), to study what low-precision activations cost; ``None`` (the
    fused tail's choice) keeps float32.
    """
    x = branch.astype(mx.float32)
    r = residual.astype(mx.float32)
    if fold is not None and fold.site is FoldSite.INPUT:
        x = _rotate_mx(fold, x, inverse=False)
    projected = _mv_mx(wo, x)
    if fold is not None and fold.site is FoldSite.OUTPUT:
        projected = _rotate_mx(fold, projected, inverse=True)
    h = r + projected
    norm_w = ffn_norm.astype(mx.float32)
    # Written out rather than mx.fast.rms_norm, so it is visibly the same formula as
    # rms_norm_np (and batched weights broadcast); MLX reduces in float32 either way.
    normed = h * mx.rsqrt(mx.mean(h * h, axis=-1, keepdims=True) + eps) * norm_w
    if normed_dtype is not None:
        normed = normed.astype(normed_dtype).astype(mx.float32)
    g = _mv_mx(gate, normed)
    ffn = _mv_mx(down, (g * mx.sigmoid(g)) * _mv_mx(up, normed))
    return h + ffn


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------


def _check_inputs(w: TailWeights, branch: Any, residual: Any) -> tuple[Any, Any]:
    """Validate shapes (and that they are float arrays); return them unchanged in kind.

    Non-finite values are NOT rejected: the tails propagate them as IEEE arithmetic does
    (see :func:`host_tail`), because checking would cost the fused path a host read, the
    very wait it exists to save. :func:`compare` fails any NaN.
    """
    if not isinstance(w, TailWeights):
        raise ValueError(f"w must be TailWeights; got {type(w).__name__}")
    hidden, bdim, _ = w.shape

    def arr(name: str, a: Any) -> Any:
        if isinstance(a, mx.array):
            if not mx.issubdtype(a.dtype, mx.floating):
                raise ValueError(f"{name} must be a float array; got dtype {a.dtype}")
            return a
        a = np.asarray(a)
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"{name} must be a float array; got dtype {a.dtype}")
        return a

    branch, residual = arr("branch", branch), arr("residual", residual)
    if branch.ndim < 1 or branch.shape[-1] != bdim:
        raise ValueError(f"branch must have last axis {bdim} (wo's in dimension); got shape {tuple(branch.shape)}")
    if residual.ndim < 1 or residual.shape[-1] != hidden:
        raise ValueError(f"residual must have last axis {hidden} (hidden); got shape {tuple(residual.shape)}")
    if tuple(branch.shape[:-1]) != tuple(residual.shape[:-1]):
        raise ValueError(
            f"branch and residual must have the same leading (batch) axes; got {tuple(branch.shape[:-1])} "
            f"and {tuple(residual.shape[:-1])}"
        )
    return branch, residual


# ---------------------------------------------------------------------------------------
# The three tails
# ---------------------------------------------------------------------------------------


def host_tail(w: TailWeights, branch: Any, residual: Any, *, dtype: Any = np.float64) -> np.ndarray:
    """The oracle: the five ops in numpy, in ``dtype`` throughout (float64: the truth).

    Leading batch axes on ``branch`` / ``residual`` are kept. Reads nothing from MLX once
    the weights' host copies exist (:meth:`TailWeights.host_arrays`).

    Non-finite inputs propagate: a NaN or Inf anywhere in ``branch`` reaches every element
    of wo's output (a matvec mixes all of them), and one in ``residual`` reaches the norm's
    mean, so the whole output row is NaN (Inf times rsqrt(Inf) = Inf * 0 = NaN). The fused
    and unfused tails do the same; :func:`compare` reports it as a failure.
    """
    branch, residual = _check_inputs(w, branch, residual)
    dt = np.dtype(dtype)
    wo, norm, gate, up, down = w.host_arrays(dt)
    return tail_np(wo, w.wo.fold, norm, gate, up, down, w.eps,
                   np.asarray(branch).astype(dt), np.asarray(residual).astype(dt))


def _to_mx(a: Any) -> mx.array:
    return a.astype(mx.float32) if isinstance(a, mx.array) else mx.array(np.asarray(a, dtype=np.float32))


def unfused_tail(w: TailWeights, branch: Any, residual: Any) -> np.ndarray:
    """The engine before the fusion: TWO submissions, two waits.

    1. ``wo`` (with its rotation) as one MLX submission; its result read back (wait 1).
    2. On the host, in float32: ``h = residual + projected``, ``rms_norm(h)``.
    3. The SwiGLU FFN as a second MLX submission; read back (wait 2).
    4. On the host: ``h + ffn``.

    Returns float32 numpy with the inputs' batch axes. Refuses nothing: this is the path
    every layer can take.
    """
    branch, residual = _check_inputs(w, branch, residual)
    projected = np.asarray(w.wo.apply(_to_mx(branch)))  # submission 1, and its wait
    h = np.asarray(residual, dtype=np.float32) + projected
    normed = rms_norm_np(h, w.ffn_norm, w.eps).astype(np.float32)
    nx = mx.array(normed)
    g = w.gate.apply(nx)
    ffn = np.asarray(w.down.apply((g * mx.sigmoid(g)) * w.up.apply(nx)))  # submission 2, and its wait
    return h + ffn


@dataclass(frozen=True)
class TailLaunch:
    """What every fused backend needs, assembled in ONE place (the seed's ``attn_tail_launch``).

    ``wo`` is wo's stored base as a matrix WITHOUT its fold (the same stored arrays,
    dense or quantized), and ``fold`` / ``fold_plan`` the rotation the backend must apply
    around it (``None`` without a fold): kept apart, as ``WeightMatrix.launch_parts``
    gives them, because a kernel applies the rotation itself. The FFN parts:
    ``ffn_norm`` (float32 ``mx.array``), ``eps``, and ``gate`` / ``up`` / ``down``.
    """

    weights: TailWeights
    wo: WeightMatrix
    fold: HadamardFold | None
    fold_plan: FoldPlan | None
    ffn_norm: mx.array
    eps: float
    gate: WeightMatrix
    up: WeightMatrix
    down: WeightMatrix


def tail_refusals(w: TailWeights, *, kernels_enabled: bool = True) -> list:
    """Every ``Refusal`` the rules find for the layer ``w`` stands for (empty: it fuses).

    The ONE body (``workbench.refusals.refusals``) that the launch builder asks too, so
    the two cannot disagree. Bare weights (``config is None``) are a plain GQA layer with
    a dense SwiGLU FFN; they are asked about as such, not waved through.
    """
    from workbench import model, refusals  # imported here: refusals sits above weights in the chain

    if w.config is None:
        hidden, branch, ffn = w.shape
        cfg = model.ModelConfig.synthetic(hidden, ffn_dim=ffn, num_q_heads=1, num_kv_heads=1, head_dim=branch,
                                          rms_norm_eps=w.eps)
        layer = 0
    else:
        cfg, layer = w.config, int(w.layer)
    return list(refusals.refusals(cfg, layer, kernels_enabled=kernels_enabled))


def tail_launch(w: TailWeights, *, kernels_enabled: bool = True) -> TailLaunch:
    """The launch for ``w``'s tail, or :class:`TailRefused` with every reason.

    Asks the refusal body FIRST, then assembles wo's parts, the fold plan for its width
    (which raises if the fold does not fit) and the FFN parts.
    """
    if not isinstance(w, TailWeights):
        raise ValueError(f"w must be TailWeights; got {type(w).__name__}")
    found = tail_refusals(w, kernels_enabled=kernels_enabled)
    if found:
        where = "a plain layer" if w.config is None else f"{getattr(w.config, 'name', 'the model')} layer {w.layer}"
        raise TailRefused(found, where)
    base, fold = w.wo.launch_parts()
    plan = None
    if fold is not None:
        hidden, branch, _ = w.shape
        plan = fold.plan(branch if fold.site is FoldSite.INPUT else hidden)
    return TailLaunch(w, WeightMatrix(base), fold, plan, w.mx_norm(), w.eps, w.gate, w.up, w.down)


def tail_graph(launch: TailLaunch, branch: mx.array, residual: mx.array) -> mx.array:
    """The fused tail as one lazy MLX graph from a launch (the ``"graph"`` backend's body)."""
    return tail_mx(launch.wo, launch.fold, launch.ffn_norm, launch.gate, launch.up, launch.down, launch.eps,
                   branch, residual)


def fused_tail(
    w: TailWeights,
    branch: Any,
    residual: Any,
    *,
    backend: str = "auto",
    return_backend: bool = False,
    kernels_enabled: bool = True,
) -> np.ndarray | tuple[np.ndarray, str]:
    """The tail in ONE submission; float32 numpy out, with the inputs' batch axes.

    ``backend``: ``"graph"`` (the whole tail as MLX ops, evaluated once, on MLX's
    default device), ``"metal"`` / ``"cuda"`` (the kernels; ``BackendUnavailable`` says
    what is missing when they cannot run here), or ``"auto"`` (the best available; with
    ``return_backend=True`` you get ``(out, name)`` to see which it picked).

    Raises :class:`TailRefused` (with every reason) for a layer the rules refuse, before
    anything is built or run; ``kernels_enabled=False`` is the seed's first rule (the
    engine's dense kernels switched off), so it refuses every layer.
    """
    from workbench import backends

    name = backends.resolve_backend(backend)
    branch, residual = _check_inputs(w, branch, residual)
    launch = tail_launch(w, kernels_enabled=kernels_enabled)
    if name == "graph":
        out = tail_graph(launch, _to_mx(branch), _to_mx(residual))
        mx.eval(out)  # the one submission
        result = np.asarray(out)  # already evaluated: reading it waits on nothing more
    else:
        result = np.asarray(backends.run_tail_kernel(name, launch, branch, residual), dtype=np.float32)
    return (result, name) if return_backend else result


# ---------------------------------------------------------------------------------------
# Counting waits
# ---------------------------------------------------------------------------------------


@dataclass
class WaitCount:
    """What :func:`count_waits` saw: ``n`` waits, and ``events`` naming each (``eval``, ``read:asarray``, ...)."""

    events: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.events)

    def __int__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.n == other
        if isinstance(other, WaitCount):
            return self.events == other.events
        return NotImplemented

    def __repr__(self) -> str:
        return f"WaitCount(n={self.n}, events={self.events})"


class _WaitPatch:
    """The patches :func:`count_waits` installs once, whatever the nesting depth."""

    counters: list[tuple[WaitCount, list]] = []
    originals: dict[tuple[Any, str], Any] = {}
    busy = False  # re-entrancy guard: a counted call that calls another is one wait


def _flatten_arrays(tree: Any, out: list) -> None:
    if isinstance(tree, mx.array):
        out.append(tree)
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            _flatten_arrays(t, out)
    elif isinstance(tree, dict):
        for t in tree.values():
            _flatten_arrays(t, out)


def _record(kind: str, arrays: list, is_eval: bool) -> None:
    for counter, evaluated in _WaitPatch.counters:
        if not is_eval and arrays and all(any(a is e for e in evaluated) for a in arrays):
            continue  # read of an array this block already evaluated: no new submission
        if is_eval:
            evaluated.extend(arrays)
        counter.events.append(kind)


def _wrap(owner: Any, attr: str, kind: str, is_eval: bool, mx_only: bool = False) -> None:
    orig = getattr(owner, attr)
    _WaitPatch.originals[(owner, attr)] = orig

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _WaitPatch.busy:
            return orig(*args, **kwargs)
        arrays: list = []
        if is_eval:
            _flatten_arrays(list(args), arrays)
        elif mx_only:
            if not (args and isinstance(args[0], mx.array)):
                return orig(*args, **kwargs)
            arrays = [args[0]]
        else:
            arrays = [args[0]] if args else []
        _WaitPatch.busy = True
        try:
            return orig(*args, **kwargs)
        finally:
            _WaitPatch.busy = False
            if not is_eval or arrays:
                _record(kind, arrays, is_eval)

    setattr(owner, attr, wrapper)


def _install() -> None:
    _wrap(mx, "eval", "eval", is_eval=True)
    _wrap(mx, "async_eval", "async_eval", is_eval=True)
    for meth in ("item", "tolist", "__array__", "__float__", "__int__", "__bool__", "__index__", "__dlpack__"):
        if hasattr(mx.array, meth):
            _wrap(mx.array, meth, f"read:{meth.strip('_')}", is_eval=False)
    for fn in ("asarray", "array", "asanyarray", "ascontiguousarray", "copy"):
        _wrap(np, fn, f"read:np.{fn}", is_eval=False, mx_only=True)


def _uninstall() -> None:
    for (owner, attr), orig in _WaitPatch.originals.items():
        setattr(owner, attr, orig)
    _WaitPatch.originals.clear()


@contextlib.contextmanager
def count_waits() -> Iterator[WaitCount]:
    """Count the submissions a block of code waits on; yields a :class:`WaitCount`.

    What it counts, while the block runs (any code, not only the workbench's):

    * each ``mx.eval`` / ``mx.async_eval`` call given at least one array: one wait (one
      evaluation is one submission, however many arrays it covers);
    * each host read of an ``mx.array`` that this block has NOT already evaluated:
      ``.item()``, ``.tolist()``, ``__array__``, ``float()`` / ``int()`` / ``bool()``,
      ``__dlpack__``, and ``np.asarray`` / ``np.array`` / ``np.asanyarray`` /
      ``np.ascontiguousarray`` / ``np.copy`` of an mx.array (numpy reads MLX through the
      buffer protocol, which cannot be patched, so the numpy entry points are). Reading
      an array the block evaluated costs no new submission and is not counted.

    Not seen: buffer-protocol reads that bypass those numpy functions (``memoryview``,
    a numpy ufunc handed an mx.array directly); an array read that was evaluated
    outside the block counts as a wait (MLX does not say whether an array is
    evaluated). Nested blocks each count everything inside them. Not thread-safe: it
    patches module attributes while active.
    """
    wc = WaitCount()
    if not _WaitPatch.counters:
        _install()
    entry = (wc, [])
    _WaitPatch.counters.append(entry)
    try:
        yield wc
    finally:
        _WaitPatch.counters.remove(entry)
        if not _WaitPatch.counters:
            _uninstall()


# ---------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------


def scaled_error(actual: Any, expected: Any) -> np.ndarray:
    """``|x - y| / max(|y|, 1)`` per element, float64: the seed's criterion is ``<= tol``.

    Vectorised and batch-agnostic, for sweeps. NaN where either side is NaN; 0 where
    both are the same infinity; Inf where only one is infinite.
    """
    x = np.asarray(actual, dtype=np.float64)
    y = np.asarray(expected, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"actual and expected must have the same shape; got {x.shape} and {y.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.abs(x - y) / np.maximum(np.abs(y), 1.0)
    any_inf = np.isinf(x) | np.isinf(y)
    e = np.where(any_inf, np.where(x == y, 0.0, np.inf), e)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, e)


@dataclass(frozen=True)
class Comparison:
    """One comparison: the seed's criterion and the usual metrics; prints as one line.

    ``worst`` is the largest ``|x - y| / max(|y|, 1)`` (pass iff ``worst <= tol`` and no
    NaN); ``margin = tol / worst`` (> 1 passes; "64x under the tolerance"); ``where`` its
    index. ``max_abs`` / ``max_rel`` (``|x - y| / |y|``, over ``y != 0``) and ``nmse``
    (``sum (y - x)^2 / sum y^2``, y the reference, as llama.cpp's test-backend-ops) are
    over the finite elements. ``n_nan``: elements where either side is NaN;
    ``n_inf_mismatch``: where only one side is infinite or their signs differ.
    """

    passed: bool
    tol: float
    worst: float
    margin: float
    where: tuple[int, ...]
    max_abs: float
    max_rel: float
    nmse: float
    n: int
    n_nan: int
    n_inf_mismatch: int

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        margin = "inf" if math.isinf(self.margin) else f"{self.margin:.3g}x"
        extra = ""
        if self.n_nan or self.n_inf_mismatch:
            extra = f"; {self.n_nan} NaN, {self.n_inf_mismatch} Inf mismatches"
        return (
            f"{verdict} at tol {self.tol:g}: worst {self.worst:.3g} (margin {margin}) at {self.where}; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, NMSE {self.nmse:.3g} over {self.n}{extra}"
        )


def compare(actual: Any, expected: Any, *, tol: float = SEED_TOL) -> Comparison:
    """The seed's criterion ``|x - y| <= tol * max(|y|, 1)`` per element, and the metrics.

    ``expected`` is the reference (the host or the truth). Any NaN (either side) fails,
    as in llama.cpp; infinities must match (same position, same sign).
    """
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol must be a positive finite float; got {tol!r}")
    x = np.asarray(actual, dtype=np.float64)
    y = np.asarray(expected, dtype=np.float64)
    e = scaled_error(x, y)
    if e.size == 0:
        raise ValueError("actual and expected must not be empty")
    nan = np.isnan(e)
    n_nan = int(nan.sum())
    inf_mismatch = np.isinf(e)
    n_inf = int(inf_mismatch.sum())
    finite = np.isfinite(x) & np.isfinite(y)
    if nan.all():
        worst, where = math.nan, tuple(int(i) for i in np.unravel_index(0, e.shape))
    else:
        masked = np.where(nan, -1.0, e)
        i = int(np.argmax(masked))
        worst, where = float(masked.flat[i]), tuple(int(j) for j in np.unravel_index(i, e.shape))
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x - y)[finite]
    yf = y[finite]
    max_abs = float(d.max()) if d.size else math.nan
    nz = yf != 0
    max_rel = float((d[nz] / np.abs(yf[nz])).max()) if nz.any() else math.nan
    denom = float(np.sum(yf * yf))
    nmse = float(np.sum(d * d) / denom) if denom > 0 else (0.0 if d.size and not d.any() else math.nan)
    passed = n_nan == 0 and n_inf == 0 and worst <= tol
    margin = math.inf if worst == 0 else (tol / worst if math.isfinite(worst) else 0.0)
    return Comparison(passed, float(tol), worst, margin, where, max_abs, max_rel, nmse, int(e.size), n_nan, n_inf)


# ---------------------------------------------------------------------------------------
# The three-way comparison: "the kernel is wrong" versus "float32 is float32"
# ---------------------------------------------------------------------------------------

#: Deliberately wrong fused variants, to show what the three-way comparison tells apart:
#: ``skip_fold`` forgets wo's rotation (invisible without a fold, as the seed warns);
#: ``bf16_normed`` rounds the normed vector to bf16 before the FFN (seen 1.5e-2 off).
FAULTS = ("skip_fold", "bf16_normed")


def faulty_fused_tail(w: TailWeights, branch: Any, residual: Any, fault: str) -> np.ndarray:
    """The graph fused tail with one deliberate ``fault`` (see :data:`FAULTS`); float32 numpy."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}; got {fault!r}")
    branch, residual = _check_inputs(w, branch, residual)
    launch = tail_launch(w)
    fold = None if fault == "skip_fold" else launch.fold
    normed_dtype = mx.bfloat16 if fault == "bf16_normed" else None
    out = tail_mx(launch.wo, fold, launch.ffn_norm, launch.gate, launch.up, launch.down, launch.eps,
                  _to_mx(branch), _to_mx(residual), normed_dtype=normed_dtype)
    mx.eval(out)
    return np.asarray(out)


#: What a user should conclude from (fused vs truth, host vs truth), both at the same tol.
VERDICTS: dict[tuple[bool, bool], str] = {
    (True, True): "fused is right (float32 is float32)",
    (False, True): "the fused path is WRONG (the float32 host meets the tolerance it misses)",
    (False, False): "float32 itself misses this tolerance here: widen it or accumulate wider",
    (True, False): "fused is right; the float32 host is the less accurate path",
}


def verdict(fused_vs_truth: Comparison, host_vs_truth: Comparison) -> str:
    """The conclusion :data:`VERDICTS` draws from the two comparisons against the truth."""
    return VERDICTS[(bool(fused_vs_truth.passed), bool(host_vs_truth.passed))]


@dataclass(frozen=True)
class ThreeWay:
    """Fused (float32) vs host (float32) vs truth (float64), and the waits each path cost."""

    fused_vs_truth: Comparison
    host_vs_truth: Comparison
    fused_vs_host: Comparison
    waits: dict[str, int]

    @property
    def verdict(self) -> str:
        return verdict(self.fused_vs_truth, self.host_vs_truth)


def three_way(
    w: TailWeights,
    branch: Any,
    residual: Any,
    *,
    tol: float = SEED_TOL,
    backend: str = "graph",
    fault: str | None = None,
) -> ThreeWay:
    """Run the fused tail (``backend``, or a :data:`FAULTS` variant), the float32 host and the
    float64 truth on the same inputs, compare all three at ``tol``, and count each one's waits
    (the host copies of the weights are made first, so the oracles count 0)."""
    w.host_arrays(np.float64)  # the host copies of the weights, made outside the counts
    w.host_arrays(np.float32)
    with count_waits() as n_truth:
        truth = host_tail(w, branch, residual)
    with count_waits() as n_host:
        host = host_tail(w, branch, residual, dtype=np.float32)
    with count_waits() as n_fused:
        fused = (fused_tail(w, branch, residual, backend=backend) if fault is None
                 else faulty_fused_tail(w, branch, residual, fault))
    with count_waits() as n_unfused:
        unfused_tail(w, branch, residual)
    return ThreeWay(
        compare(fused, truth, tol=tol),
        compare(host, truth, tol=tol),
        compare(fused, host, tol=tol),
        {"unfused": n_unfused.n, "fused": n_fused.n, "host": n_host.n, "truth": n_truth.n},
    )


def _sig(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.1e}"


def three_way_table(cases: Sequence[tuple[str, TailWeights, Any, Any]], *, tol: float = SEED_TOL,
                    fault: str | None = None, figures: bool = True) -> "Any":
    """One row per ``(label, weights, branch, residual)``: the three-way comparison.

    ``figures=True``: the worst scaled errors (2 significant digits) and NMSE, which vary
    with the device in their last digits; ``figures=False``: only what does not (PASS /
    FAIL at ``tol``, the waits, the verdict), for checked notebook output. A pandas
    DataFrame.
    """
    import pandas as pd  # tables only; the tail itself needs no pandas

    rows = []
    for label, w, br, res in cases:
        r = three_way(w, br, res, tol=tol, fault=fault)
        h, b, f = w.shape
        row: dict[str, Any] = {
            "case": label,
            "shape": f"{h}x{b}x{f}",
            "weights": w.wo.dtype,
            "fold": "none" if w.wo.fold is None else f"{w.wo.fold.block}/{w.wo.fold.site.name.lower()}",
        }
        if figures:
            row.update({
                "fused-truth worst": _sig(r.fused_vs_truth.worst),
                "host-truth worst": _sig(r.host_vs_truth.worst),
                "fused-host worst": _sig(r.fused_vs_host.worst),
                "fused-truth NMSE": _sig(r.fused_vs_truth.nmse),
            })
        row.update({
            "fused~truth": "PASS" if r.fused_vs_truth.passed else "FAIL",
            "host~truth": "PASS" if r.host_vs_truth.passed else "FAIL",
            "fused~host": "PASS" if r.fused_vs_host.passed else "FAIL",
            "waits unfused/fused/oracle": f"{r.waits['unfused']}/{r.waits['fused']}/{r.waits['truth']}",
            "verdict": r.verdict,
        })
        rows.append(row)
    return pd.DataFrame(rows)
