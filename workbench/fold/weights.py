"""``WeightMatrix``: a [out, in] weight, dense or MLX-quantized, with an optional fold.

The host semantics (``apply``) are frink-models' ``WeightMatrix::apply``: for a fold at the
INPUT site, rotate the input then multiply by the stored ``W R^T``; at the OUTPUT site,
multiply by the stored ``R W`` then rotate back. ``launch_parts`` hands a kernel the two
pieces separately, as frink-models' launch builder takes them, because a kernel applies the
rotation itself (and must not forget to: a skipped rotation is invisible without a fold).

The stored base is an ``mx.array`` (so bf16 stays bf16); numpy inputs get the numpy
oracle, computed in the input's dtype, so float64 in is float64 arithmetic throughout.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import mlx.core as mx
import numpy as np

from workbench import backends, validate
from workbench.fold import affine_codes, formats
from workbench.fold.rotation import FoldSite, HadamardFold

if TYPE_CHECKING:
    import pandas as pd

ArrayT = TypeVar("ArrayT", np.ndarray, mx.array)

#: Dense dtypes a base may have: the dense formats of :data:`formats.FORMATS`, as MLX dtypes.
DENSE_DTYPES: dict[str, mx.Dtype] = {f.name: getattr(mx, f.name) for f in formats.FORMATS if not f.quantized}

#: What ``mx.quantize`` serves that the workbench accepts: mode -> (bits allowed, group sizes allowed).
#: affine: 2, 4 and 8 bit, groups 32/64/128 (2-bit for PrismML's Hadamard packs, which mlx-lm
#: reads at group 128); the microscaling formats have fixed bits and groups
#: (MLX 0.32: mxfp4 4-bit g32, nvfp4 4-bit g16, mxfp8 8-bit g32).
QUANT_MODES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "affine": ((2, 4, 8), (32, 64, 128)),
    "mxfp4": ((4,), (32,)),
    "nvfp4": ((4,), (16,)),
    "mxfp8": ((8,), (32,)),
}


@dataclass(frozen=True)
class QuantSpec:
    """How a quantized base was made (the arguments of ``mx.quantize``)."""

    mode: str
    bits: int
    group_size: int

    def __str__(self) -> str:
        return (
            f"{self.mode}{self.bits}-g{self.group_size}" if self.mode == "affine" else f"{self.mode}-g{self.group_size}"
        )

    @property
    def format(self) -> formats.Format:
        """The :class:`~workbench.fold.formats.Format` this spec makes (whatever its group size)."""
        return formats.by_mode(self.mode, self.bits)

    def as_quantize(self) -> dict[str, Any]:
        """The ``quantize=`` argument that makes this format (``TailWeights.random``,
        ``mx.quantize``'s keyword arguments): ``{"mode", "bits", "group_size"}``."""
        return {"mode": self.mode, "bits": self.bits, "group_size": self.group_size}


#: The quantized formats of :data:`formats.FORMATS`, by name, as ``mx.quantize`` makes them
#: at their default group size: sweeps take these names, notebook 01 labels them, and every
#: entry is within :data:`QUANT_MODES` (a test holds it).
QUANT_FORMATS: dict[str, QuantSpec] = {
    f.name: QuantSpec(f.mode, f.bits, f.group_size) for f in formats.FORMATS if f.quantized
}


def check_quant_spec(mode: str, bits: int, group_size: int) -> QuantSpec:
    """Validate a quantization request; ``ValueError`` names the bad parameter and what is allowed."""
    validate.one_of("mode", mode, sorted(QUANT_MODES))
    bits_ok, groups_ok = QUANT_MODES[mode]
    # Integers only (numpy's too): 4.0 or True as a bit count is a computed value gone wrong.
    if validate.integer("bits", bits) not in bits_ok:
        raise ValueError(f"bits: for mode {mode!r} must be one of {bits_ok}, got {bits!r}")
    if validate.integer("group_size", group_size) not in groups_ok:
        raise ValueError(f"group_size: for mode {mode!r} must be one of {groups_ok}, got {group_size!r}")
    return QuantSpec(mode, int(bits), int(group_size))


@dataclass(frozen=True)
class QuantizedBase:
    """An MLX-quantized [out, in] matrix: the packed weights, scales, biases (affine only)."""

    w: mx.array
    scales: mx.array
    biases: mx.array | None
    spec: QuantSpec
    shape: tuple[int, int]

    def dequantize(self) -> mx.array:
        """The matrix ``mx.quantized_matmul`` multiplies by, float32, NOT rounded to the scales' dtype.

        ``mx.quantized_matmul`` forms ``scale * q + bias`` in float32; ``mx.dequantize`` of a
        bf16/f16-scaled base returns it rounded to bf16/f16, which put the host oracle 1.2e-2
        off the fused tail for bf16 affine 4-bit weights (sixty times frink-models' tolerance).
        Casting the scales and biases to float32 first gives the map itself (exact: a bf16
        scale times a 4- or 8-bit integer needs at most 16 significant bits). The fp4/fp8
        formats' scales are uint8 codes (E8M0 / E4M3) and stay as they are.
        """
        scales = self.scales if self.scales.dtype == mx.uint8 else self.scales.astype(mx.float32)
        biases = None if self.biases is None else self.biases.astype(mx.float32)
        return mx.dequantize(
            self.w, scales, biases, group_size=self.spec.group_size, bits=self.spec.bits, mode=self.spec.mode
        )

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes + self.scales.nbytes + (self.biases.nbytes if self.biases is not None else 0))


