"""Races caught by default: with MLX's own call signature (no option) the drop-in, and
``fused_tail(backend="metal-emulated")``, run two schedules (SIMD-groups in step, and apart) and compare
their bits (``metal_emulation.DEFAULT_SCHEDULES``), so a read of another SIMD-group's
partial with no barrier, and a dropped threadgroup barrier, raise
``ScheduleDependenceError``; one schedule by name still runs alone (and misses them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from workbench import fused_tail, seed_case
from workbench.kernels import metal_emulation
from workbench.kernels import source as kernel_source
from workbench.kernels.metal_drop_in import metal_kernel
from workbench.kernels.run import METAL_EMULATED, run_kernel_tail
from workbench.tail import tail_launch

pytestmark = pytest.mark.skipif(metal_emulation.clang_path() is None, reason="needs clang++")

#: A user-style row sum: each SIMD-group sums its part and writes it to group memory; SIMD-group
#: 0 then adds the partials -- with the barrier between the two dropped.
RACY_ROW_SUM = """
    threadgroup float partial[4];
    uint lid = thread_position_in_threadgroup.x;
    float s = simd_sum(inp[threadgroup_position_in_grid.x * 128 + lid]);
    if (thread_index_in_simdgroup == 0) partial[simdgroup_index_in_threadgroup] = s;
    if (simdgroup_index_in_threadgroup == 0) {
        float v = thread_index_in_simdgroup < 4 ? partial[thread_index_in_simdgroup] : 0.0f;
        v = simd_sum(v);
        if (thread_index_in_simdgroup == 0) out[threadgroup_position_in_grid.x] = v;
    }
"""


def _row_sum(source: str, **options: object) -> np.ndarray:
    kernel = metal_kernel(name="row_sum", input_names=["inp"], output_names=["out"], source=source)
    x = mx.array(np.arange(512, dtype=np.float32) / 512)
    (out,) = kernel(
        inputs=[x],
        grid=(512, 1, 1),
        threadgroup=(128, 1, 1),
        output_shapes=[(4,)],
        output_dtypes=[mx.float32],
        **options,
    )
    return np.array(out)


def test_a_read_of_another_simd_groups_partial_is_caught_with_mlx_s_call_signature():
    with pytest.raises(metal_emulation.ScheduleDependenceError, match="'out'"):
        _row_sum(RACY_ROW_SUM)


def test_one_schedule_by_name_still_runs_alone_and_the_fixed_kernel_passes_by_default():
    truth = (np.arange(512, dtype=np.float64) / 512).reshape(4, 128).sum(axis=1)
    # SIMD-groups in step, the highest first: every partial is written before SIMD-group 0 reads
    # it, so this one schedule alone passes the racy kernel
    np.testing.assert_allclose(_row_sum(RACY_ROW_SUM, order="descending"), truth, rtol=1e-6)
    fixed = RACY_ROW_SUM.replace(
        "    if (simdgroup_index_in_threadgroup == 0) {",
        "    threadgroup_barrier(mem_flags::mem_threadgroup);\n    if (simdgroup_index_in_threadgroup == 0) {",
    )
    np.testing.assert_allclose(_row_sum(fixed), truth, rtol=1e-6)


def test_fused_tail_on_the_emulated_backend_runs_the_default_schedules(monkeypatch):
    """``fused_tail(backend="metal-emulated")``, no option: every launch in both schedules."""
    seen: list[str] = []
    launch = metal_emulation.EmulatedKernel.launch

    def spy(self, *args, order="ascending", **kw):
        seen.append(order)
        return launch(self, *args, order=order, **kw)

    monkeypatch.setattr(metal_emulation.EmulatedKernel, "launch", spy)
    c = seed_case()
    fused_tail(c.weights, c.branch, c.residual, backend="metal-emulated")
    assert seen == list(metal_emulation.DEFAULT_SCHEDULES) * 3


def test_a_dropped_barrier_is_caught_by_the_emulated_backend_s_tail(tmp_path: Path):
    """rms_prologue's closing barrier dropped (gate_up reads the normed vector other
    SIMD-groups write) in a copy of ``kernels/``: caught by the tail ``fused_tail(backend=
    "metal-emulated")`` runs (``run_kernel_tail``, here given the copy), with no option."""
    folder = tmp_path / "kernels"
    shutil.copytree(kernel_source.KERNEL_DIR, folder)
    common = folder / "common.h"
    old = "      xs4[i4] = norm4(v, inv, n);\n    }\n  }\n  GROUP_BARRIER();\n}"
    text = common.read_text()
    assert text.count(old) == 1
    common.write_text(text.replace(old, "      xs4[i4] = norm4(v, inv, n);\n    }\n  }\n}"))
    c = seed_case()
    launch = tail_launch(c.weights)
    run_kernel_tail(METAL_EMULATED, launch, c.branch, c.residual)  # the kernels as they are: no race
    with pytest.raises(metal_emulation.ScheduleDependenceError, match="'act'"):
        run_kernel_tail(METAL_EMULATED, launch, c.branch, c.residual, kernel_dir=folder)
