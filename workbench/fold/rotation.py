"""The block-Hadamard fold: ``R = B . P . D``, and folding it into a weight.

``D = diag(signs)`` (each +1 or -1; none = identity), ``P`` a permutation with
``(P x)[i] = x[perm[i]]`` (none = identity), ``B = blockdiag(H_b / sqrt(b))``. R is
orthogonal, so folding it into a weight changes the weight's numbers (spreading outlier
columns over a block, which is why engines do it before quantizing) but not its map:

* site INPUT: the matrix stores ``W' = W R^T`` and applies ``W' (R x)``;
* site OUTPUT: it stores ``W' = R W`` and applies ``R^T (W' x)``.

One fold object serves both the numpy oracle (float64-capable, dense block matrices) and
MLX (``mx.hadamard_transform``); :meth:`HadamardFold.plan` is what a kernel needs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeVar

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.fold import hadamard

ArrayT = TypeVar("ArrayT", np.ndarray, mx.array)


class FoldSite(enum.Enum):
    """Which side of the weight the rotation sits on."""

    INPUT = "input"  #: stores W R^T, applies W'(R x)
    OUTPUT = "output"  #: stores R W, applies R^T(W' x)


@dataclass(frozen=True)
class FoldPlan:
    """What a kernel needs to apply a fold over a vector of ``width``.

    Signs and perm are always full arrays (ones / arange when the fold has none), so a
    kernel has one code path; ``table`` is the m x m +-1 table (``[[1]]`` for m = 1).
    """

    block: int
    m: int
    k: int
    width: int
    signs: np.ndarray  # float32, (width,)
    perm: np.ndarray  # int32, (width,)
    table: np.ndarray  # int8, (m, m)
    site: FoldSite
    has_signs: bool
    has_perm: bool

    @property
    def scale(self) -> float:
        """The orthonormal scale 1 / sqrt(block)."""
        return float(1.0 / np.sqrt(self.block))


def _validate_signs(signs: object) -> np.ndarray:
    """``signs`` (a list, numpy or MLX array of +1/-1) as a read-only float32 COPY (the caller's stays writable)."""
    try:
        arr = validate.float_array("signs", signs)
    except ValueError:
        raise ValueError(f"signs: must be a non-empty 1-D array of +1/-1, got {validate.describe(signs)}") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"signs: must be a non-empty 1-D array of +1/-1, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    if np.isnan(arr).any():
        raise ValueError("signs: must be +1 or -1 only, found NaN")
    bad = ~np.isin(arr, (1.0, -1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"signs: must be +1 or -1 only, got signs[{i}] = {float(arr[i])!r}")
    out = arr.astype(np.float32)
    out.flags.writeable = False
    return out


def _validate_perm(perm: object) -> np.ndarray:
    """``perm`` (a list, numpy or MLX array) as a read-only int32 COPY, checked to be a permutation."""
    try:
        arr = np.asarray(perm)
    except Exception:  # a ragged list
        arr = np.asarray(None)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"perm: must be a non-empty 1-D permutation of range(dim), got {validate.describe(perm)}")
    if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        raise ValueError(f"perm: must hold integers (a permutation of range(dim)), got dtype {arr.dtype}")
    n = arr.size
    if not np.array_equal(np.sort(arr), np.arange(n)):
        raise ValueError(f"perm: must be a permutation of range({n}) (each index exactly once)")
    out = arr.astype(np.int32)
    out.flags.writeable = False
    return out


def _checked_input(name: str, x: object) -> np.ndarray | mx.array:
    """``x`` as numpy in its own float dtype (float64 for ints: a rotation of ints is not ints), or
    an MLX array as given (ints cast to float32); at least one axis; a ValueError naming ``name`` else."""
    if isinstance(x, mx.array):
        if not (mx.issubdtype(x.dtype, mx.floating) or mx.issubdtype(x.dtype, mx.integer)):
            raise ValueError(f"{name}: must be an array of real numbers, got {validate.describe(x)}")
        a = x if mx.issubdtype(x.dtype, mx.floating) else x.astype(mx.float32)
    else:
        a = validate.float_array(name, x)
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError(f"{name}: must have a non-empty last axis (the vector rotated), got shape {tuple(a.shape)}")
    return a


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class HadamardFold:
    """A block-Hadamard rotation ``R = B P D`` and the site it is folded at.

    ``eq=False`` on purpose: two folds are "the same rotation" for the head launch only
    when they are the same object, as frink-models asks with Rust's ``Arc::ptr_eq`` (pointer identity); use
    :meth:`same_rotation` for a value comparison.
    """

    block: int
    signs: np.ndarray | None = None
    perm: np.ndarray | None = None
    site: FoldSite = FoldSite.INPUT
    _mk: tuple[int, int] = field(init=False, repr=False)
    # MLX copies of signs / perm / inverse perm (and the signs in each numpy float dtype the
    # oracle asks for), made once per dtype: a fold is applied on every token and every case,
    # and remaking its constants each time is work on the hot path.
    _mx: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_mk", hadamard.factor_block(self.block))
        object.__setattr__(self, "block", int(self.block))
        if not isinstance(self.site, FoldSite):
            raise ValueError(f"site: must be FoldSite.INPUT or FoldSite.OUTPUT, got {validate.describe(self.site)}")
        signs = None if self.signs is None else _validate_signs(self.signs)
        perm = None if self.perm is None else _validate_perm(self.perm)
        if signs is not None and perm is not None and signs.size != perm.size:
            raise ValueError(f"signs/perm: must have the same length, got {signs.size} and {perm.size}")
        # Stored before anything reads them back (``dim`` does): the validated, read-only copies.
        object.__setattr__(self, "signs", signs)
        object.__setattr__(self, "perm", perm)
        n = self.dim
        if n is not None and n % self.block != 0:
            raise ValueError(
                f"signs/perm: the fold's dimension {n} (their length) must be a multiple of block {self.block}"
            )

    # -- construction -------------------------------------------------------------------

    @classmethod
    def random(
        cls,
        dim: int,
        block: int,
        *,
        seed: int,
        permute: bool = False,
        site: FoldSite = FoldSite.INPUT,
    ) -> HadamardFold:
        """Random signs (and optionally a random permutation) over ``dim``, seeded."""
        hadamard.factor_block(block)
        dim = validate.integer("dim", dim, minimum=1)
        if dim % block != 0:
            raise ValueError(f"dim: must be a multiple of block ({block}), got dim ({dim})")
        validate.within_memory("dim", 24 * dim, f"a fold over {dim} elements")  # signs and perm, with temporaries
        rng = np.random.default_rng(validate.seed("seed", seed))
        permute = validate.flag("permute", permute)
        signs = np.where(rng.random(dim) < 0.5, -1.0, 1.0).astype(np.float32)
        perm = rng.permutation(dim).astype(np.int32) if permute else None
        return cls(block, signs, perm, site)

    # -- shape ----------------------------------------------------------------------------

    @property
    def m(self) -> int:
        return self._mk[0]

    @property
    def k(self) -> int:
        return self._mk[1]

    @property
    def dim(self) -> int | None:
        """The fixed dimension when signs or perm are given; ``None`` (any multiple of block) otherwise."""
        if self.signs is not None:
            return int(self.signs.size)
        if self.perm is not None:
            return int(self.perm.size)
        return None

    def check_width(self, width: int) -> None:
        """Raise ``ValueError`` unless this fold can rotate a vector of ``width``."""
        width = validate.integer("width", width, minimum=1)
        if self.dim is not None and width != self.dim:
            raise ValueError(f"width: must equal the fold's dimension {self.dim} (its signs/perm length), got {width}")
        if width % self.block != 0:
            raise ValueError(f"width: must be a multiple of block ({self.block}), got width ({width})")

    def same_rotation(self, other: HadamardFold | None) -> bool:
        """Whether ``other`` is the same rotation by value (block, signs, perm; site ignored).

        ``None`` (no fold) is a valid answer to "which rotation" and is simply not this one;
        anything else that is not a fold is a caller's mistake, refused rather than
        answered ``False``, which would hide it.
        """
        if other is None:
            return False
        if not isinstance(other, HadamardFold):
            raise ValueError(f"other: must be a HadamardFold or None, got {validate.describe(other)}")
        if self is other:
            return True

        def eq(a: np.ndarray | None, b: np.ndarray | None) -> bool:
            return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))

        return self.block == other.block and eq(self.signs, other.signs) and eq(self.perm, other.perm)

    # -- applying R -----------------------------------------------------------------------

    def _mx_const(self, name: str, dtype: mx.Dtype | None = None) -> mx.array:
        key = (name, dtype)
        if key not in self._mx:
            if name == "signs":
                self._mx[key] = mx.array(self.signs, dtype=dtype)
            elif name == "perm":
                self._mx[key] = mx.array(self.perm)
            else:  # "inverse": (P^T z)[perm[i]] = z[i] is a gather with argsort(perm)
                self._mx[key] = mx.array(np.argsort(self.perm).astype(np.int32))
        return self._mx[key]

    def _np_signs(self, dtype: np.dtype) -> np.ndarray:
        """The signs in a numpy float ``dtype``, made once per dtype (read-only)."""
        key = ("np_signs", dtype)
        if key not in self._mx:
            self._mx[key] = _read_only(self.signs.astype(dtype))
        return self._mx[key]

    def _fits(self, x: object) -> bool:
        """Whether ``x`` is a numpy float array whose last axis this fold rotates as it is:
        the whole input check in a few comparisons, for the oracle's per-case calls."""
        if type(x) is not np.ndarray or x.dtype.kind != "f" or x.ndim == 0:
            return False
        width = x.shape[-1]
        dim = self.signs.size if self.signs is not None else (self.perm.size if self.perm is not None else None)
        return width > 0 and width % self.block == 0 and (dim is None or width == dim)

    def rotate(self, x: ArrayT) -> ArrayT:
        """``R x`` along the last axis: signs, then the permutation, then the blocks."""
        if self._fits(x):  # a numpy float array that fits: the checks below would all pass
            if self.signs is not None:
                x = x * self._np_signs(x.dtype)
            if self.perm is not None:
                x = x[..., self.perm]
            return hadamard.block_transform(x, self.block)
        is_mx = isinstance(x, mx.array)
        x = _checked_input("x", x)
        self.check_width(int(x.shape[-1]))
        if self.signs is not None:
            x = x * (self._mx_const("signs", x.dtype) if is_mx else self.signs.astype(x.dtype))
        if self.perm is not None:
            x = mx.take(x, self._mx_const("perm"), axis=-1) if is_mx else x[..., self.perm]
        if is_mx:
            return hadamard.block_transform_mx(x, self.block)
        return hadamard.block_transform(x, self.block)

    def unrotate(self, y: ArrayT) -> ArrayT:
        """``R^T y = D P^T B^T y`` along the last axis (the inverse of :meth:`rotate`)."""
        is_mx = isinstance(y, mx.array)
        if not self._fits(y):
            y = _checked_input("y", y)
            self.check_width(int(y.shape[-1]))
        if is_mx:
            z = hadamard.block_transform_mx(y, self.block, transpose=True)
        else:
            z = hadamard.block_transform(y, self.block, transpose=True)
        if self.perm is not None:
            # (P^T z)[perm[i]] = z[i]: gather with the inverse permutation.
            z = mx.take(z, self._mx_const("inverse"), axis=-1) if is_mx else z[..., np.argsort(self.perm)]
        if self.signs is not None:
            z = z * (self._mx_const("signs", z.dtype) if is_mx else self._np_signs(z.dtype))
        return z

    def matrix(self, dim: int | None = None) -> np.ndarray:
        """The dense orthogonal ``R`` (float64, dim x dim); rows are ``R e_i`` transposed."""
        if dim is None:
            if self.dim is None:
                raise ValueError("dim: must be given for a fold without signs or perm (any multiple of block fits)")
            dim = self.dim
        self.check_width(dim)
        validate.within_memory(
            "dim", 16 * int(dim) ** 2, f"a dense {dim} x {dim} rotation (float64, with its identity)"
        )
        # R = rotate applied to the identity's columns: R[:, j] = rotate(e_j).
        return self.rotate(np.eye(dim, dtype=np.float64)).T

    def plan(self, width: int) -> FoldPlan:
        """What a kernel needs to rotate a vector of ``width``, or a ``ValueError`` when it does not fit."""
        self.check_width(width)
        signs = self.signs if self.signs is not None else np.ones(width, dtype=np.float32)
        perm = self.perm if self.perm is not None else np.arange(width, dtype=np.int32)
        return FoldPlan(
            block=self.block,
            m=self.m,
            k=self.k,
            width=int(width),
            signs=_read_only(np.array(signs, dtype=np.float32)),
            perm=_read_only(np.array(perm, dtype=np.int32)),
            table=hadamard.table(self.m),
            site=self.site,
            has_signs=self.signs is not None,
            has_perm=self.perm is not None,
        )

    def with_site(self, site: FoldSite) -> HadamardFold:
        """The same rotation folded at the other site."""
        if not isinstance(site, FoldSite):
            raise ValueError(f"site: must be FoldSite.INPUT or FoldSite.OUTPUT, got {validate.describe(site)}")
        return HadamardFold(self.block, self.signs, self.perm, site)

    def __repr__(self) -> str:
        n = self.dim if self.dim is not None else "any"
        return (
            f"HadamardFold(block={self.block} (= {self.m} x 2^{self.k}), dim={n}, "
            f"signs={'yes' if self.signs is not None else 'none'}, "
            f"perm={'yes' if self.perm is not None else 'none'}, site={self.site.name})"
        )
