"""A GGUF file's header checked against the file itself, before any native reader sees it.

MLX's GGUF reader trusts the header: a count of tensors larger than the file holds, a key
length of 2^40, a tensor of 9 dimensions or a tensor whose data runs past the end of a
truncated download make it read out of bounds (a segfault or an abort: the interpreter,
or the Jupyter kernel, dies). :func:`check_gguf_header` walks the whole header in Python,
checking every count and length against the bytes left in the file, every tensor's
dimensions, type and data range against the file's size, and raises ``ValueError`` naming
the file and what is wrong. Only a file that passes is handed to ``mx.load``. The layout
read is the GGUF specification's (ggml's ``docs/gguf.md``, versions 1 to 3).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUF_MAX_DIMS", "GgufHeader", "GgufTensorInfo", "check_gguf_header"]

#: ggml's GGML_MAX_DIMS: a tensor has at most 4 dimensions.
GGUF_MAX_DIMS = 4

#: Scalar value types: (struct format, size in bytes), by the specification's type code.
_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9

#: ggml tensor types: code -> (name, elements a block, bytes a block).
_TENSOR_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}

#: The most bytes one metadata string may take: a key or a tokenizer entry is short; a
#: length beyond this is a corrupt header, refused before anything is allocated for it.
_MAX_STRING = 1 << 24


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor as the header describes it: name, shape (ggml order, innermost first), type, data range."""

    name: str
    dims: tuple[int, ...]
    type_name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GgufHeader:
    """What the header says: version, key/value count, tensors, where the data starts, the file's size."""

    version: int
    n_kv: int
    tensors: tuple[GgufTensorInfo, ...]
    data_start: int
    file_size: int


class _Reader:
    """Reads the header with every length checked against the bytes the file has left."""

    def __init__(self, f: BinaryIO, size: int, fail) -> None:
        self.f, self.size, self.fail = f, size, fail

    @property
    def pos(self) -> int:
        return self.f.tell()

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.left():
            self.fail(
                f"{what} needs {n} bytes at offset {self.pos}, but the file has {self.left()} left "
                f"(truncated or corrupt)"
            )
        return self.f.read(n)

    def skip(self, n: int, what: str) -> None:
        if n < 0 or n > self.left():
            self.fail(
                f"{what} needs {n} bytes at offset {self.pos}, but the file has {self.left()} left "
                f"(truncated or corrupt)"
            )
        self.f.seek(n, os.SEEK_CUR)

    def scalar(self, fmt: str, size: int, what: str):
        return struct.unpack(fmt, self.take(size, what))[0]

    def count(self, wide: bool, what: str) -> int:
        return self.scalar("<Q", 8, what) if wide else self.scalar("<I", 4, what)

    def string(self, wide: bool, what: str) -> str:
        n = self.count(wide, f"the length of {what}")
        if n > _MAX_STRING:
            self.fail(f"{what} claims a length of {n} bytes (at most {_MAX_STRING} is plausible)")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8 text")
            raise  # unreachable: fail raises


def _value(r: _Reader, vtype: int, wide: bool, what: str, keep: bool):
    """Read (``keep``) or skip one value of type ``vtype``; returns it when kept and scalar."""
    if vtype in _SCALARS:
        fmt, size = _SCALARS[vtype]
        return r.scalar(fmt, size, what)
    if vtype == _STRING:
        return r.string(wide, what)
    if vtype == _ARRAY:
        etype = r.scalar("<I", 4, f"the item type of {what}")
        n = r.count(wide, f"the length of {what}")
        if etype in _SCALARS:
            r.skip(n * _SCALARS[etype][1], what)
            return None
        if etype == _STRING:
            if n * 8 > r.left():  # every string takes at least its length field
                r.fail(f"{what} claims {n} strings, more than the {r.left()} bytes left can hold")
            for i in range(n):
                r.string(wide, f"{what}[{i}]")
            return None
        r.fail(f"{what} is an array of type {etype}, which GGUF does not define (nested arrays are not read)")
    r.fail(f"{what} has value type {vtype}, which GGUF does not define (0 to 12)")


