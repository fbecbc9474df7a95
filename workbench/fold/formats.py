"""Weight formats: one :class:`Format` each, the one spelling every part reads.

A format has three names in three places, and this table ties them together:

* its ``name`` (``"affine4"``): what records, benches, sweeps and notebooks write;
* its ``mode`` and ``bits`` (``("affine", 4)``): what ``mx.quantize`` takes, with its
  default ``group_size``;
* its ``code``: the template value ``FMT`` the kernels read (``kernels/common.h``'s
  ``WF_*`` numbers; ``tests/test_kernel_formats.py`` checks this table against them).

mxfp4 and nvfp4 share one code: both are E2M1 codes, read alike, and the kernels tell
them apart by their scales (:data:`SCALE_CODES`, the template value ``SFMT``).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench import validate

#: The scales' formats (the template value ``SFMT``), as ``kernels/common.h`` numbers
#: them: affine scales and biases in float32 or bfloat16, mxfp4's E8M0 bytes, nvfp4's E4M3.
SCALE_CODES: dict[str, int] = {"float32": 0, "bfloat16": 1, "e8m0": 2, "e4m3": 3}


@dataclass(frozen=True)
class Format:
    """One weight format: its name, how ``mx.quantize`` makes it, and the kernels' code.

    ``mode``: ``mx.quantize``'s mode, None for a dense dtype. ``bits``: bits a weight.
    ``group_size``: the weights one scale serves by default (None: dense). ``code``: the
    kernels' ``FMT``, None where the kernels do not read the format. ``scales``: the
    scales' fixed format (a key of :data:`SCALE_CODES`), None where the scales' dtype
    decides (affine) or there are none (dense).
    """

    name: str
    mode: str | None
    bits: int
    group_size: int | None
    code: int | None
    scales: str | None = None

    @property
    def quantized(self) -> bool:
        """Whether ``mx.quantize`` makes it (packed codes with scales), not a dense dtype."""
        return self.mode is not None

    @property
    def served(self) -> bool:
        """Whether the kernels read it (it has a :attr:`code`)."""
        return self.code is not None

    @property
    def unit_weights(self) -> int:
        """Weights in one 16-byte load: the kernels' unit of reading a row."""
        return 128 // self.bits

    def scale_code(self, scales_dtype: str = "bfloat16") -> int:
        """The ``SFMT`` a launch passes for this format's scales: the format's own for the
        microscaling formats, ``scales_dtype``'s (float32 or bfloat16) for affine, and
        float32's for a dense format (whose launches read no scales)."""
        if self.scales is not None:
            return SCALE_CODES[self.scales]
        if self.quantized:
            return SCALE_CODES[validate.one_of("scales_dtype", scales_dtype, ("float32", "bfloat16"))]
        return SCALE_CODES["float32"]

    def __str__(self) -> str:
        return self.name


FLOAT32 = Format("float32", None, 32, None, 0)
FLOAT16 = Format("float16", None, 16, None, None)
BFLOAT16 = Format("bfloat16", None, 16, None, 1)
AFFINE4 = Format("affine4", "affine", 4, 64, 2)
AFFINE8 = Format("affine8", "affine", 8, 64, 3)
MXFP4 = Format("mxfp4", "mxfp4", 4, 32, 4, scales="e8m0")
NVFP4 = Format("nvfp4", "nvfp4", 4, 16, 4, scales="e4m3")
MXFP8 = Format("mxfp8", "mxfp8", 8, 32, None, scales="e8m0")
#: mlx-lm's 2-bit affine at group 128, as PrismML's Hadamard packs store every linear (with
#: float16 scales and biases; ``mlx_lm/models/prism_hadamard_qwen35.py``, ``_QUANTIZATION``).
#: The kernels do not read it: their text (its fingerprint fixed) decodes 4- and 8-bit codes.
AFFINE2 = Format("affine2", "affine", 2, 128, None)

#: Every format the workbench knows: the dense dtypes, then the quantized packs users run
#: (mlx-lm's affine 4- and 8-bit, gpt-oss's mxfp4, nvfp4, mxfp8, the Hadamard packs' affine 2-bit).
FORMATS: tuple[Format, ...] = (FLOAT32, FLOAT16, BFLOAT16, AFFINE4, AFFINE8, MXFP4, NVFP4, MXFP8, AFFINE2)

#: The formats the kernels read, in the order the benches run them (dense, then quantized).
KERNEL_FORMATS: tuple[Format, ...] = tuple(f for f in FORMATS if f.served)

_BY_NAME = {f.name: f for f in FORMATS}
_BY_MODE = {(f.mode, f.bits): f for f in FORMATS if f.quantized}


def by_name(name: str) -> Format:
    """The format named ``name`` (``"affine4"``); ``ValueError`` listing the names otherwise."""
    return _BY_NAME[validate.one_of("name", name, tuple(_BY_NAME))]


def by_mode(mode: str, bits: int) -> Format:
    """The quantized format ``mx.quantize(mode=mode, bits=bits)`` makes; ``ValueError`` for
    a pair no format has."""
    for (m, b), f in _BY_MODE.items():
        if m == mode and b == bits and not isinstance(bits, bool):
            return f
    raise ValueError(
        f"(mode, bits): must be one of {sorted(_BY_MODE)}, got ({validate.describe(mode)}, {validate.describe(bits)})"
    )


def by_code(code: int) -> tuple[Format, ...]:
    """The formats the kernels read under ``FMT = code`` (two for the E2M1 code: mxfp4
    and nvfp4, which differ only in their scales); ``ValueError`` for a code the kernels
    do not define."""
    codes = sorted({f.code for f in KERNEL_FORMATS})
    n = validate.integer("code", code)
    found = tuple(f for f in KERNEL_FORMATS if f.code == n)
    if not found:
        raise ValueError(f"code: must be one of the kernels' format codes {codes}, got {code!r}")
    return found
