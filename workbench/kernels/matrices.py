"""A weight matrix as the kernels take it, and the group memory a launch declares.

:func:`kernel_matrix` turns a :class:`workbench.fold.weights.WeightMatrix` (dense or
quantized, no fold) into a :class:`KernelMatrix`: its :class:`~workbench.fold.formats.Format`,
the template values that describe it (``FMT``, ``SFMT``, ``GS``, ``QI``) and the arrays a
launch passes. :func:`units_for` turns a tuning's loads in flight into the template value
``U`` for a format. :func:`threadgroup_bytes` mirrors how each kernel body lays out its
group memory, so a Metal launch over Apple GPUs' 32 KB is refused before it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from workbench.fold import formats
from workbench.fold.formats import Format
from workbench.fold.weights import QuantizedBase, WeightMatrix
from workbench.kernels import source as kernel_source
from workbench.kernels.tuning import MAX_GROUP_FLOATS, METAL_THREADGROUP_LIMIT

#: What the kernels serve, for error messages.
SERVED = "float32, bfloat16, affine 4- and 8-bit, mxfp4 and nvfp4 weights"

#: The template value ``GS`` of a dense matrix: it has no scales to group, and the kernels
#: never read it; 32 is what every dense launch passes.
DENSE_GS = 32


@dataclass(frozen=True)
class KernelMatrix:
    """One weight matrix as a kernel takes it: format, the arrays, its shape.

    ``format`` is the weights' format (its ``code`` the template value ``FMT``, also
    :attr:`fmt`); ``sfmt``, ``gs`` and ``qi`` the template values ``SFMT`` (the scales'
    code), ``GS`` (weights a scale) and ``QI`` (words interleaved, :func:`interleaved`).
    """

    format: Format
    sfmt: int
    gs: int
    qi: bool
    w: mx.array
    s: mx.array
    b: mx.array
    rows: int
    cols: int
    nbytes: int  # what the kernel streams: weights, and scales and biases where quantized

    @property
    def fmt(self) -> int:
        """The template value ``FMT``: the format's kernel code."""
        assert self.format.code is not None  # kernel_matrix makes only served formats
        return self.format.code


