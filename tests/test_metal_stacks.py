"""The emulator's fiber stacks: kept from launch to launch, yet every launch starts on
zeroed stacks (what a kernel reads from its private memory before writing it cannot depend
on an earlier launch), and a kernel whose private arrays reach below the open top of its
stack runs as it would on fresh stacks (the window opens at the first touch below it).

Oracle: numpy of the same float32 arithmetic in the same order, compared bit for bit (a
wrong or stale element would change the sum); unwritten private memory must read as zero.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.kernels import metal_emulation as ME
from workbench.kernels.metal_drop_in import metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

N, TG = 128, 64

#: Each thread fills a private array of P floats (P * 4 bytes of stack: 8 KB at 2048, two
#: pages below a one-page window), then sums a strided read of it.
BIG_PRIVATE = """
    uint i = thread_position_in_grid.x;
    float buf[P];
    volatile float* v = buf;  // kept in memory: the stack is really used
    for (uint k = 0; k < P; ++k) {
        v[k] = x[i] + float(k % 7);
    }
    float s = 0.0f;
    for (uint k = 0; k < P; k += 3) {
        s += v[k];
    }
    out[i] = s;
"""

#: Reads a private array it never wrote: on zeroed stacks, every read is 0.
READS_UNWRITTEN = """
    uint i = thread_position_in_grid.x;
    float buf[P];
    volatile float* v = buf;
    float s = 0.0f;
    for (uint k = 0; k < P; ++k) {
        s += v[k] * v[k];
    }
    out[i] = s + x[i] * 0.0f;
"""


def _x() -> np.ndarray:
    return np.random.default_rng(3).uniform(-1, 1, N).astype(np.float32)


def _launch(name: str, source: str, p: int, order: str = "ascending", n: int = N) -> np.ndarray:
    kernel = metal_kernel(name=name, input_names=["x"], output_names=["out"], source=source)
    (out,) = kernel(
        inputs=[mx.array(_x()[:n])],
        template=[("P", p)],
        grid=(n, 1, 1),
        threadgroup=(TG, 1, 1),
        output_shapes=[(n,)],
        output_dtypes=[mx.float32],
        order=order,
    )
    return np.array(out)


def _big_private_oracle(p: int) -> np.ndarray:
    """The kernel's own float32 arithmetic, term by term in its order (no contraction, no
    reassociation: clang runs with -ffp-contract=off and strict IEEE), so bit-exact."""
    k = np.arange(0, p, 3)
    terms = _x()[:, None] + (k % 7).astype(np.float32)[None, :]
    return np.add.accumulate(terms, axis=1, dtype=np.float32)[:, -1]


@pytest.mark.parametrize("p", [512, 2048, 8192])
def test_private_arrays_below_the_open_window_run_in_every_schedule(p):
    """8192 floats: 32 KB of stack, eight pages below a one-page window."""
    out = _launch(f"big_private_{p}", BIG_PRIVATE, p, order="every")
    np.testing.assert_array_equal(out, _big_private_oracle(p))
    np.testing.assert_array_equal(_launch(f"big_private_{p}", BIG_PRIVATE, p), out)  # again, window open


def test_a_launch_never_sees_what_an_earlier_launch_left_on_its_stacks():
    """One group, so every thread is the first on its stack this launch. (Within a launch a
    stack passes from a slot's thread in one group to the same slot's thread in the next,
    as it is: what the first left, and the runtime's own frames, are there.)"""
    _launch("leaves_data", BIG_PRIVATE, 4096)  # 16 KB of nonzero values on every stack used
    out = _launch("reads_unwritten", READS_UNWRITTEN, 4096, n=TG)
    assert np.array_equal(out, np.zeros(TG, np.float32)), out[:8]


def test_a_private_array_larger_than_the_stack_is_a_reported_fault_not_a_crash():
    """256 KB stacks: 80,000 floats (312 KB) run past the guard page below the stack."""
    with pytest.raises(ME.EmulationError, match="memory fault"):
        _launch(
            "too_big_private", BIG_PRIVATE.replace("for (uint k = 0; k < P; ++k)", "for (uint k = P; k-- > 0;)"), 80_000
        )