def _as_dense_base(base: Any, name: str = "base") -> mx.array:
    """``base`` as a 2-D MLX array in a dense dtype; errors name ``name`` (``w`` when quantizing)."""
    if isinstance(base, mx.array):
        arr = base
    else:
        try:
            a = np.asarray(base)
        except Exception:  # a ragged list
            a = np.asarray(None)
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(
                f"{name}: must be a float array (float32, float16 or bfloat16), got {validate.describe(base)}"
            )
        if a.dtype.itemsize > 4:
            a = validate.as_float32(name, a)  # the engine's weights are at most float32
        arr = mx.array(a)
    if arr.ndim != 2:
        raise ValueError(f"{name}: must be 2-D [out, in], got shape {tuple(arr.shape)}")
    if arr.dtype not in DENSE_DTYPES.values():
        raise ValueError(f"{name}: its dtype must be one of {sorted(DENSE_DTYPES)}, got {arr.dtype}")
    if 0 in arr.shape:
        raise ValueError(f"{name}: must not be empty, got shape {tuple(arr.shape)}")
    return arr


def _check_finite_for_quantize(base: Any) -> None:
    """Refuse a weight that is not finite before quantizing it.

    ``mx.quantize`` silently turns a NaN or Inf weight into a finite code (and the oracle,
    reading the same dequantized weights, agrees), so the damage would be invisible; a
    dense matrix keeps its NaN and the tails propagate it, which is why only quantizing
    checks.
    """
    finite = np.isfinite(np.array(base.astype(mx.float32)))
    if not finite.all():
        r, c = (int(i) for i in np.argwhere(~finite)[0])
        bad = float(np.array(base[r, c].astype(mx.float32)))
        raise ValueError(
            f"w: must be finite to quantize (mx.quantize would replace it with a finite code), got "
            f"w[{r}, {c}] = {bad!r} ({int((~finite).sum())} non-finite in all)"
        )


#: Elements converted at a time by :func:`host_copy`: a few MB of scratch, so a Bonsai-size
#: matrix goes to float64 without a float32 copy of it held in between.
HOST_CHUNK = 1 << 20


