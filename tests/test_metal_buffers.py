"""The emulator's device buffers, kept from launch to launch: a reused buffer is byte for
byte a fresh one (the data the launch asked for, NaN-filled outputs, zeros before the data
in its first page, the guard page right after it), so no launch reads what an earlier one
left, and an access one element past the end still faults.

Oracle: the values each launch wrote or was given, exactly; unwritten output elements NaN.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends, seed_case
from workbench import tail as T
from workbench.kernels import emulated as KE
from workbench.kernels import launch as KL
from workbench.kernels import metal_emulation as ME
from workbench.kernels.metal_drop_in import metal_kernel

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

#: Copies x to out: 1000 floats fill most of a page in both buffers.
COPY = """
    uint i = thread_position_in_grid.x;
    out[i] = x[i];
"""

#: Reads the K floats BEFORE x's first element (out of bounds below: no guard there, but on
#: a fresh mapping they are zero) and writes only the first half of out.
READS_BEFORE = """
    uint i = thread_position_in_grid.x;
    float v = x[int(i) - K];
    if (i < N / 2) {
        out[i] = v;
    }
"""

#: Reads one element past x's end: the guard page.
READS_PAST = """
    uint i = thread_position_in_grid.x;
    out[i] = x[i + 1];
"""


def _run(name: str, source: str, x: np.ndarray, template=None) -> np.ndarray:
    kernel = metal_kernel(name=name, input_names=["x"], output_names=["out"], source=source)
    (out,) = kernel(
        inputs=[mx.array(x)],
        template=template or [],
        grid=(x.size, 1, 1),
        threadgroup=(x.size, 1, 1),
        output_shapes=[x.shape],
        output_dtypes=[mx.float32],
    )
    return np.array(out)


def test_a_reused_buffer_shows_nothing_an_earlier_launch_left():
    """The first launch fills two one-page buffers with 7s; the second takes one-page
    buffers too, with its data at their ends: below the data it must read zeros, and the
    half of out it never writes must be NaN, as on fresh mappings."""
    big = np.full(1000, 7.0, np.float32)
    for _ in range(2):  # twice: the second round runs entirely on reused buffers
        np.testing.assert_array_equal(_run("copy_1000", COPY, big), big)
        out = _run("reads_before", READS_BEFORE, np.ones(64, np.float32), [("K", 64), ("N", 64)])
        np.testing.assert_array_equal(out[:32], np.zeros(32, np.float32))
        assert np.isnan(out[32:]).all(), out[32:]


def test_the_guard_page_still_faults_on_a_reused_buffer():
    x = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(_run("copy_256", COPY, x), x)
    for _ in range(2):  # a fault gives the buffers back too
        with pytest.raises(ME.EmulationError, match="memory fault"):
            _run("reads_past", READS_PAST, x)
    np.testing.assert_array_equal(_run("copy_256", COPY, x + 1), x + 1)


def test_a_repeated_launch_maps_no_memory():
    kernel = metal_kernel(name="copy_steady", input_names=["x"], output_names=["out"], source=COPY)
    x = np.arange(512, dtype=np.float32)
    call = {
        "inputs": [mx.array(x)],
        "grid": (512, 1, 1),
        "threadgroup": (256, 1, 1),
        "output_shapes": [(512,)],
        "output_dtypes": [mx.float32],
    }
    kernel(**call)
    before = ME.buffers_mapped()
    for order in ME.SCHEDULES:
        np.testing.assert_array_equal(np.array(kernel(**call, order=order)[0]), x)
    assert ME.buffers_mapped() == before


def test_launch_arguments_are_checked_on_every_launch():
    """Arguments once validated are remembered by value AND type: True is not 1 here."""
    launch = T.tail_launch(seed_case().weights)
    kernel = ME.compile_source(KE.emulated_tail_sources(launch)[2])
    prep = KL.prepared(launch, "metal")
    dn = prep.calls()["ffn_down"]
    ins = [np.ones(prep.ffn, np.float32), np.ones(prep.hidden, np.float32), *[np.array(a) for a in dn.consts]]
    threads = int(dn.kw["threadgroup"][0])
    groups = int(dn.kw["grid"][0]) // threads
    outs = [((prep.hidden,), np.float32)]
    (ref,) = kernel.launch(ins, outs, groups=groups, threads=threads)
    (again,) = kernel.launch(ins, outs, groups=np.int64(groups), threads=threads)  # a numpy integer is an integer
    np.testing.assert_array_equal(again, ref)
    kernel.launch(ins, outs, groups=1, threads=threads)
    with pytest.raises(ValueError, match="groups: must be an integer"):
        kernel.launch(ins, outs, groups=True, threads=threads)
    with pytest.raises(ValueError, match="seed"):
        kernel.launch(ins, outs, groups=groups, threads=threads, seed=-1)
    with pytest.raises(ValueError, match="order: must be one of"):
        kernel.launch(ins, outs, groups=groups, threads=threads, order=["ascending"])
