"""How the kernels' launches are shaped: group sizes, grids, loads in flight, and the
hardware limits they must respect.

:class:`KernelTuning` holds every choice a launch makes that changes its speed and never
its result; :data:`DEFAULT_TUNING` is what a launch that names none uses. It is a
constant: a caller that wants another tuning passes it (``fused_tail(..., tuning=...)``),
so what a call runs is always in its arguments, never in state another caller changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from workbench import validate

#: The most floats one group stages in group memory (Metal's 32 KB threadgroup limit;
#: the same algorithm runs on CUDA, so the same limit holds there).
MAX_GROUP_FLOATS = 8192

#: The most threads one group may have (Metal's and CUDA's limit alike).
MAX_GROUP_THREADS = 1024

#: The most 16-byte units a lane may load before using any (``KernelTuning.u_*``): the
#: loads are held in registers, and the tuning sweep never went past 16.
MAX_UNITS = 64

#: Apple GPUs' threadgroup memory a group, in bytes: every Metal launch is checked
#: against it (``workbench.kernels.matrices.threadgroup_bytes``), since a pipeline over
#: it fails to build.
METAL_THREADGROUP_LIMIT = 32768


@dataclass(frozen=True)
class KernelTuning:
    """Group sizes and grids of the launches (defaults tuned on the H200, 132 SMs).

    ``rows_nt`` threads a group of gate/up, ``wo_nt`` / ``head_nt`` of wo and the head
    launch (one warp a row in all three). wo and the head rotate their input in group
    memory first (24 KB for Bonsai): done by every group, so they run two 512-thread
    groups an SM (many small groups would repeat that rotation's group-memory traffic;
    1024 threads would cap registers at 64 a thread, which the m = 28 mixing reaches).
    Their grids: ``*_groups_per_sm`` x ``sm_count`` groups at most, each staging its input
    vector once and its warps striding over the rows; 0 means no cap (one row a warp,
    the hardware scheduling the groups). ``u_*`` the 16-byte units each lane loads before
    using any; ``down_nt`` threads a group of down, ``down_rows`` rows a group (each
    thread's reads of act then serve them all; its ``u_down`` units in flight are shared
    among them, ``u_down / down_rows`` a row). ``pre_*``: load the
    first batch before the prologue, so device memory is busy while every group builds
    its input vector (costs registers held across the prologue).
    """

    rows_nt: int = 256
    wo_nt: int = 512
    head_nt: int = 512
    wo_groups_per_sm: int = 2
    gu_groups_per_sm: int = 0
    head_groups_per_sm: int = 2
    sm_count: int | None = None
    u_wo: int = 4
    u_gate_up: int = 4
    u_head: int = 4
    down_nt: int = 64
    u_down: int = 16
    down_rows: int = 1
    pre_wo: bool = True
    pre_gate_up: bool = False
    pre_head: bool = True

    def __post_init__(self) -> None:
        # Threads a group: whole warps (the kernels reduce over NT / 32 warps; 16 would make
        # that 0 and the grid a division by zero), at most 1024 (Metal's and CUDA's limit).
        for name in ("rows_nt", "wo_nt", "head_nt", "down_nt"):
            nt = validate.integer(name, getattr(self, name), minimum=32, maximum=MAX_GROUP_THREADS)
            if nt % 32:
                raise ValueError(f"{name}: must be a multiple of 32 (whole warps) in 32..{MAX_GROUP_THREADS}, got {nt}")
            object.__setattr__(self, name, nt)
        for name in ("wo_groups_per_sm", "gu_groups_per_sm", "head_groups_per_sm"):
            object.__setattr__(self, name, validate.integer(name, getattr(self, name), minimum=0))
        for name in ("u_wo", "u_gate_up", "u_head", "u_down"):
            object.__setattr__(self, name, validate.integer(name, getattr(self, name), minimum=1, maximum=MAX_UNITS))
        # Rows a group of down: a power of two up to 8 (every hidden size the kernels take is a
        # multiple of 8, so the grid is always whole groups).
        rows = validate.integer("down_rows", self.down_rows, minimum=1, maximum=8)
        if rows & (rows - 1):
            raise ValueError(f"down_rows: must be 1, 2, 4 or 8 (rows a group of ffn_down); got {rows}")
        object.__setattr__(self, "down_rows", rows)
        for name in ("pre_wo", "pre_gate_up", "pre_head"):
            object.__setattr__(self, name, validate.flag(name, getattr(self, name)))
        if self.sm_count is not None:
            object.__setattr__(self, "sm_count", validate.integer("sm_count", self.sm_count, minimum=1))

    def sms(self) -> int:
        """The SM count the grids are capped by: ``sm_count``, else ``$WORKBENCH_SM_COUNT``, else 132."""
        if self.sm_count is not None:
            return int(self.sm_count)
        env = os.environ.get("WORKBENCH_SM_COUNT")
        if env:
            if not env.strip().isdigit() or int(env) < 1:
                raise ValueError(f"WORKBENCH_SM_COUNT: must be a positive integer (the GPU's SM count), got {env!r}")
            return int(env)
        return 132  # an H200 / H100 SXM; only the grid's size depends on it, never a result


#: The tuning used when none is given.
DEFAULT_TUNING = KernelTuning()


def checked_tuning(tuning: KernelTuning | None) -> KernelTuning:
    """``tuning``, or :data:`DEFAULT_TUNING` for None; ValueError for anything else."""
    if tuning is None:
        return DEFAULT_TUNING
    if not isinstance(tuning, KernelTuning):
        raise ValueError(
            "tuning: must be a KernelTuning (workbench.kernels.tuning.KernelTuning(...)) or None, "
            f"got {validate.describe(tuning)}"
        )
    return tuning


def grid_size(rows: int, nt: int, t: KernelTuning, groups_per_sm: int) -> int:
    """Threads in a row kernel's grid: one warp a row, at most ``groups_per_sm`` groups an SM (0: no cap)."""
    groups = -(-rows // (nt // 32))
    if groups_per_sm > 0:
        groups = min(groups, t.sms() * groups_per_sm)
    return max(1, groups) * nt
