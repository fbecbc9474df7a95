"""The one CUDA launch's shape (:class:`OneLaunchShape`) and the policy that picks it for a
prepared tail (:func:`shape_for`), beside ``workbench.kernels.one_launch`` which runs it.

The policy is a pure function of the tail's weight formats and sizes; there is no module
default to change. A caller that wants another shape passes it
(``fused_tail(..., shape=...)``, ``one_launch.for_launch(..., shape=...)``), so what a
call runs is always in its arguments. The measurements behind the 4-bit shape are in
docs/JOURNAL.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from workbench import validate
from workbench.fold.formats import Format
from workbench.kernels.launch import PreparedTail
from workbench.kernels.tuning import MAX_GROUP_THREADS, MAX_UNITS

#: Threads a group of the one launch, by default (every phase runs with the same groups).
DEFAULT_NT = 512

#: Threads a group where any of the tail's weights is 4-bit (:func:`shape_for_formats`): the
#: 4-bit launches wait on the ALU pipe, and 20 warps an SM instead of 16 hide more of its
#: latency. Still one group an SM, so always resident. A format takes this shape only once
#: two sweeps agree and compute-sanitizer has run its one launch in it.
FOUR_BIT_NT = 640

#: 16-byte units a lane of wo and gate_up loads before using any, in ``KernelTuning``'s
#: terms (``u_wo`` / ``u_gate_up``: 8 is two 4-bit units), where the tail's weights are
#: 4-bit: the 4-bit row dots wait on their loads' latency more than on bytes, and two units
#: in flight a lane fit the registers of a 640-thread group.
FOUR_BIT_ROW_UNITS = 8


@dataclass(frozen=True)
class OneLaunchShape:
    """Group size and grid of the one launch: ``nt`` threads a group, ``groups_per_sm``
    groups an SM (1 is always resident: ``one_launch.OneLaunchTail`` says why), ``down_rows`` rows of
    down a group at a time (its reads of act shared by them), ``sm_count`` (None: the
    driver's), ``row_units`` the 16-byte units a lane of wo and gate_up loads before
    using any, as ``KernelTuning.u_wo`` / ``u_gate_up`` count them (None: the prepared
    tail's tuning), ``groups`` the most groups in the grid (None: ``groups_per_sm`` x the
    SM count; fewer is as safe, every group still resident, and a small tail has fewer
    rows than the full grid has warps)."""

    nt: int = DEFAULT_NT
    groups_per_sm: int = 1
    down_rows: int = 4
    sm_count: int | None = None
    row_units: int | None = None
    groups: int | None = None

    def __post_init__(self) -> None:
        nt = validate.integer("nt", self.nt, minimum=32, maximum=MAX_GROUP_THREADS)
        if nt % 32:
            raise ValueError(f"nt: must be a multiple of 32 (whole warps) in 32..1024, got {nt}")
        validate.integer("groups_per_sm", self.groups_per_sm, minimum=1, maximum=4)
        rows = validate.integer("down_rows", self.down_rows, minimum=1, maximum=8)
        if rows & (rows - 1):
            raise ValueError(f"down_rows: must be 1, 2, 4 or 8 (rows of down a group takes at a time); got {rows}")
        if self.sm_count is not None:
            validate.integer("sm_count", self.sm_count, minimum=1)
        if self.row_units is not None:
            validate.integer("row_units", self.row_units, minimum=1, maximum=MAX_UNITS)
        if self.groups is not None:
            validate.integer("groups", self.groups, minimum=1)


def checked_shape(shape: OneLaunchShape | None) -> OneLaunchShape | None:
    """``shape`` (a :class:`OneLaunchShape` or None: the policy's), or ValueError."""
    if shape is not None and not isinstance(shape, OneLaunchShape):
        raise ValueError(f"shape: must be a OneLaunchShape or None, got {validate.describe(shape)}")
    return shape


def shape_for(prep: PreparedTail) -> OneLaunchShape:
    """The shape ``fused_tail(backend="cuda")`` runs a prepared tail's one launch in, where
    its caller names none: :func:`shape_for_formats` of its four matrices' formats with
    :func:`groups_for`'s grid."""
    shape = shape_for_formats(m.format for m in (prep.wo, prep.gate, prep.up, prep.down))
    return dataclasses.replace(shape, groups=groups_for(prep, shape))


def groups_for(prep: PreparedTail, shape: OneLaunchShape) -> int | None:
    """The most groups any phase of ``prep``'s tail can keep busy at ``shape``, or None
    where that is the whole grid or more: wo takes a warp a row (hidden rows), gate_up a
    warp a row pair (ffn), down a group ``shape.down_rows`` rows (hidden / down_rows). A
    group past that count only adds an arrival at each grid barrier; at Bonsai-27B's
    shape every phase fills the grid, so the rule changes nothing there."""
    warps = shape.nt // 32
    busy = max(-(-prep.hidden // warps), -(-prep.ffn // warps), -(-prep.hidden // shape.down_rows))
    sms = shape.sm_count if shape.sm_count is not None else None
    if sms is not None and busy >= sms * shape.groups_per_sm:
        return None
    return busy


def shape_for_formats(formats: Iterable[Format]) -> OneLaunchShape:
    """The one launch's shape for a tail whose matrices have the weight formats ``formats``
    (``workbench.fold.formats``): one group an SM (always resident); where any is 4-bit,
    :data:`FOUR_BIT_NT` threads a group and :data:`FOUR_BIT_ROW_UNITS` units in flight a
    lane of wo and gate_up, else :data:`DEFAULT_NT` threads and the prepared tail's
    tuning. Raises ``ValueError`` for anything but formats the kernels read."""
    fmts = list(formats)
    unknown = [f for f in fmts if not (isinstance(f, Format) and f.served)]
    if unknown or not fmts:
        raise ValueError(
            f"formats: must be at least one weight format the kernels read (a Format of "
            f"workbench.fold.formats.KERNEL_FORMATS), got {fmts!r}"
        )
    if any(f.bits == 4 for f in fmts):
        return OneLaunchShape(nt=FOUR_BIT_NT, row_units=FOUR_BIT_ROW_UNITS)
    return OneLaunchShape(nt=DEFAULT_NT)
