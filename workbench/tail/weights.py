"""One layer's tail weights, and the one recipe random cases are drawn by.

:class:`TailWeights` holds ``wo`` (usually carrying a block-Hadamard fold), the FFN's
RMS-norm weight, ``gate`` / ``up`` / ``down`` and ``eps``, and remembers the model layer it
stands for, so the refusal rules can read that layer's config. Random cases follow
:func:`case_recipe` (one scale per tensor, so activations stay O(1) at every shape), which
the batched sweeps of ``workbench.studies`` follow too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.fold import hadamard
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import DENSE_DTYPES, WeightMatrix
from workbench.models.config import ModelConfig
from workbench.validate import describe, number, one_of

#: The RMS norm's epsilon when none is given: 1e-6, Qwen3's ``rms_norm_eps`` and the
#: value frink-models' test uses (``workbench.tail.frink_case.SEED_EPS``).
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
        """One draw from ``rng`` (numpy's ``uniform`` in float64, then float32), with ``lead`` batch axes.

        Drawn :data:`DRAW_CHUNK` values at a time into the float32 result: ``uniform``
        takes its values from the stream in order, so the chunks are the one draw's values,
        without its float64 array (713 MB for one of Bonsai-27B's FFN matrices)."""
        shape = lead + self.shape
        if self.signs:
            v = rng.uniform(-self.half_width, self.half_width, size=shape)
            return np.where(v < 0, np.float32(-1.0), np.float32(1.0))
        out = np.empty(shape, dtype=np.float32)
        flat = out.reshape(-1)
        # uniform(low, high) is low + (high - low) * random(), value by value from one stream:
        # the same arithmetic here, on one scratch array reused for every chunk (a fresh array
        # a chunk made the allocator map, and the kernel fault in, 8 MB at a time).
        low, width = -self.half_width, 2.0 * self.half_width
        scratch = np.empty(min(DRAW_CHUNK, flat.size), dtype=np.float64)
        for o in range(0, flat.size, DRAW_CHUNK):
            v = scratch[: min(DRAW_CHUNK, flat.size - o)]
            rng.random(out=v)
            v *= width
            v += low
            if self.centre:
                v += self.centre
            flat[o : o + v.size] = v
        return out


#: Values a :meth:`Draw.draw` takes from its generator at a time (8 MB of float64 scratch).
DRAW_CHUNK = 1 << 20


def case_recipe(hidden: int, branch: int, ffn: int) -> tuple[Draw, ...]:
    """The distributions of a random tail case, in draw order; every random case follows it.

    ``wo``, ``gate``, ``up``, ``down``: ``U(-a, a)`` with ``a = sqrt(3 / fan_in)``, variance
    ``1 / fan_in``, so activations stay O(1) at every shape as in a trained model (at
    Bonsai-27B's shape, frink-models' test's unscaled ``U(-0.5, 0.5)`` would put FFN outputs
    in the thousands and turn the tolerance into a purely relative one); ``ffn_norm``:
    ``1 + U(-0.25, 0.25)``, as that test draws it; ``branch`` and ``residual``: ``U(-1, 1)``
    (llama.cpp's test inputs); ``signs``: a fold's ``D`` over the branch.

    :meth:`TailWeights.random` and :func:`random_inputs` draw from it one tensor at a time
    (:meth:`Draw.draw`); ``workbench.studies.sweeps`` draws the same distributions for a block of
    cases at once, from float32 uniforms (a different stream, the same recipe).
    """
    hidden = validate.integer("hidden", hidden, minimum=1)
    branch = validate.integer("branch", branch, minimum=1)
    ffn = validate.integer("ffn", ffn, minimum=1)

    def mat(name: str, rows: int, cols: int) -> Draw:
        return Draw(name, (rows, cols), math.sqrt(3.0 / cols))

    return (
        mat("wo", hidden, branch),
        mat("gate", ffn, hidden),
        mat("up", ffn, hidden),
        mat("down", hidden, ffn),
        Draw("ffn_norm", (hidden,), 0.25, centre=1.0),
        Draw("branch", (branch,), 1.0),
        Draw("residual", (hidden,), 1.0),
        Draw("signs", (branch,), 1.0, signs=True),
    )


# ---------------------------------------------------------------------------------------
# The weights
# ---------------------------------------------------------------------------------------


#: The host copies' cache keys (``np.dtype.str``) of the float dtypes, by the forms a caller
#: passes (``np.float64``, ``np.dtype("float64")``), so a repeated call finds its copies with
#: one dictionary lookup.
_HOST_DTYPES: dict[Any, str] = {
    k: np.dtype(t).str for t in (np.float16, np.float32, np.float64) for k in (t, np.dtype(t))
}


#: How a checkpoint stores an RMSNorm weight: ``"plain"`` multiplies by ``w`` (Llama,
#: Qwen3, mlx-lm's converted checkpoints), ``"zero_centred"`` by ``1 + w`` (Hugging Face
#: Qwen3-Next and Qwen3.5 checkpoints; mlx-lm adds the 1 when it converts them).
NORM_CONVENTIONS = ("plain", "zero_centred")


@dataclass(frozen=True, eq=False)
class TailWeights:
    """The weights of one attention layer's tail; frozen, its arrays read-only.

    ``wo`` [hidden, branch] (usually folded), ``gate`` / ``up`` [ffn, hidden], ``down``
    [hidden, ffn] as :class:`~workbench.fold.weights.WeightMatrix`; ``ffn_norm`` [hidden]
    float32, the EFFECTIVE norm weight (``x * rsqrt(mean x^2 + eps) * ffn_norm``); ``eps``.
    ``branch`` is wo's input: the attention output after any output gate (Qwen3-Next /
    Qwen3.5 multiply by ``sigmoid(gate)`` before ``wo``).

    ``norm_convention`` records how the source stored the norm weight: ``"plain"`` (it
    is the effective weight) or ``"zero_centred"`` (the source stored ``w`` and computes
    ``x * (1 + w)``; ``ffn_norm`` here is already ``1 + w``, see :meth:`from_arrays`).

    ``config`` / ``layer``: the model layer these weights stand for, which is what the
    refusal rules are asked about. ``None`` means a plain GQA layer with a dense SwiGLU
    FFN (``workbench.models.config``'s synthetic config), which nothing refuses.

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
        norm = validate.as_float32("ffn_norm", norm)  # our own copy: the caller's array stays theirs
        norm.flags.writeable = False
        object.__setattr__(self, "ffn_norm", norm)
        object.__setattr__(self, "eps", number("eps", self.eps, minimum=0, exclusive_minimum=True))
        one_of("norm_convention", self.norm_convention, NORM_CONVENTIONS)
        _check_config(self.config)
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
        """``(hidden, branch, ffn)`` (kept from construction: the oracle reads it on every call)."""
        if "shape" not in self._host:
            hidden, branch = self.wo.shape
            self._host["shape"] = (hidden, branch, self.gate.shape[0])
        return self._host["shape"]

    @property
    def nbytes(self) -> int:
        """Bytes of weights one tail streams (the four matrices and the norm)."""
        return self.wo.nbytes + self.gate.nbytes + self.up.nbytes + self.down.nbytes + self.ffn_norm.nbytes

    def __repr__(self) -> str:
        h, b, f = self.shape
        where = (
            "plain GQA layer" if self.config is None else f"{getattr(self.config, 'name', 'model')} layer {self.layer}"
        )
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
        :func:`host_tail` reads the float64 copies in every dtype (one set of host copies).
        """
        hit = _HOST_DTYPES.get(dtype) if isinstance(dtype, (type, np.dtype)) else None
        if hit is not None and hit in self._host:  # the oracle's per-call lookup: no dtype checks again
            return self._host[hit]
        dt = np.dtype(dtype)
        if not np.issubdtype(dt, np.floating):
            raise ValueError(
                f"dtype must be a numpy float dtype (float64 for the truth, float32 for the host); got {dt}"
            )
        key = dt.str
        if key not in self._host:
            # float64: the matrix's own cached, read-only copy (a second one would hold every
            # matrix twice: 2.4 GB more at Bonsai-27B's shape); float32: dense's fresh copy.
            mats = tuple(
                m.dense(np.float64) if dt == np.float64 else m.dense(np.float32).astype(dt, copy=False)
                for m in (self.wo, self.gate, self.up, self.down)
            )
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
    ) -> TailWeights:
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
        if not (isinstance(dtype, str) and dtype in DENSE_DTYPES):
            raise ValueError(f"dtype must be one of {tuple(DENSE_DTYPES)}; got {describe(dtype)}")
        _check_quantize(quantize)
        _check_config(config)
        mdt = DENSE_DTYPES[dtype]
        eps = _eps_for(eps, config)
        one_of("norm_convention", norm_convention, NORM_CONVENTIONS)
        norm = validate.as_float32("ffn_norm", ffn_norm, copy=False)  # the constructor copies it
        if norm_convention == "zero_centred":
            norm = norm + np.float32(1.0)

        def mat(name: str, a: Any, f: HadamardFold | None = None) -> WeightMatrix:
            if isinstance(a, mx.array) and a.dtype == mdt and a.ndim == 2 and 0 not in a.shape:
                base = a  # already stored as asked (MLX arrays are immutable, so it can be shared)
            else:
                arr = validate.as_float32(name, a, copy=False)  # mx.array copies it
                if arr.ndim != 2 or 0 in arr.shape:
                    raise ValueError(f"{name}: must be a non-empty 2-D [out, in] array, got shape {arr.shape}")
                base = mx.array(arr).astype(mdt)
                mx.eval(base)  # now, so MLX's float32 copy of ``arr`` is freed before the next matrix's
            if quantize is not None:
                return WeightMatrix.quantize(base, fold=f, **quantize)
            m = WeightMatrix(base)
            return m.fold_hadamard(f) if f is not None else m

        return cls(
            mat("wo", wo, fold),
            norm,
            mat("gate", gate),
            mat("up", up),
            mat("down", down),
            eps=eps,
            config=config,
            layer=layer,
            norm_convention=norm_convention,
        )

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
    ) -> TailWeights:
        """Random tail weights, seeded, drawn by :func:`case_recipe` (wo, gate, up, down,
        ffn_norm, in that order, from one generator).

        ``fold_block``: fold a random-sign fold of that block into ``wo`` at ``fold_site``
        (INPUT rotates the branch, width ``branch``; OUTPUT rotates wo's output, width
        ``hidden``); its signs and permutation come from the same generator, after the weights.
        """
        for name, v in (("hidden", hidden), ("branch", branch), ("ffn", ffn)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"{name} must be a positive int; got {describe(v)}")
        if not isinstance(fold_site, FoldSite):
            raise ValueError(f"fold_site: must be FoldSite.INPUT or FoldSite.OUTPUT; got {describe(fold_site)}")
        if fold_block is not None:
            try:
                hadamard.factor_block(fold_block)
            except ValueError as e:
                raise ValueError(f"fold_block: must be None or a fold's block size ({e})") from None
        validate.flag("fold_permute", fold_permute)
        _check_quantize(quantize)
        _check_config(config)
        # The float32 weights alone, a bound from below (the draws hold more for a moment):
        # refused only when even the result cannot fit, as a typo's 10**9 cannot.
        validate.within_memory(
            "hidden",
            4 * int(hidden) * (int(branch) + 3 * int(ffn) + 1),
            f"random weights of shape ({hidden}, {branch}, {ffn}) in float32",
        )
        if not (isinstance(dtype, str) and dtype in DENSE_DTYPES):
            raise ValueError(f"dtype must be one of {tuple(DENSE_DTYPES)}; got {describe(dtype)}")
        rng = np.random.default_rng(validate.seed("seed", seed))
        recipe = {d.name: d for d in case_recipe(hidden, branch, ffn)}

        def stored(name: str) -> mx.array:
            # Each matrix goes to MLX in the stored dtype as soon as it is drawn, so one float32
            # draw is held at a time (Bonsai-27B's four: 1.2 GB); from_arrays keeps it as it is.
            a = mx.array(recipe[name].draw(rng)).astype(DENSE_DTYPES[dtype])
            mx.eval(a)
            return a

        wo, gate, up, down = (stored(n) for n in ("wo", "gate", "up", "down"))
        ffn_norm = recipe["ffn_norm"].draw(rng)
        fold = None
        if fold_block is not None:
            width = branch if fold_site is FoldSite.INPUT else hidden
            fold = HadamardFold.random(
                width, fold_block, seed=int(rng.integers(2**31)), permute=fold_permute, site=fold_site
            )
        return cls.from_arrays(
            wo, ffn_norm, gate, up, down, eps=eps, fold=fold, dtype=dtype, quantize=quantize, config=config, layer=layer
        )

    @classmethod
    def for_layer(cls, config: Any, layer: int, *, seed: int, **kwargs: Any) -> TailWeights:
        """Random weights of the shapes of ``config``'s layer ``layer``, carrying that layer.

        ``hidden`` is the model's, ``branch`` = q heads x head_dim (hidden for a layer
        that is not attention, which the rules refuse anyway), ``ffn`` the layer's FFN
        width (hidden where it has none). The refusal rules are then asked about THAT
        layer, so an output bias, a scale companion, a post-attention norm ... refuse.
        ``kwargs`` go to :meth:`random` (``fold_block``, ``dtype``, ...).
        """
        if config is None:
            raise ValueError("config: must be a ModelConfig (workbench.models.load_model(name)), got None")
        _check_config(config)
        lc = config.layer(layer)
        hidden = int(config.hidden_size)
        branch = lc.num_q_heads * lc.head_dim or hidden
        ffn = lc.ffn_dim or hidden
        return cls.random(hidden, branch, ffn, seed=seed, config=config, layer=layer, **kwargs)


