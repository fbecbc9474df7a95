"""Whether a launch wrote every element of its outputs: the outputs filled before the launch, and
an element the grid never reached named.

A GPU's output buffer holds whatever memory held before: an element no thread writes reads as
a plausible stale value, or as the right one left by the previous launch in that buffer, and a
check that only compares values can pass a grid that does not cover its output (which is why
TritonBench poisons outputs with NaN and llama.cpp's backend tests fill sentinel tensors). So
the check's launches fill every output with NaN first (MLX's ``init_value``, a
``fill_`` of a PyTorch tensor, the emulator's own NaN fill): an element the launch did not write
stays NaN and fails every metric. To say *which* elements and *why*, and not mistake a NaN the
kernel computed for one it never wrote, a launch that left NaN runs once more with every output
filled with :data:`SENTINEL`: an element that is NaN after the first and the sentinel after the
second was never written (:func:`never_written`), and :func:`covered_launch` raises
:class:`UncoveredOutput` naming it. A NaN the kernel wrote is its own result, left to the
metrics. The cost: a fill of each output (a memset) before each launch; the second launch only
where the first left a NaN.

The launch is given as a function of the fill value (:func:`mlx_launch`, :func:`torch_launch`
make one), so the same logic serves MLX on Metal, CUDA and the emulator and PyTorch's arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: The second fill: finite, negative and at float32's edge, a value no tail writes (float16
#: outputs take it as -inf, still a value a correct kernel does not produce there).
SENTINEL = float(np.float32(-3.0e38))

#: How many unwritten elements a message lists by index (the count is always given).
LISTED = 6


class UncoveredOutput(RuntimeError):
    """A launch left elements of an output unwritten: ``output`` (its name), ``indices``
    (flat), ``size`` (the output's elements); the message names the first of them."""

    def __init__(self, output: str, indices: np.ndarray, shape: tuple[int, ...]) -> None:
        self.output, self.indices, self.shape = output, np.asarray(indices), tuple(shape)
        super().__init__(describe_unwritten(output, self.indices, self.shape))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def host(a: Any) -> np.ndarray:
    """``a`` (numpy, MLX, or a PyTorch tensor on any device) as numpy, on the host."""
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.startswith("torch"):
        t = a.detach().to("cpu")
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
    return np.asarray(a)


def never_written(nan_filled: Any, sentinel_filled: Any) -> np.ndarray:
    """The flat indices of the elements a launch did not write: NaN in its output when every
    output was filled with NaN first, :data:`SENTINEL` when filled with that (an element the
    launch wrote holds the launch's value in both)."""
    a = host(nan_filled).reshape(-1)
    b = host(sentinel_filled).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"sentinel_filled: must have the shape of nan_filled {a.shape}, got {b.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        return np.empty(0, dtype=np.int64)  # an integer output cannot hold the NaN fill
    with np.errstate(over="ignore"):
        mark = np.asarray(SENTINEL, dtype=np.float64).astype(b.dtype)
    return np.flatnonzero(np.isnan(a) & (b == mark))


def describe_unwritten(output: str, indices: np.ndarray, shape: tuple[int, ...]) -> str:
    """In words: how many of ``output``'s elements were never written, and the first by index."""
    size = int(np.prod(shape, dtype=np.int64))
    first = [np.unravel_index(int(i), shape) if len(shape) > 1 else (int(i),) for i in indices[:LISTED]]
    where = ", ".join(str(tuple(int(v) for v in ix)) if len(ix) > 1 else str(int(ix[0])) for ix in first)
    more = f" and {len(indices) - LISTED} more" if len(indices) > LISTED else ""
    return (
        f"output {output!r}: {len(indices)} of {size} elements never written by the launch "
        f"(index {where}{more}): its grid or its loop bounds do not cover them"
    )


def covered_launch(launch: Callable[[float], Sequence[Any]], names: Sequence[str]) -> list[Any]:
    """``launch(fill)`` (every output filled with ``fill``, then the kernel run and its outputs
    returned, evaluated) with NaN; where an output holds a NaN, once more with
    :data:`SENTINEL`. The NaN-filled launch's outputs, or :class:`UncoveredOutput` for the
    first output (in ``names``' order) with an element neither launch wrote."""
    outs = list(launch(float("nan")))
    if len(outs) != len(names):
        raise ValueError(f"names: must name each of the launch's {len(outs)} outputs, got {list(names)}")
    firsts = [host(o) for o in outs]
    if not any(np.issubdtype(a.dtype, np.floating) and np.isnan(a).any() for a in firsts):
        return outs
    firsts = [a.copy() for a in firsts]  # the second launch may reuse the first's buffers
    again = [host(o) for o in launch(SENTINEL)]
    for name, a, b in zip(names, firsts, again):
        idx = never_written(a, b)
        if len(idx):
            raise UncoveredOutput(name, idx, a.shape)
    return outs


def mlx_launch(kernel: Any, inputs: Sequence[Any], kw: dict[str, Any]) -> Callable[[float], list[Any]]:
    """A launch of an ``mx.fast.metal_kernel`` / ``cuda_kernel`` object (or the emulator's
    drop-in) as :func:`covered_launch` takes it: its outputs filled by MLX's ``init_value``."""
    import mlx.core as mx

    def run(fill: float) -> list[Any]:
        outs = kernel(inputs=list(inputs), init_value=fill, **kw)
        mx.eval(*outs)
        return list(outs)

    return run


def torch_launch(run: Callable[[], Any], outputs: Sequence[Any]) -> Callable[[float], list[Any]]:
    """A launch that writes into PyTorch tensors the caller made (``run()`` launches it on
    ``outputs``) as :func:`covered_launch` takes it: each output ``fill_``-ed first, the
    device synchronized after."""

    def launch(fill: float) -> list[Any]:
        for o in outputs:
            o.fill_(fill)
        run()
        for o in outputs:
            if getattr(o, "is_cuda", False):
                import torch

                torch.cuda.synchronize(o.device)
                break
        return list(outputs)

    return launch