def check_gguf_header(path: str | Path) -> GgufHeader:
    """Walk ``path``'s GGUF header; ``ValueError`` naming the file and the fault, else the header.

    Checked: the magic and version; every count and string length against the bytes left;
    the value types; each tensor's dimension count (1 to 4), dimensions (positive, their
    product finite), type (one ggml defines), offset (aligned) and data range (inside the
    file); tensor names unique.

    The layout (ggml's ``docs/gguf.md``, versions 1 to 3): the magic ``GGUF``, a uint32
    version, the tensor and key/value counts (uint32 in version 1, uint64 after), the
    key/value pairs (a string key, a uint32 value type, the value), then each tensor's name,
    uint32 dimension count, dimensions, uint32 type and uint64 offset; tensor data starts at
    the next multiple of ``general.alignment`` (32 by default). Strings are a length (uint64;
    uint32 in version 1) and that many bytes. The block sizes of the tensor types are ggml's
    (``ggml.c``'s type traits): a type not listed is refused, since its data size cannot be
    checked.
    """
    path = Path(path)

    def fail(what: str):
        raise ValueError(f"source: GGUF file {path.name} is not readable: {what}")

    try:
        size = path.stat().st_size
        f = path.open("rb")
    except OSError as e:
        raise ValueError(f"source: GGUF file {path.name} cannot be opened: {e.strerror or e}") from None
    with f:
        r = _Reader(f, size, fail)
        if r.take(4, "the magic number") != b"GGUF":
            fail("it does not start with the magic number GGUF")
        version = r.scalar("<I", 4, "the version")
        if version not in (1, 2, 3):
            fail(f"version {version}; versions 1 to 3 are read")
        wide = version >= 2
        n_tensors = r.count(wide, "the tensor count")
        n_kv = r.count(wide, "the key/value count")
        # Each key/value takes at least 8 + 4 + 1 bytes, each tensor info at least 8 + 4 + 8 + 4 + 8.
        if n_kv * 13 > r.left():
            fail(f"it claims {n_kv} key/value pairs, more than the {r.left()} bytes left can hold")
        if n_tensors * 32 > r.left():
            fail(f"it claims {n_tensors} tensors, more than the {r.left()} bytes left can hold")
        alignment = 32
        for i in range(n_kv):
            key = r.string(wide, f"key {i}")
            vtype = r.scalar("<I", 4, f"the type of {key!r}")
            v = _value(r, vtype, wide, f"the value of {key!r}", keep=key == "general.alignment")
            if key == "general.alignment":
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v & (v - 1):
                    fail(f"general.alignment is {v!r}; it must be a power of two")
                alignment = v
        infos = []
        for i in range(n_tensors):
            name = r.string(wide, f"the name of tensor {i}")
            n_dims = r.scalar("<I", 4, f"the dimension count of {name!r}")
            if not 1 <= n_dims <= GGUF_MAX_DIMS:
                fail(f"tensor {name!r} has {n_dims} dimensions; ggml allows 1 to {GGUF_MAX_DIMS}")
            dims = tuple(r.count(wide, f"a dimension of {name!r}") for _ in range(n_dims))
            if any(d <= 0 for d in dims):
                fail(f"tensor {name!r} has dimensions {dims}; each must be positive")
            ttype = r.scalar("<I", 4, f"the type of {name!r}")
            offset = r.scalar("<Q", 8, f"the offset of {name!r}")
            if ttype not in _TENSOR_TYPES:
                fail(f"tensor {name!r} has type {ttype}, not one whose size is known")
            tname, block, block_bytes = _TENSOR_TYPES[ttype]
            n = 1
            for d in dims:
                n *= d
            if dims[0] % block:
                fail(f"tensor {name!r} ({tname}) has rows of {dims[0]}, not a multiple of its block of {block}")
            infos.append(GgufTensorInfo(name, dims, tname, offset, n // block * block_bytes))
        data_start = -(-r.pos // alignment) * alignment
        seen: set[str] = set()
        for t in infos:
            if t.name in seen:
                fail(f"tensor {t.name!r} appears twice")
            seen.add(t.name)
            if t.offset % alignment:
                fail(f"tensor {t.name!r} starts at offset {t.offset}, not a multiple of the alignment {alignment}")
            end = data_start + t.offset + t.nbytes
            if end > size:
                fail(
                    f"tensor {t.name!r} ({t.type_name}, dims {t.dims}) runs to byte {end}, past the file's end "
                    f"at {size} (truncated?)"
                )
    return GgufHeader(version, n_kv, tuple(infos), data_start, size)