#: The keyword arguments of ``WeightMatrix.quantize`` that a ``quantize=`` dict may hold.
_QUANTIZE_KEYS = ("mode", "bits", "group_size")


def _check_quantize(quantize: Any) -> None:
    """``quantize`` is None or a dict of :data:`_QUANTIZE_KEYS` (their values are checked by
    ``WeightMatrix.quantize``); another key would escape as a ``TypeError`` from its call."""
    if quantize is None:
        return
    if not isinstance(quantize, dict) or not set(quantize) <= set(_QUANTIZE_KEYS):
        raise ValueError(f"quantize must be None or a dict of mode/bits/group_size; got {describe(quantize)}")


def _check_config(config: Any) -> None:
    """``config`` is None or a :class:`ModelConfig`: a model's name or a raw dict here would
    fail later, inside the refusal rules, as an ``AttributeError`` naming nothing."""
    if config is not None and not isinstance(config, ModelConfig):
        raise ValueError(
            f"config: must be a ModelConfig (workbench.models.load_model(name)) or None, got {describe(config)}"
        )


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
        lead = tuple(
            validate.integer("batch", b, minimum=0)
            for b in validate.sequence("batch", batch, what="ints", non_empty=False)
        )
    hidden, bdim, _ = w.shape
    validate.within_memory("batch", 8 * math.prod(lead) * (hidden + bdim), f"a batch of {lead} inputs")
    rng = np.random.default_rng(validate.seed("seed", seed))
    recipe = {d.name: d for d in case_recipe(*w.shape)}
    return recipe["branch"].draw(rng, lead), recipe["residual"].draw(rng, lead)
