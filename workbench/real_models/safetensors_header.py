"""A safetensors file's header checked against the file itself, before MLX reads it.

A safetensors file is an 8-byte little-endian header length, that many bytes of UTF-8
JSON (each tensor's ``dtype``, ``shape`` and ``data_offsets`` ``[begin, end)`` into the
data that follows; an optional ``__metadata__`` entry of strings), then the data: the
format's specification (the ``safetensors`` project's README). A truncated download or a
header whose sizes disagree with its shapes is refused here with a ``ValueError`` naming
the file and the fault, instead of reaching MLX's reader as it is.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

__all__ = ["SAFETENSORS_DTYPE_BYTES", "check_safetensors_header"]

#: Bytes an element, by the specification's dtype names.
SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

#: A header larger than this is not a header (the specification caps it at 100 MB).
_MAX_HEADER = 100_000_000


def non_negative_ints(v: object) -> bool:
    """Whether ``v`` is a list of non-negative ints (bools excluded), as a header's shapes and offsets are."""
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def check_safetensors_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from ``path``'s header, or ``ValueError`` naming the file.

    Checked: the header length against the file; the header is UTF-8 JSON of the
    specification's form; each dtype known; each shape a list of non-negative integers
    whose size times the dtype's width is its data range's length; every range inside
    the data.
    """
    path = Path(path)

    def fail(what: str):
        raise ValueError(f"source: safetensors file {path.name} is not readable: {what}")

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                fail(f"it has {size} bytes, fewer than the 8 of its header length")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or n > size - 8:
                fail(f"its header claims {n} bytes, but the file has {size - 8} after the length")
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"source: safetensors file {path.name} cannot be read: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"its header is not UTF-8 JSON ({type(e).__name__} at byte {getattr(e, 'start', getattr(e, 'pos', '?'))})")
    if not isinstance(header, dict):
        fail(f"its header is a JSON {type(header).__name__}, not an object")
    data = size - 8 - n
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(entry, dict) and {"dtype", "shape", "data_offsets"} <= set(entry)):
            fail(f"tensor {name!r}'s entry is not {{dtype, shape, data_offsets}}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SAFETENSORS_DTYPE_BYTES:
            fail(f"tensor {name!r} has dtype {dtype!r}, not one of {sorted(SAFETENSORS_DTYPE_BYTES)}")
        if not non_negative_ints(shape):
            fail(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
        if not (non_negative_ints(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]):
            fail(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with begin <= end")
        count = 1
        for d in shape:
            count *= d
        if count * SAFETENSORS_DTYPE_BYTES[dtype] != offsets[1] - offsets[0]:
            fail(
                f"tensor {name!r} ({dtype}, shape {tuple(shape)}) needs {count * SAFETENSORS_DTYPE_BYTES[dtype]} "
                f"bytes, its data range holds {offsets[1] - offsets[0]}"
            )
        if offsets[1] > data:
            fail(f"tensor {name!r}'s data ends at byte {offsets[1]} of the data, which has {data} (truncated?)")
        out[name] = (dtype, tuple(shape))
    return out
