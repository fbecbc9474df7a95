"""MLX's affine packing read in numpy: the codes in uint32 words, and the float64 weights they stand for.

The float64 truth of a quantized matrix is computed here from the STORED codes, scales and
biases, not through ``mx.dequantize``: the truth must not trust the library whose layout a
kernel reads. The layout (MLX ``quantize``, affine mode; bits 2, 4 or 8): each row's codes
packed into uint32 words, lowest bits first; one scale and one bias a group of
``group_size`` inputs; weight = ``scale * q + bias``.

Exact in float64 for the packs' float16 scales and biases (PrismML's 2-bit packs): ``scale *
q`` has at most 11 + 8 significant bits, and a float16's exponent lies in [-24, 15], so the
sum of two such numbers needs at most 40 + 13 = 53 bits, float64's mantissa. Rows are
decoded a chunk at a time so that a Bonsai-27B matrix (17408 x 5120) needs no full-size
temporary beside its float64 result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench import validate

#: The affine code widths whose codes fill a uint32 word exactly (MLX packs these in words).
WORD_BITS: tuple[int, ...] = (2, 4, 8)

#: Weights decoded a step: a few MB of scratch.
CHUNK_WEIGHTS = 1 << 20


def unpack_codes(words: Any, bits: int) -> np.ndarray:
    """The codes of ``words`` (uint32 [rows, words]), lowest bits first: uint8 [rows, words * 32 / bits]."""
    bits = validate.one_of("bits", validate.integer("bits", bits), WORD_BITS)
    w = np.asarray(words)
    if w.dtype != np.uint32 or w.ndim != 2:
        raise ValueError(f"words: must be a 2-D uint32 array (MLX's packed codes), got {validate.describe(words)}")
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * np.uint32(bits))[None, None, :]
    mask = np.uint32((1 << bits) - 1)
    return ((w[:, :, None] >> shifts) & mask).astype(np.uint8).reshape(w.shape[0], -1)


def dequantize_float64(codes: Any, scales: Any, biases: Any, *, bits: int, group_size: int) -> np.ndarray:
    """``scale * q + bias`` in float64 [rows, in] from packed ``codes`` (uint32 [rows, in * bits / 32]),
    ``scales`` and ``biases`` ([rows, in / group_size], any float dtype numpy holds, read exactly).

    ``ValueError`` names the argument whose shape does not fit the others."""
    bits = validate.one_of("bits", validate.integer("bits", bits), WORD_BITS)
    group_size = validate.integer("group_size", group_size, minimum=1)
    words = np.asarray(codes)
    if words.dtype != np.uint32 or words.ndim != 2:
        raise ValueError(f"codes: must be a 2-D uint32 array (MLX's packed codes), got {validate.describe(codes)}")
    rows, n_words = words.shape
    cols = n_words * 32 // bits
    if cols % group_size:
        raise ValueError(f"group_size: must divide the in dimension {cols} the codes hold, got {group_size}")
    want = (rows, cols // group_size)
    parts = {}
    for name, a in (("scales", scales), ("biases", biases)):
        arr = np.asarray(a)
        if arr.shape != want or arr.dtype.kind != "f":
            raise ValueError(f"{name}: must be a float array of shape {want} (one a group), got {validate.describe(a)}")
        parts[name] = arr
    out = np.empty((rows, cols), dtype=np.float64)
    step = max(1, CHUNK_WEIGHTS // max(cols, 1))
    for r in range(0, rows, step):
        q = unpack_codes(words[r : r + step], bits).reshape(-1, want[1], group_size)
        s = parts["scales"][r : r + step].astype(np.float64)[:, :, None]
        b = parts["biases"][r : r + step].astype(np.float64)[:, :, None]
        out[r : r + step] = (s * q + b).reshape(-1, cols)
    return out