def units_for(fmt: int, u: int) -> int:
    """The template value ``U`` for ``u`` 16-byte units in flight a lane (``KernelTuning.u_*``)
    in the format of kernel code ``fmt``: a 4-bit unit is 32 weights (4 x the work of a
    bf16 one, and its dot products unroll into registers), so a quarter as many; an 8-bit
    unit 16 weights, so half as many; dense formats ``u`` itself."""
    bits = formats.by_code(fmt)[0].bits  # formats sharing a code share their bits
    return u if bits >= 16 else max(1, u // (16 // bits))


def interleaved(fmt: Format, cols: int) -> bool:
    """Whether rows of ``cols`` weights in ``fmt`` are read as interleaved words (the
    template value ``QI``): quantized rows of a multiple of 128 32-bit words
    (``kernels/common.h``, ``Q_WORD``)."""
    return fmt.quantized and (cols // (32 // fmt.bits)) % 128 == 0


def dummy_array() -> mx.array:
    """An input a launch never reads (dense scales and biases, fp4 biases): 8 floats, because
    MLX's Metal signature puts arrays under 8 elements in ``constant`` space."""
    return mx.zeros((8,), dtype=mx.float32)


def kernel_matrix(name: str, wm: WeightMatrix) -> KernelMatrix:
    """``wm`` (a WeightMatrix, no fold) in the form the kernels take; ValueError if unserved."""
    base, fold = wm.launch_parts()
    if fold is not None:
        raise ValueError(f"{name} must carry no fold for the kernels (only wo's and Q/K/V's input folds are applied)")
    rows, cols = wm.shape
    if isinstance(base, QuantizedBase):
        spec = base.spec
        try:
            fmt = formats.by_mode(spec.mode, spec.bits)
        except ValueError:
            fmt = None
        if fmt is None or not fmt.served:
            raise ValueError(f"{name}: the kernels serve {SERVED}; got {spec}")
        scales, biases = base.scales, base.biases
        if spec.mode == "affine":
            if scales.dtype == mx.float16:
                # The kernels decode float32 and bfloat16 scales. float16 scales (GGUF
                # checkpoints: llama.cpp's Q4_0/Q4_1/Q8_0 as MLX reads them) are widened to
                # float32 here: exact (every float16 is a float32), so the kernel computes
                # the stored map itself; it streams twice the scale bytes (``nbytes`` says so).
                scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
            if scales.dtype not in (mx.float32, mx.bfloat16):
                raise ValueError(f"{name}: affine scales must be float32, bfloat16 or float16; got {scales.dtype}")
        sfmt = fmt.scale_code("bfloat16" if scales.dtype == mx.bfloat16 else "float32")
        if cols % fmt.unit_weights:
            raise ValueError(
                f"{name}: its in dimension ({cols}) must be a multiple of {fmt.unit_weights} for {spec} units"
            )
        nbytes = int(base.w.nbytes + scales.nbytes + (biases.nbytes if biases is not None else 0))
        biases = biases if biases is not None else dummy_array()  # fp4 formats: none, never read
        return KernelMatrix(
            fmt, sfmt, spec.group_size, interleaved(fmt, cols), base.w, scales, biases, rows, cols, nbytes
        )
    if base.dtype == mx.float32:
        fmt = formats.FLOAT32
    elif base.dtype == mx.bfloat16:
        fmt = formats.BFLOAT16
    else:
        raise ValueError(f"{name}: the kernels serve {SERVED}; got {base.dtype}")
    if cols % fmt.unit_weights:
        raise ValueError(
            f"{name}: its in dimension ({cols}) must be a multiple of {fmt.unit_weights} for 16-byte loads"
        )
    return KernelMatrix(
        fmt, fmt.scale_code(), DENSE_GS, False, base, dummy_array(), dummy_array(), rows, cols, int(base.nbytes)
    )


def check_width(name: str, width: int) -> None:
    """ValueError unless ``width`` fits the kernels' group-memory staging."""
    if width % 8 or width > MAX_GROUP_FLOATS:
        raise ValueError(
            f"{name} ({width}) must be a multiple of 8 and at most {MAX_GROUP_FLOATS} "
            "(the kernels stage it in 32 KB of group memory)"
        )


def threadgroup_bytes(kernel: str, template: dict[str, Any]) -> int:
    """The threadgroup memory one group of ``kernel`` declares with these template values,
    as its body lays it out (each array rounded up to 16 bytes, as Metal allocates)."""

    def r16(n: int) -> int:
        return -(-n // 16) * 16

    if kernel not in kernel_source.KERNELS:
        raise ValueError(f"kernel must be one of {tuple(kernel_source.KERNELS)}; got {kernel!r}")
    red = r16(4 * (template["NT"] // 32))  # a group reduction's scratch: a float a SIMD-group
    if kernel == "ffn_down":  # one float a SIMD-group for each of its DR rows
        return r16(4 * (template["NT"] // 32) * template.get("DR", 1))
    width = template["WIDTH" if kernel == "wo_residual" else "HID"]
    x, sums = tiled_x_bytes(template["FMT"], template["GS"], width)
    if kernel == "ffn_gate_up":  # the scratch beside n when both fit, else inside n (kernels/ffn_gate_up.body)
        x = x + red if x + red <= METAL_THREADGROUP_LIMIT else x
    # wo and the head: the scratch (head) inside x; then the SB-sums after both when they fit.
    return x + sums if x + sums <= METAL_THREADGROUP_LIMIT else x


#: The formats whose rows read x tiled in group memory (``kernels/common.h``, ``TILED_X``,
#: which this mirrors): affine 8-bit only, since a tiled 4-bit unit holds its 32 floats of
#: x in registers and the launch loses occupancy (kernels/README.md, "The primitives").
TILED_X_FORMATS: tuple[Format, ...] = (formats.AFFINE8,)


def tiled_x_bytes(fmt: int, gs: int, width: int) -> tuple[int, int]:
    """The group memory a launch's input vector of ``width`` floats takes in the format of
    kernel code ``fmt``, as ``kernels/common.h`` (``WFormat``'s ``XL4`` and ``SUM4``) lays
    it out: x itself (whole 128-byte lines for a :data:`TILED_X_FORMATS` format, which
    ``tile_x`` swizzles within a line) and the sums of x over each unit (each scale group
    when a unit holds two) that tiled rows read; no sums for the other formats."""
    tiled = [f for f in TILED_X_FORMATS if f.code == fmt]
    if not tiled:
        return -(-4 * width // 16) * 16, 0
    block = min(gs, tiled[0].unit_weights)
    return -(-width // 32) * 128, -(-(width // block) // 4) * 16


def check_threadgroup_memory(kernel: str, template: list[tuple[str, Any]], width: str) -> None:
    """ValueError when a Metal launch of ``kernel`` would declare more than Apple GPUs'
    32 KB of threadgroup memory (``width``: which dimension sets it, for the message)."""
    used = threadgroup_bytes(kernel, dict(template))
    if used > METAL_THREADGROUP_LIMIT:
        raise ValueError(
            f"{width}: {kernel} would declare {used} bytes of threadgroup memory, more than Apple "
            f"GPUs' {METAL_THREADGROUP_LIMIT}; the Metal launch refuses it"
        )
