"""The attention layer's tail, three ways: the oracle, the engine before the fusion, fused.

    out = residual + ffn(rms_norm(residual + wo(branch)))      ffn(x) = down(silu(gate x) * up x)

``branch`` is the attention output BEFORE ``wo`` (for a gated attention, after its output
gate); ``wo`` usually carries a block-Hadamard fold. frink-models 0.48.0 (a Rust decoder
engine for Apple GPUs) runs this tail in one Metal submission instead of two: its fused
attention tail. This module is the workbench's version of that change:

* :class:`TailWeights` -- one layer's tail weights, and :func:`random_inputs`; random
  cases are drawn by one recipe (:func:`case_recipe`), which the batched sweeps of
  ``workbench.sweeps`` follow too;
* :func:`host_tail` -- the oracle, op by op in numpy, the five ops frink-models' test
  composes (wo with its rotation, residual add, RMS norm, SwiGLU FFN, residual add).
  float64 is the truth; float32 is "the host";
* :func:`unfused_tail` -- the engine before the fusion: ``wo`` as one MLX submission, the
  add and the norm on the host, the FFN as a second submission, the last add on the
  host. Two waits;
* :func:`fused_tail` -- one submission. ``backend="graph"`` builds the whole tail as MLX
  ops and evaluates it once (any MLX device); ``"metal"`` / ``"cuda"`` run the kernels
  (``workbench.kernel_launch``). Every backend goes through ONE launch builder,
  :func:`tail_launch`, which asks the refusal rules first, as the engine's
  ``attn_tail_launch`` does.

The math lives in two pure functions of arrays, one per library, so the sweeps can
vectorise them (a leading batch axis on the activations AND on the weights):
:func:`tail_np` (numpy, any float dtype) and :func:`tail_mx` (MLX graph, float32
activations and accumulation). Everything else here is plumbing around them.

Precision: weights may be bf16 / f16 / quantized, but activations and accumulation are
float32 on the MLX paths: a graph that cast the normed vector to bf16 was seen 1.5e-2 off
the float64 truth, seventy-five times frink-models' tolerance of 2e-4.

Names that lived here before the package was split by concept (the test case, the
comparison, the wait counter, the three-way study) are still reachable from this module
(see ``__getattr__`` at the bottom), for code written against that layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from workbench import backends, kernel_launch, model, one_launch, refusals, validate
from workbench.fold import FoldPlan, FoldSite, HadamardFold
from workbench.moved_names import forwarder
from workbench.validate import describe, number, one_of
from workbench.weights import DENSE_DTYPES, WeightMatrix

#: The RMS norm's epsilon when none is given: 1e-6, Qwen3's ``rms_norm_eps`` and the
#: value frink-models' test uses (``workbench.frink_case.SEED_EPS``).
DEFAULT_EPS = 1e-6


class TailRefused(ValueError):
    """The fused path refuses this layer; ``reasons`` lists every ``Refusal`` that applies.

    A ``ValueError`` because it is the weights given (the layer they were built for) that
    the fusion does not serve; the caller's fallback is :func:`unfused_tail`, exactly as
    frink-models' caller projects on the host when ``attn_tail_launch`` returns ``None``.
    """

    def __init__(self, reasons: Sequence[Any], where: str = "") -> None:
        self.reasons = list(reasons)
        names = ", ".join(getattr(r, "name", str(r)) for r in self.reasons)
        super().__init__(f"the fused tail refuses {where or 'this layer'}: {names}")


# ---------------------------------------------------------------------------------------
# Random cases: one recipe
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """How one tensor of a random tail case is drawn: ``centre + U(-half_width, half_width)``,
    float32; or, with ``signs``, +1 / -1 with probability 1/2 each."""

    name: str
    shape: tuple[int, ...]
    half_width: float
    centre: float = 0.0
    signs: bool = False

    def draw(self, rng: np.random.Generator, lead: tuple[int, ...] = ()) -> np.ndarray:
        """One draw from ``rng`` (numpy's ``uniform`` in float64, then float32), with ``lead`` batch axes."""
        v = rng.uniform(-self.half_width, self.half_width, size=lead + self.shape)
        if self.signs:
            return np.where(v < 0, np.float32(-1.0), np.float32(1.0))
        return (self.centre + v if self.centre else v).astype(np.float32)


def case_recipe(hidden: int, branch: int, ffn: int) -> tuple[Draw, ...]:
    """The distributions of a random tail case, in draw order; every random case follows it.

    ``wo``, ``gate``, ``up``, ``down``: ``U(-a, a)`` with ``a = sqrt(3 / fan_in)``, variance
    ``1 / fan_in``, so activations stay O(1) at every shape as in a trained model (at
    Bonsai-27B's shape, frink-models' test's unscaled ``U(-0.5, 0.5)`` would put FFN outputs
    in the thousands and turn the tolerance into a purely relative one); ``ffn_norm``:
    ``1 + U(-0.25, 0.25)``, as that test draws it; ``branch`` and ``residual``: ``U(-1, 1)``
    (llama.cpp's test inputs); ``signs``: a fold's ``D`` over the branch.

    :meth:`TailWeights.random` and :func:`random_inputs` draw from it one tensor at a time
    (:meth:`Draw.draw`); ``workbench.sweeps`` draws the same distributions for a block of
    cases at once, from float32 uniforms (a different stream, the same recipe).
    """
    hidden = validate.integer("hidden", hidden, minimum=1)
    branch = validate.integer("branch", branch, minimum=1)
    ffn = validate.integer("ffn", ffn, minimum=1)

    def mat(name: str, rows: int, cols: int) -> Draw:
        return Draw(name, (rows, cols), math.sqrt(3.0 / cols))

    return (mat("wo", hidden, branch), mat("gate", ffn, hidden), mat("up", ffn, hidden), mat("down", hidden, ffn),
            Draw("ffn_norm", (hidden,), 0.25, centre=1.0), Draw("branch", (branch,), 1.0),
            Draw("residual", (hidden,), 1.0), Draw("signs", (branch,), 1.0, signs=True))


# ---------------------------------------------------------------------------------------
# The weights
# ---------------------------------------------------------------------------------------


#: How a checkpoint stores an RMSNorm weight: ``"plain"`` multiplies by ``w`` (Llama,
#: Qwen3, mlx-lm's converted checkpoints), ``"zero_centred"`` by ``1 + w`` (Hugging Face
#: Qwen3-Next and Qwen3.5 checkpoints; mlx-lm adds the 1 when it converts them).
NORM_CONVENTIONS = ("plain", "zero_centred")


@dataclass(frozen=True, eq=False)
class TailWeights:
    """The weights of one attention layer's tail; frozen, its arrays read-only.

    ``wo`` [hidden, branch] (usually folded), ``gate`` / ``up`` [ffn, hidden], ``down``
    [hidden, ffn] as :class:`~workbench.weights.WeightMatrix`; ``ffn_norm`` [hidden]
    float32, the EFFECTIVE norm weight (``x * rsqrt(mean x^2 + eps) * ffn_norm``); ``eps``.
    ``branch`` is wo's input: the attention output after any output gate (Qwen3-Next /
    Qwen3.5 multiply by ``sigmoid(gate)`` before ``wo``).

    ``norm_convention`` records how the source stored the norm weight: ``"plain"`` (it
    is the effective weight) or ``"zero_centred"`` (the source stored ``w`` and computes
    ``x * (1 + w)``; ``ffn_norm`` here is already ``1 + w``, see :meth:`from_arrays`).

    ``config`` / ``layer``: the model layer these weights stand for, which is what the
    refusal rules are asked about. ``None`` means a plain GQA layer with a dense SwiGLU
    FFN (``workbench.model``'s synthetic config), which nothing refuses.

    Frozen, with a read-only ``ffn_norm``, because the host copies
    (:meth:`host_arrays`) and the MLX norm are cached: a weight changed after
    construction would leave them stale. Make a new ``TailWeights`` instead.
    """

    wo: WeightMatrix
    ffn_norm: np.ndarray
    gate: WeightMatrix
    up: WeightMatrix
    down: WeightMatrix
    eps: float = DEFAULT_EPS
    config: Any = None
    layer: int | None = None
    norm_convention: str = "plain"
    _host: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("wo", "gate", "up", "down"):
            if not isinstance(getattr(self, name), WeightMatrix):
                raise ValueError(f"{name}: must be a WeightMatrix, got {describe(getattr(self, name))}")
        hidden, branch = self.wo.shape
        ffn = self.gate.shape[0]
        want = {"gate": (ffn, hidden), "up": (ffn, hidden), "down": (hidden, ffn)}
        for name, shape in want.items():
            if getattr(self, name).shape != shape:
                raise ValueError(
                    f"{name}: must be {shape[0]}x{shape[1]} for wo {hidden}x{branch} and ffn {ffn}, "
                    f"got {getattr(self, name).shape[0]}x{getattr(self, name).shape[1]}"
                )
        norm = np.asarray(self.ffn_norm)
        if norm.shape != (hidden,):
            raise ValueError(f"ffn_norm: must have shape ({hidden},) (wo's out dimension), got shape {norm.shape}")
        if not np.issubdtype(norm.dtype, np.floating):
            raise ValueError(f"ffn_norm: must be a float array, got dtype {norm.dtype}")
        norm = np.array(norm, dtype=np.float32)  # our own copy: the caller's array stays theirs
        norm.flags.writeable = False
        object.__setattr__(self, "ffn_norm", norm)
        object.__setattr__(self, "eps", number("eps", self.eps, minimum=0, exclusive_minimum=True))
        one_of("norm_convention", self.norm_convention, NORM_CONVENTIONS)
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
        norm = "norm x*w" if self.norm_convention == "plain" else "norm x*w, w = 1 + the stored zero-centred weight"
        return (
            f"TailWeights(hidden={h}, branch={b}, ffn={f}, wo={self.wo.dtype}, ffn={self.gate.dtype}, "
            f"fold={self.wo.fold!r}, eps={self.eps:g}, {norm}, {where})"
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
        if "mx_norm" not in self._host:
            self._host["mx_norm"] = mx.array(self.ffn_norm)
        return self._host["mx_norm"]

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
        eps: float | None = None,
        fold: HadamardFold | None = None,
        dtype: str = "float32",
        quantize: dict | None = None,
        config: Any = None,
        layer: int | None = None,
        norm_convention: str = "plain",
    ) -> "TailWeights":
        """Tail weights from dense [out, in] arrays (the UNFOLDED ``wo``; ``fold`` is folded in).

        ``eps``: ``None`` takes the config's ``rms_norm_eps`` when a config is given (else
        :data:`DEFAULT_EPS`); an eps that contradicts the config's is refused, since a
        wrong eps hides with O(1) activations and shows at a real residual stream's scale.
        ``norm_convention``: how ``ffn_norm`` is stored; ``"zero_centred"`` (Hugging Face
        Qwen3-Next / Qwen3.5) adds the 1 here, in float32, and records that it did.

        ``dtype``: what the matrices are stored in (``float32``, ``float16``,
        ``bfloat16``); ``quantize``: ``None`` or the keyword arguments of
        ``WeightMatrix.quantize`` (``mode``, ``bits``, ``group_size``), applied to all four
        matrices (wo is folded first, then quantized, as an engine stores it).
        """
        if dtype not in DENSE_DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DENSE_DTYPES)}; got {dtype!r}")
        if quantize is not None and not isinstance(quantize, dict):
            raise ValueError(f"quantize must be None or a dict of mode/bits/group_size; got {quantize!r}")
        mdt = DENSE_DTYPES[dtype]
        eps = _eps_for(eps, config)
        one_of("norm_convention", norm_convention, NORM_CONVENTIONS)
        norm = np.asarray(ffn_norm, dtype=np.float32)
        if norm_convention == "zero_centred":
            norm = norm + np.float32(1.0)

        def mat(a: Any, f: HadamardFold | None = None) -> WeightMatrix:
            base = mx.array(np.asarray(a, dtype=np.float32)).astype(mdt)
            if quantize is not None:
                return WeightMatrix.quantize(base, fold=f, **quantize)
            m = WeightMatrix(base)
            return m.fold_hadamard(f) if f is not None else m

        return cls(mat(wo, fold), norm, mat(gate), mat(up), mat(down),
                   eps=eps, config=config, layer=layer, norm_convention=norm_convention)

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
        eps: float | None = None,
        config: Any = None,
        layer: int | None = None,
    ) -> "TailWeights":
        """Random tail weights, seeded, drawn by :func:`case_recipe` (wo, gate, up, down,
        ffn_norm, in that order, from one generator).

        ``fold_block``: fold a random-sign fold of that block into ``wo`` at ``fold_site``
        (INPUT rotates the branch, width ``branch``; OUTPUT rotates wo's output, width
        ``hidden``); its signs and permutation come from the same generator, after the weights.
        """
        for name, v in (("hidden", hidden), ("branch", branch), ("ffn", ffn)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if not isinstance(fold_site, FoldSite):
            raise ValueError(f"fold_site must be FoldSite.INPUT or FoldSite.OUTPUT; got {fold_site!r}")
        rng = np.random.default_rng(seed)
        recipe = {d.name: d for d in case_recipe(hidden, branch, ffn)}
        wo, gate, up, down, ffn_norm = (recipe[n].draw(rng) for n in ("wo", "gate", "up", "down", "ffn_norm"))
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
        return cls.random(hidden, branch, ffn, seed=seed, config=config, layer=layer, **kwargs)


def _eps_for(eps: Any, config: Any) -> float:
    """The norm's eps: the config's when one is given (a different explicit eps is refused)."""
    if config is None:
        return DEFAULT_EPS if eps is None else number("eps", eps, minimum=0, exclusive_minimum=True)
    from_config = float(config.rms_norm_eps)
    if eps is None:
        return from_config
    given = number("eps", eps, minimum=0, exclusive_minimum=True)
    if given != from_config:
        raise ValueError(
            f"eps: must be the config's rms_norm_eps {from_config:g} ({getattr(config, 'name', 'the model')}) "
            f"or None, got {describe(eps)}"
        )
    return given


def random_inputs(w: TailWeights, *, seed: int, batch: int | tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """``(branch, residual)``, float32, uniform in [-1, 1) (llama.cpp's test inputs), seeded
    (:func:`case_recipe`).

    ``batch``: leading axes, e.g. ``batch=8`` gives ``[8, branch]`` and ``[8, hidden]``.
    """
    if not isinstance(w, TailWeights):
        raise ValueError(f"w: must be TailWeights, got {validate.describe(w)}")
    if isinstance(batch, (int, np.integer, bool, np.bool_)):
        lead = (validate.integer("batch", batch, minimum=0),)
    else:
        lead = tuple(validate.integer("batch", b, minimum=0) for b in validate.sequence("batch", batch, what="ints",
                                                                                             non_empty=False))
    hidden, bdim, _ = w.shape
    validate.within_memory("batch", 8 * math.prod(lead) * (hidden + bdim), f"a batch of {lead} inputs")
    rng = np.random.default_rng(validate.seed("seed", seed))
    recipe = {d.name: d for d in case_recipe(*w.shape)}
    return recipe["branch"].draw(rng, lead), recipe["residual"].draw(rng, lead)


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


def check_inputs(w: TailWeights, branch: Any, residual: Any) -> tuple[Any, Any]:
    """Validate shapes (and that they are float arrays); return them unchanged in kind.

    Non-finite values are NOT rejected: the tails propagate them as IEEE arithmetic does
    (see :func:`host_tail`), because checking would cost the fused path a host read, the
    very wait it exists to save. :func:`compare` fails any NaN.
    """
    if not isinstance(w, TailWeights):
        raise ValueError(f"w: must be TailWeights, got {validate.describe(w)}")
    hidden, bdim, _ = w.shape

    def arr(name: str, a: Any) -> Any:
        if isinstance(a, mx.array):
            if not mx.issubdtype(a.dtype, mx.floating):
                raise ValueError(f"{name}: must be a float array, got {validate.describe(a)}")
            return a
        try:
            a = np.asarray(a)
        except Exception:  # a ragged list
            raise ValueError(f"{name}: must be a float array, got {validate.describe(a)}") from None
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"{name}: must be a float array, got {validate.describe(a)}")
        return a

    branch, residual = arr("branch", branch), arr("residual", residual)
    if branch.ndim < 1 or branch.shape[-1] != bdim:
        raise ValueError(f"branch: must have last axis {bdim} (wo's in dimension), got shape {tuple(branch.shape)}")
    if residual.ndim < 1 or residual.shape[-1] != hidden:
        raise ValueError(f"residual: must have last axis {hidden} (hidden), got shape {tuple(residual.shape)}")
    if tuple(branch.shape[:-1]) != tuple(residual.shape[:-1]):
        raise ValueError(
            f"branch/residual: must have the same leading (batch) axes, got {tuple(branch.shape[:-1])} "
            f"and {tuple(residual.shape[:-1])}"
        )
    return branch, residual


def _empty_batch(branch: Any, hidden: int) -> np.ndarray | None:
    """The float32 result of a tail over an EMPTY batch (a leading axis of length 0), else None.

    All three tails answer an empty batch with an empty result of shape ``(..., 0, ..., hidden)``
    without submitting anything: MLX refuses empty arrays in ``hadamard_transform``, and
    there is nothing to compute. ``host_tail`` gives the same shape in its dtype.
    """
    lead = tuple(branch.shape[:-1])
    return np.zeros(lead + (hidden,), dtype=np.float32) if 0 in lead else None


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
    branch, residual = check_inputs(w, branch, residual)
    dt = validate.float_dtype("dtype", dtype)
    # An MLX input (bfloat16 included, which numpy has no type for) is read as the fused tail reads it.
    branch, residual = validate.float_array("branch", branch), validate.float_array("residual", residual)
    wo, norm, gate, up, down = w.host_arrays(dt)
    return tail_np(wo, w.wo.fold, norm, gate, up, down, w.eps, branch.astype(dt), residual.astype(dt))


def to_mx(a: Any) -> mx.array:
    """An activation as a float32 ``mx.array`` (numpy is copied in; MLX is cast, lazily)."""
    if isinstance(a, mx.array):
        if not (mx.issubdtype(a.dtype, mx.floating) or mx.issubdtype(a.dtype, mx.integer)):
            raise ValueError(f"a: must be an array of real numbers, got {validate.describe(a)}")
        return a.astype(mx.float32)
    return mx.array(validate.float_array("a", a).astype(np.float32))


def unfused_tail(w: TailWeights, branch: Any, residual: Any) -> np.ndarray:
    """The engine before the fusion: TWO submissions, two waits.

    1. ``wo`` (with its rotation) as one MLX submission; its result read back (wait 1).
    2. On the host, in float32: ``h = residual + projected``, ``rms_norm(h)``.
    3. The SwiGLU FFN as a second MLX submission; read back (wait 2).
    4. On the host: ``h + ffn``.

    Returns float32 numpy with the inputs' batch axes. Refuses nothing: this is the path
    every layer can take.
    """
    branch, residual = check_inputs(w, branch, residual)
    empty = _empty_batch(branch, w.shape[0])
    if empty is not None:
        return empty
    projected = np.asarray(w.wo.apply(to_mx(branch)))  # submission 1, and its wait
    h = validate.float_array("residual", residual).astype(np.float32) + projected
    normed = rms_norm_np(h, w.ffn_norm, w.eps).astype(np.float32)
    nx = mx.array(normed)
    g = w.gate.apply(nx)
    ffn = np.asarray(w.down.apply((g * mx.sigmoid(g)) * w.up.apply(nx)))  # submission 2, and its wait
    return h + ffn


@dataclass(frozen=True)
class TailLaunch:
    """What every fused backend needs, assembled in ONE place (frink-models' ``attn_tail_launch``).

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
        raise ValueError(f"w: must be TailWeights, got {validate.describe(w)}")
    kernels_enabled = validate.flag("kernels_enabled", kernels_enabled)
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
    ``return_backend=True`` you get ``(out, name)`` to see which it picked). Metal runs
    the three launches in one submission, as frink-models does; CUDA runs the tail as ONE
    launch (``workbench.one_launch``: the three bodies as phases between grid barriers),
    or the three where that launch's shared memory does not fit.

    Raises :class:`TailRefused` (with every reason) for a layer the rules refuse, before
    anything is built or run; ``kernels_enabled=False`` is the engine's first rule (the
    engine's dense kernels switched off), so it refuses every layer.
    """
    name = backends.resolve_backend(validate.one_of("backend", backend, backends.BACKENDS))
    return_backend = validate.flag("return_backend", return_backend)
    branch, residual = check_inputs(w, branch, residual)
    launch = tail_launch(w, kernels_enabled=kernels_enabled)
    empty = _empty_batch(branch, w.shape[0])
    if empty is not None:
        result = empty
    elif name == "graph":
        out = tail_graph(launch, to_mx(branch), to_mx(residual))
        mx.eval(out)  # the one submission
        result = np.asarray(out)  # already evaluated: reading it waits on nothing more
    elif name == "cuda":
        result = one_launch.run_cuda_tail(launch, branch, residual)
    else:
        result = kernel_launch.run_kernel_tail(name, launch, branch, residual)
    return (result, name) if return_backend else result


# ---------------------------------------------------------------------------------------
# Names that moved to their own modules
# ---------------------------------------------------------------------------------------

#: Where each name that used to live in this module lives now.
_MOVED: dict[str, str] = {
    **dict.fromkeys(("SEED_TOL", "SEED_SHAPE", "SEED_EPS", "SEED_LCG_START", "lcg_stream", "SeedArrays",
                     "seed_arrays", "SeedCase", "seed_case"), "workbench.frink_case"),
    **dict.fromkeys(("scaled_error", "Comparison", "compare"), "workbench.comparison"),
    **dict.fromkeys(("WaitCount", "count_waits"), "workbench.wait_measurement"),
    **dict.fromkeys(("FAULTS", "faulty_fused_tail", "VERDICTS", "verdict", "ThreeWay", "three_way",
                     "three_way_table"), "workbench.three_way"),
    "BONSAI_SHAPE": "workbench.model",
}

__getattr__ = forwarder(__name__, _MOVED)