def _mapped_empty(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array in its own anonymous memory map, not asked to be huge pages.

    numpy asks the kernel for transparent huge pages on every large array
    (``madvise(MADV_HUGEPAGE)``); where free memory is fragmented the kernel then compacts
    memory on each 2 MB fault, in the faulting thread. For the float64 host copies, written
    once a chunk at a time, that took 6.9 s of processor time at Bonsai-27B's shape (2.6 GB)
    against 1.6 s with ordinary pages (2 shared cores, transparent huge pages ``madvise``).
    Small arrays take numpy's own allocation.
    """
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes < 1 << 24:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


def host_copy(base: mx.array, dtype: Any) -> np.ndarray:
    """A 2-D bfloat16 or float32 ``base`` as a new numpy array in the float ``dtype``, exactly.

    MLX's buffer is read in place (``np.asarray``; bfloat16 through a ``uint16`` view, as
    numpy has no bfloat16) and converted on the host in row chunks of about
    :data:`HOST_CHUNK` elements: bfloat16 is the high half of a float32, so its bits shifted
    left by 16 ARE the float32 (the conversion MLX makes, every bit pattern alike), and no
    full-size float32 copy is made on the way to float64 (at Bonsai-27B's shape a float32
    copy of the FFN's matrices alone is 1.1 GB, and MLX's CPU cast writes it several times
    slower than numpy copies).
    """
    rows, cols = (int(n) for n in base.shape)
    if base.dtype == mx.float32:
        return np.array(np.asarray(base), dtype=dtype)
    if base.dtype != mx.bfloat16:
        raise ValueError(f"base: must be a bfloat16 or float32 mx.array, got {validate.describe(base)}")
    bits = np.asarray(mx.view(base, mx.uint16))
    out = _mapped_empty((rows, cols), np.dtype(dtype))
    step = max(1, HOST_CHUNK // max(cols, 1))
    scratch = np.empty((min(step, rows), cols), dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # a signalling NaN, widened, raises the flag; MLX's cast does not warn
        for r in range(0, rows, step):
            k = min(step, rows - r)
            np.left_shift(bits[r : r + k], 16, out=scratch[:k], dtype=np.uint32)
            out[r : r + k] = scratch[:k].view(np.float32)
    return out


def _codes_float64(q: QuantizedBase) -> np.ndarray:
    """A 2-bit affine base's float64 weights from its stored codes, scales and biases
    (:mod:`workbench.fold.affine_codes`, not ``mx.dequantize``): the truth of the Hadamard
    packs' format, which the workbench added for them, is read from what the pack stores."""
    scales, biases = (
        np.asarray(a.astype(mx.float32)) if a.dtype == mx.bfloat16 else np.asarray(a) for a in (q.scales, q.biases)
    )
    return affine_codes.dequantize_float64(
        np.asarray(q.w), scales, biases, bits=q.spec.bits, group_size=q.spec.group_size
    )


def _dtype_name(dt: mx.Dtype) -> str:
    return {v: k for k, v in DENSE_DTYPES.items()}[dt]


def cuda_quantized_rows_wrong(in_dim: int, group_size: int, rows: int) -> bool:
    """Whether MLX 0.32.4's CUDA ``quantized_matmul`` is known to give a wrong product here.

    With the in dimension one group long (``in_dim == group_size``) and more than one row
    of x, the CUDA product comes out wrong (100% off, sometimes NaN) in every layout, where
    one row or a longer in dimension is right (``docs/GPU.md`` has what was tried). Groups of
    64 are known wrong and larger ones untried, so every group size from 64 up is treated
    alike. :func:`quantized_matmul` runs such a product on MLX's CPU stream when MLX's
    default device is a CUDA GPU: a right answer at a CPU's speed, for shapes (a 64-wide
    matrix) no real model has.
    """
    return rows > 1 and in_dim == group_size and group_size >= 64


def quantized_matmul(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array | None,
    *,
    group_size: int,
    bits: int,
    mode: str = "affine",
) -> mx.array:
    """``mx.quantized_matmul(x, w, scales, biases, transpose=True, ...)`` (x at least 2-D), on
    MLX's CPU stream where MLX's CUDA product is known to be wrong
    (:func:`cuda_quantized_rows_wrong`), on the default device otherwise. Every quantized
    product of the workbench's graphs goes through here, so the rule is kept in one place;
    the in dimension is compared first, so a real model's product pays one comparison."""
    in_dim = x.shape[-1]
    wrong = (
        in_dim == group_size
        and cuda_quantized_rows_wrong(in_dim, group_size, math.prod(x.shape[:-1]))
        and backends.cuda_is_default()
    )
    return mx.quantized_matmul(
        x,
        w,
        scales,
        biases,
        transpose=True,
        group_size=group_size,
        bits=bits,
        mode=mode,
        stream=mx.cpu if wrong else None,
    )


class WeightMatrix:
    """A [out, in] weight: dense (f32/f16/bf16) or MLX-quantized, optionally folded.

    ``base`` is what is STORED (for a folded matrix, ``W R^T`` or ``R W``); ``fold`` is
    the rotation the host applies around it. ``apply`` is the linear map either way.
    """

    __slots__ = ("_base", "_fold", "_np64")

    def __init__(self, base: Any, fold: HadamardFold | None = None) -> None:
        self._base: mx.array | QuantizedBase = base if isinstance(base, QuantizedBase) else _as_dense_base(base)
        if fold is not None:
            if not isinstance(fold, HadamardFold):
                raise ValueError(f"fold: must be a HadamardFold or None, got {validate.describe(fold)}")
            out_dim, in_dim = self.shape
            width = in_dim if fold.site is FoldSite.INPUT else out_dim
            try:
                fold.check_width(width)
            except ValueError as e:
                side = "in (columns)" if fold.site is FoldSite.INPUT else "out (rows)"
                raise ValueError(
                    f"fold does not fit this matrix: a fold at site {fold.site.name} rotates the {side} "
                    f"dimension {width} of a {out_dim}x{in_dim} matrix: {e}"
                ) from None
        self._fold = fold
        self._np64: np.ndarray | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # A value object: its base and fold are set once, in __init__; only the float64
        # host copy is filled in later (read-only), so a cache can never go stale.
        if name != "_np64" and hasattr(self, name):
            raise AttributeError(f"WeightMatrix is immutable: {name} cannot be reassigned")
        object.__setattr__(self, name, value)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def quantize(
        cls,
        w: Any,
        *,
        mode: str = "affine",
        bits: int = 4,
        group_size: int = 64,
        fold: HadamardFold | None = None,
    ) -> WeightMatrix:
        """Quantize ``w`` with ``mx.quantize``; with ``fold``, fold FIRST, then quantize.

        That is the order an engine stores pre-rotated quantized weights in, and the only
        one in which the fold helps: the rotation spreads outlier columns before the
        grouped scales are chosen.
        """
        spec = check_quant_spec(mode, bits, group_size)
        unfolded = cls(_as_dense_base(w, "w"))
        _check_finite_for_quantize(unfolded._base)
        dense = unfolded.fold_hadamard(fold) if fold is not None else unfolded
        base = dense._base
        assert isinstance(base, mx.array)
        out_dim, in_dim = base.shape
        if in_dim % spec.group_size != 0:
            raise ValueError(
                f"group_size: must divide the input dimension ({in_dim}) to quantize, got {spec.group_size}"
            )
        parts = mx.quantize(base, **spec.as_quantize())
        wq, scales = parts[0], parts[1]
        biases = parts[2] if len(parts) > 2 else None
        mx.eval(wq, scales, *([biases] if biases is not None else []))
        return cls(QuantizedBase(wq, scales, biases, spec, (int(out_dim), int(in_dim))), fold)

    def fold_hadamard(self, fold: HadamardFold) -> WeightMatrix:
        """A new matrix, the same linear map, with ``fold`` folded in.

        INPUT: base becomes ``W R^T``; OUTPUT: ``R W``. Computed in float64 and stored in
        the base's dtype. A quantized matrix is refused: fold before quantizing
        (``WeightMatrix.quantize(w, fold=...)``), since re-quantizing would change the map.
        """
        if not isinstance(fold, HadamardFold):
            raise ValueError(f"fold: must be a HadamardFold, got {validate.describe(fold)}")
        if self._fold is not None:
            raise ValueError("this matrix is already folded; fold the unfolded matrix instead")
        if isinstance(self._base, QuantizedBase):
            raise ValueError(
                "cannot fold a quantized matrix (re-quantizing would change the map): "
                "use WeightMatrix.quantize(w, fold=...) to fold before quantizing"
            )
        w = self.dense(np.float64)
        WeightMatrix(self._base, fold)  # validates the fold against this shape, with the message above
        folded = np.empty(w.shape, dtype=np.float32)
        # INPUT: rows of W R^T are R w_row, (W R^T)[i] = R W[i]; OUTPUT: R W rotates each column.
        src, dst = (w, folded) if fold.site is FoldSite.INPUT else (w.T, folded.T)
        # A chunk of rows at a time, straight into the float32 result: the float64 transform
        # gives a row the same bits in any batch (hadamard.ROW_GROUP), and the whole matrix's
        # float64 temporaries (three, 0.75 GB at Bonsai-27B's wo) are never made.
        step = max(1, HOST_CHUNK // max(src.shape[1], 1))
        for r in range(0, src.shape[0], step):
            dst[r : r + step] = fold.rotate(src[r : r + step])
        return WeightMatrix(mx.array(folded).astype(self._base.dtype), fold)

    # -- description --------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        if isinstance(self._base, QuantizedBase):
            return self._base.shape
        return (int(self._base.shape[0]), int(self._base.shape[1]))

    @property
    def fold(self) -> HadamardFold | None:
        return self._fold

    @property
    def quantization(self) -> QuantSpec | None:
        return self._base.spec if isinstance(self._base, QuantizedBase) else None

    @property
    def dtype(self) -> str:
        """``float32`` / ``float16`` / ``bfloat16``, or the quantization (e.g. ``affine4-g64``)."""
        if isinstance(self._base, QuantizedBase):
            return str(self._base.spec)
        return _dtype_name(self._base.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes a kernel streams for this matrix (packed weights, scales and biases included)."""
        return self._base.nbytes if isinstance(self._base, QuantizedBase) else int(self._base.nbytes)

    def launch_parts(self) -> tuple[mx.array | QuantizedBase, HadamardFold | None]:
        """``(base, fold)``, as a kernel launch takes them: the stored base and the rotation to apply."""
        return self._base, self._fold

    def dense(self, dtype: Any = np.float32) -> np.ndarray:
        """The stored base, dequantized, as numpy (float32 by default; float64 for oracles)."""
        dtype = validate.float_dtype("dtype", dtype)
        if dtype == np.float64 and self._np64 is not None:
            return self._np64
        if dtype == np.float64 and isinstance(self._base, QuantizedBase) and self._base.spec.bits == 2:
            out = _codes_float64(self._base)
            out.flags.writeable = False
            self._np64 = out
            return out
        base = self._base.dequantize() if isinstance(self._base, QuantizedBase) else self._base
        if base.dtype in (mx.bfloat16, mx.float32):
            out = host_copy(base, dtype)
        else:  # float16: MLX's own cast (numpy's differs from it on signalling NaNs, which MLX quiets)
            f32 = base.astype(mx.float32)
            out = np.asarray(f32).astype(dtype) if dtype != np.float32 else np.array(f32)
        if dtype == np.float64:
            out.flags.writeable = False
            self._np64 = out
        return out

    def linear_map(self) -> np.ndarray:
        """The map ``apply`` computes, as a dense float64 [out, in] matrix (the fold undone)."""
        w = self.dense(np.float64)
        if self._fold is None:
            return w
        if self._fold.site is FoldSite.INPUT:
            return self._fold.unrotate(w)  # W' R = (R^T W'^T)^T; row-wise: R^T applied to each row
        return self._fold.unrotate(w.T).T  # R^T W'

    # -- the map --------------------------------------------------------------------------

    def matvec_base(self, x: ArrayT) -> ArrayT:
        """``base @ x`` along the last axis, no rotation: what a kernel's matvec computes.

        numpy: in x's float dtype (float64 for the oracle). MLX: lazy; a bf16/f16 base is
        promoted so the product accumulates in float32 (activations are float32).
        """
        if isinstance(x, mx.array):
            in_dim = self.shape[1]
            if not (mx.issubdtype(x.dtype, mx.floating) or mx.issubdtype(x.dtype, mx.integer)):
                raise ValueError(f"x: must be an array of real numbers, got {validate.describe(x)}")
            if x.ndim == 0 or x.shape[-1] != in_dim:
                raise ValueError(
                    f"x: its last axis must be {in_dim} (the matrix's in dimension), got shape {tuple(x.shape)}"
                )
            if isinstance(self._base, QuantizedBase):
                q = self._base
                # A 1-D vector goes in as one row: MLX 0.32.4's CUDA quantized_matmul fails
                # on 1-D input ("SmallVector out of range").
                xr = x.astype(mx.float32)
                y = quantized_matmul(
                    xr[None] if x.ndim == 1 else xr,
                    q.w,
                    q.scales,
                    q.biases,
                    group_size=q.spec.group_size,
                    bits=q.spec.bits,
                    mode=q.spec.mode,
                )
                return y[0] if x.ndim == 1 else y
            return x.astype(mx.float32) @ self._base.astype(mx.float32).T
        x = validate.float_array("x", x)
        if x.ndim == 0 or x.shape[-1] != self.shape[1]:
            raise ValueError(
                f"x: its last axis must be {self.shape[1]} (the matrix's in dimension), got shape {x.shape}"
            )
        w = self.dense(np.float64) if x.dtype == np.float64 else self.dense(np.float32).astype(x.dtype, copy=False)
        return x @ w.T

    def apply(self, x: ArrayT) -> ArrayT:
        """The host semantics: INPUT rotates then multiplies; OUTPUT multiplies then rotates back."""
        f = self._fold
        if f is None:
            return self.matvec_base(x)
        if f.site is FoldSite.INPUT:
            return self.matvec_base(f.rotate(x))
        return f.unrotate(self.matvec_base(x))

    def __repr__(self) -> str:
        o, i = self.shape
        return f"WeightMatrix({o}x{i}, {self.dtype}, fold={self._fold!r})"


# -- why engines fold: quantization error with and without the rotation ------------------


def outlier_matrix(out_dim: int, in_dim: int, *, n_outliers: int, outlier_scale: float, seed: int) -> np.ndarray:
    """A Gaussian [out, in] float32 weight whose ``n_outliers`` input columns are scaled up.

    The shape of the problem the fold solves: LLM weights and activations carry a few
    outlier channels, and a quantization group that holds one spends its scale on it.
    """
    out_dim = validate.integer("out_dim", out_dim, minimum=1)
    in_dim = validate.integer("in_dim", in_dim, minimum=1)
    n_outliers = validate.integer("n_outliers", n_outliers, minimum=0, maximum=in_dim)
    outlier_scale = validate.number("outlier_scale", outlier_scale, minimum=0, exclusive_minimum=True)
    validate.within_memory("out_dim", 12 * out_dim * in_dim, f"a {out_dim} x {in_dim} matrix")
    rng = np.random.default_rng(validate.seed("seed", seed))
    w = rng.standard_normal((out_dim, in_dim))
    cols = rng.choice(in_dim, size=n_outliers, replace=False)
    w[:, cols] *= outlier_scale
    return w.astype(np.float32)


def quantization_error(
    w: np.ndarray, *, mode: str, bits: int, group_size: int, fold: HadamardFold | None = None
) -> float:
    """Relative Frobenius error of the quantized MAP: ``||map(Q(w)) - w||_F / ||w||_F``.

    0 when the map reproduces ``w`` exactly, an all-zero ``w`` included (0/0 taken as 0);
    inf for a non-zero map of a zero ``w``.

    With a fold the map is the folded, quantized base with the rotation undone, so the
    figure compares like with like: what ``apply`` computes against what ``w`` computes
    (for isotropic inputs, the expected relative error of the output).
    """
    q = WeightMatrix.quantize(w, mode=mode, bits=bits, group_size=group_size, fold=fold)
    w64 = np.asarray(w, dtype=np.float64)
    err = float(np.linalg.norm(q.linear_map() - w64))
    if err == 0.0:
        # An exact reproduction is error 0, also for an all-zero ``w`` (every format stores
        # 0 exactly), where the ratio would be 0/0: NaN would read as a failure in a table.
        return 0.0
    ref = float(np.linalg.norm(w64))
    return err / ref if ref > 0 else math.inf


#: The formats notebook 01 compares: (label, name in :data:`QUANT_FORMATS`).
STUDY_FORMATS: tuple[tuple[str, str], ...] = (
    ("affine 4-bit g64", "affine4"),
    ("mxfp4 g32", "mxfp4"),
    ("nvfp4 g16", "nvfp4"),
    ("affine 8-bit g64", "affine8"),
)


def quantization_study(
    w: np.ndarray,
    folds: dict[str, HadamardFold | None],
    formats: tuple[tuple[str, str], ...] = STUDY_FORMATS,
) -> pd.DataFrame:
    """One row per format (``(label, name in QUANT_FORMATS)``), one column per fold:
    :func:`quantization_error` of each pair."""
    import pandas as pd

    if not isinstance(folds, dict) or not folds:
        raise ValueError(
            f"folds: must be a non-empty dict of name -> HadamardFold or None, got {validate.describe(folds)}"
        )
    for name, f in folds.items():
        if f is not None and not isinstance(f, HadamardFold):
            raise ValueError(f"folds: entry {name!r} must be a HadamardFold or None, got {validate.describe(f)}")
    formats = validate.sequence("formats", formats, what="(label, format name) pairs")
    for entry in formats:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise ValueError(f"formats: entries must be (label, format name) pairs, got {validate.describe(entry)}")
        label, fmt = entry
        if not isinstance(fmt, str) or fmt not in QUANT_FORMATS:
            raise ValueError(f"formats: {label!r} names {fmt!r}, which is not one of {tuple(QUANT_FORMATS)}")
    rows = {}
    for label, fmt in formats:
        q = QUANT_FORMATS[fmt]
        rows[label] = {name: quantization_error(w, **q.as_quantize(), fold=f) for name, f in folds.items()}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "format"
    return df
