"""The fused tail as three GPU launches, prepared once: ``kernels/`` sources into
``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel``, with every constant on the device.

One tail is three launches encoded in ONE evaluation, as frink-models' ``launch_attn_tail``
encodes them in one command buffer: ``wo_residual`` (``h = residual + wo' R x``),
``ffn_gate_up`` (``act = silu(gate n) * up n``, ``n = rms_norm(h) * ffn_norm``) and
``ffn_down`` (``h + down act``). This module decides which values the launches take
(weight formats, shapes, the fold's plan) from a ``workbench.kernels.contract.TailLaunch``
and builds them (:func:`prepare_tail`; :func:`prepared` keeps one per contract owner,
held weakly by it, so the constants stay on the device exactly as long as the weights).
It chooses no backend: ``workbench.kernels.run`` is the door every launch goes through.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from workbench.fold.rotation import FoldPlan, FoldSite
from workbench.kernels import source as kernel_source
from workbench.kernels import tuning as kernel_tuning
from workbench.kernels.contract import TailLaunch, check_launch
from workbench.kernels.matrices import (
    KernelMatrix,
    check_threadgroup_memory,
    check_width,
    kernel_matrix,
    units_for,
)
from workbench.kernels.tuning import KernelTuning, grid_size

#: The backends of ``fused_tail`` that run these kernels; each name is also the dialect
#: its sources are composed in (``kernel_source.DIALECTS``).
KERNEL_BACKENDS: tuple[str, ...] = kernel_source.DIALECTS


def settle_constants(*arrays: mx.array) -> None:
    """Evaluate a prepared launch's constants (weights, scales, tables, norms) now, before
    any ``mx.compile`` traces a call that uses them.

    The rule, held here once for every prepared launch (``PreparedTail``, ``OneLaunchTail``,
    ``workbench.decode.matvec.Launch``, the graph tail): ``mx.compile`` captures a constant
    that is still lazy together with the ops that make it (a scale widened to float32, the
    rotation's index table), and a traced call then runs those ops again on every call, a
    kernel each. An evaluated constant is captured as data."""
    mx.eval(*arrays)


@lru_cache(maxsize=64)
def compiled_kernel(dialect: str, kernel: str, kernel_dir: Path | None = None) -> Any:
    """The MLX kernel object for ``kernel`` in ``dialect``, its bodies read from
    ``kernel_dir`` (default: ``kernels/``); built once per the three (keyed by value and
    bounded: a few kernels in two dialects, and the folders a benchmark compares)."""
    spec = kernel_source.KERNELS[kernel]
    text = kernel_source.dialect_text(dialect)
    # MLX keys its compiled kernels by name and template values only: another folder's
    # sources under the plain name would run whichever was compiled first.
    name = kernel_source.mlx_name(kernel, kernel_dir=kernel_dir)
    header, source = kernel_source.compose(dialect, kernel, kernel_dir=kernel_dir)
    if text.compact:  # the header in a file, the source without comments (DialectText.compact)
        header, source = kernel_source.cuda_launch_text(header, source)
    make = getattr(mx.fast, text.maker)
    return make(
        name=name,
        input_names=list(spec.inputs),
        output_names=list(spec.outputs),
        source=source,
        header=header,
        ensure_row_contiguous=True,
    )


def rotation_template(plan: FoldPlan | None, width: int) -> dict[str, Any]:
    """The fold plan's arrays and template values (identity ones without a fold)."""
    if plan is None:
        return {
            "sdest": 2 * mx.arange(width, dtype=mx.int32),
            "table": mx.ones((8,), dtype=mx.int8),
            "ROT": False,
            "M": 1,
            "LOGP": 0,
            "scale": 1.0,
        }
    table = np.zeros(max(8, plan.m * plan.m), dtype=np.int8)
    table[: plan.m * plan.m] = np.asarray(plan.table, dtype=np.int8).reshape(-1)
    return {
        "sdest": mx.array(sdest(plan)),
        "table": mx.array(table),
        "ROT": True,
        "M": int(plan.m),
        "LOGP": int(plan.k),
        "scale": plan.scale,
    }


def sdest(plan: FoldPlan) -> np.ndarray:
    """What the kernels take for the signs and the permutation: ``2 dest[p] + (signs[p] < 0)``.

    ``dest`` is the inverse permutation (``dest[perm[i]] = i``): the kernels scatter
    ``signs[p] * x[p]`` to ``dest[p]`` in group memory, which makes every read of device
    memory coalesced; the sign rides in the low bit (one array read instead of two).
    """
    dest = np.argsort(np.asarray(plan.perm)).astype(np.int64)
    return (2 * dest + (np.asarray(plan.signs) < 0)).astype(np.int32)


def params_array(eps: float, scale: float) -> mx.array:
    """The launches' scalars as one array (eight floats: see ``matrices.dummy_array``)."""
    p = np.zeros(8, dtype=np.float32)
    p[0], p[1] = eps, scale
    return mx.array(p)


class KernelCall(NamedTuple):
    """One launch, ready but for its activations: the MLX kernel, the constant inputs (in
    the kernel's input order, the activations left out) and the launch's keyword arguments
    (template, grid, threadgroup, output shapes and dtypes)."""

    kernel: Any
    consts: list[mx.array]
    kw: dict[str, Any]


@dataclass
class PreparedTail:
    """A tail's three launches with every constant already an ``mx.array``.

    Call it with ``branch`` [branch] and ``residual`` [hidden] (float32 ``mx.array``) to
    get the lazy output; nothing is evaluated here, so a caller encodes the three
    launches in one evaluation (or several tails in one, for timing).
    """

    dialect: str
    hidden: int
    branch_dim: int
    ffn: int
    wo: KernelMatrix
    gate: KernelMatrix
    up: KernelMatrix
    down: KernelMatrix
    rot: dict
    norm: mx.array
    params: mx.array
    tuning: KernelTuning = field(default_factory=KernelTuning)
    kernel_dir: Path | None = None
    #: What the CPU emulator made of these launches, by the clang that compiled them
    #: (``workbench.kernels.emulated``): it lives and dies with this prepared tail.
    emulated_plans: dict = field(default_factory=dict, repr=False, compare=False)

    def weight_bytes(self) -> int:
        """Bytes of every weight the three launches read (codes, scales and biases where quantized)."""
        return int(sum(m.nbytes for m in (self.wo, self.gate, self.up, self.down)) + self.norm.nbytes)

    def templates(self) -> dict[str, list[tuple[str, Any]]]:
        """The template values of the three launches (what the generated source is checked for)."""
        t, wo, g, d = self.tuning, self.wo, self.gate, self.down
        return {
            "wo_residual": [
                ("NT", t.wo_nt),
                ("FMT", wo.fmt),
                ("SFMT", wo.sfmt),
                ("GS", wo.gs),
                ("QI", wo.qi),
                ("WIDTH", self.branch_dim),
                ("ROWS", self.hidden),
                ("ROT", bool(self.rot["ROT"])),
                ("M", self.rot["M"]),
                ("LOGP", self.rot["LOGP"]),
                ("U", units_for(wo.fmt, t.u_wo)),
                ("PRE", bool(t.pre_wo)),
            ],
            "ffn_gate_up": [
                ("NT", t.rows_nt),
                ("FMT", g.fmt),
                ("SFMT", g.sfmt),
                ("GS", g.gs),
                ("QI", g.qi),
                ("HID", self.hidden),
                ("FFN", self.ffn),
                ("U", units_for(g.fmt, t.u_gate_up)),
                ("PRE", bool(t.pre_gate_up)),
            ],
            "ffn_down": [
                ("NT", t.down_nt),
                ("FMT", d.fmt),
                ("SFMT", d.sfmt),
                ("GS", d.gs),
                ("QI", d.qi),
                ("HID", self.hidden),
                ("FFN", self.ffn),
                ("U", max(1, units_for(d.fmt, t.u_down) // t.down_rows)),
                ("DR", t.down_rows),
            ],
        }

    def __post_init__(self) -> None:
        # Everything but the activations, computed once: a launch then costs MLX's own
        # work and little Python (the per-wait overhead is what the benchmark measures).
        t, tp = self.tuning, self.templates()
        wo, g, u, d = self.wo, self.gate, self.up, self.down
        settle_constants(
            self.rot["sdest"],
            self.rot["table"],
            self.norm,
            self.params,
            *(a for m in (wo, g, u, d) for a in (m.w, m.s, m.b)),
        )
        self._wo = KernelCall(
            compiled_kernel(self.dialect, "wo_residual", self.kernel_dir),
            [self.rot["sdest"], self.rot["table"], self.params, wo.w, wo.s, wo.b],
            dict(
                template=tp["wo_residual"],
                grid=(grid_size(self.hidden, t.wo_nt, t, t.wo_groups_per_sm), 1, 1),
                threadgroup=(t.wo_nt, 1, 1),
                output_shapes=[(self.hidden,)],
                output_dtypes=[mx.float32],
            ),
        )
        self._gu = KernelCall(
            compiled_kernel(self.dialect, "ffn_gate_up", self.kernel_dir),
            [self.norm, self.params, g.w, g.s, g.b, u.w, u.s, u.b],
            dict(
                template=tp["ffn_gate_up"],
                grid=(grid_size(self.ffn, t.rows_nt, t, t.gu_groups_per_sm), 1, 1),
                threadgroup=(t.rows_nt, 1, 1),
                output_shapes=[(self.ffn,)],
                output_dtypes=[mx.float32],
            ),
        )
        self._dn = KernelCall(
            compiled_kernel(self.dialect, "ffn_down", self.kernel_dir),
            [d.w, d.s, d.b],
            dict(
                template=tp["ffn_down"],
                grid=(self.hidden // t.down_rows * t.down_nt, 1, 1),
                threadgroup=(t.down_nt, 1, 1),
                output_shapes=[(self.hidden,)],
                output_dtypes=[mx.float32],
            ),
        )

    def calls(self) -> dict[str, KernelCall]:
        """The three launches by kernel name (``kernel_source.TAIL_KERNELS``' order): what
        a launch passes besides its activations, for code that runs them another way
        (the CPU emulation, a decode step's own chain)."""
        return {"wo_residual": self._wo, "ffn_gate_up": self._gu, "ffn_down": self._dn}

    def launch_wo(self, branch: mx.array, residual: mx.array, *, verbose: bool = False) -> mx.array:
        """Launch 1, lazily: ``h = residual + wo' (R branch)``."""
        k, consts, kw = self._wo
        return k(inputs=[branch, *consts, residual], verbose=verbose, **kw)[0]

    def launch_gate_up(self, h: mx.array, *, verbose: bool = False) -> mx.array:
        """Launch 2, lazily: ``act = silu(gate n) * up n``, ``n = rms_norm(h) * ffn_norm``."""
        k, consts, kw = self._gu
        return k(inputs=[h, *consts], verbose=verbose, **kw)[0]

    def launch_down(self, act: mx.array, h: mx.array, *, verbose: bool = False) -> mx.array:
        """Launch 3, lazily: ``h + down act``."""
        k, consts, kw = self._dn
        return k(inputs=[act, h, *consts], verbose=verbose, **kw)[0]

    def compiled(self) -> Callable[[mx.array, mx.array], mx.array]:
        """``self`` traced once by ``mx.compile``: the same launches with less Python a call."""
        if getattr(self, "_compiled", None) is None:
            self._compiled = mx.compile(lambda b, r: self(b, r))
        return self._compiled

    def __call__(self, branch: mx.array, residual: mx.array, *, verbose: bool = False) -> mx.array:
        """The tail's three launches, lazily (evaluate the result once: one submission)."""
        h = self.launch_wo(branch, residual, verbose=verbose)
        act = self.launch_gate_up(h, verbose=verbose)
        return self.launch_down(act, h, verbose=verbose)


def prepare_tail(
    launch: TailLaunch, dialect: str, tuning: KernelTuning | None = None, *, kernel_dir: Path | None = None
) -> PreparedTail:
    """The kernel form of a ``workbench.kernels.contract.TailLaunch`` (from ``tail.tail_launch``).

    ``kernel_dir``: the folder the kernel bodies are read from (default: ``kernels/``), so
    that a benchmark can prepare the same launch from two source folders and compare them
    in one run.

    Raises ``ValueError`` for what the kernels do not serve: a weight format other than
    float32 / bfloat16 / affine 4- or 8-bit / mxfp4 / nvfp4, a fold on wo at its OUTPUT
    site (frink-models' plan rotates wo's input), folds on the FFN matrices, widths over
    8192 or not multiples of 8, and for Metal a launch over Apple GPUs' 32 KB of
    threadgroup memory.
    """
    kernel_source.check_dialect(dialect)
    check_launch(launch)
    tuning = kernel_tuning.checked_tuning(tuning)
    if launch.fold is not None and launch.fold.site is not FoldSite.INPUT:
        raise ValueError(
            "wo's fold must be at its INPUT site for the kernels (they rotate wo's input, as "
            "frink-models' metal_plan(branch.len()) does); got site OUTPUT"
        )
    wo = kernel_matrix("wo", launch.wo)
    gate, up, down = (
        kernel_matrix("gate", launch.gate),
        kernel_matrix("up", launch.up),
        kernel_matrix("down", launch.down),
    )
    hidden, branch_dim, ffn = wo.rows, wo.cols, gate.rows
    check_width("branch (wo's in dimension)", branch_dim)
    check_width("hidden", hidden)
    if ffn % 8:
        raise ValueError(f"ffn ({ffn}) must be a multiple of 8")
    if (gate.fmt, gate.sfmt, gate.gs, gate.qi) != (up.fmt, up.sfmt, up.gs, up.qi):
        raise ValueError("gate and up must have the same format (one launch reads both)")
    rot = rotation_template(launch.fold_plan, branch_dim)
    prep = PreparedTail(
        dialect,
        hidden,
        branch_dim,
        ffn,
        wo,
        gate,
        up,
        down,
        rot,
        launch.ffn_norm.astype(mx.float32),
        params_array(launch.eps, rot["scale"]),
        kernel_tuning.checked_tuning(tuning),
        None if kernel_dir is None else Path(kernel_dir),
    )
    if kernel_source.dialect_text(dialect).group_memory_checked:
        for kernel, width in (
            ("wo_residual", f"branch ({branch_dim})"),
            ("ffn_gate_up", f"hidden ({hidden})"),
            ("ffn_down", f"hidden ({hidden})"),
        ):
            check_threadgroup_memory(kernel, prep.templates()[kernel], width)
    return prep


#: Prepared tails per contract owner (the weights), held weakly: they live as long as the
#: weights do; within an owner, one per dialect, tuning and kernel folder.
_PREPARED: weakref.WeakKeyDictionary[Any, dict[tuple, PreparedTail]] = weakref.WeakKeyDictionary()


def prepared(
    launch: TailLaunch, dialect: str, tuning: KernelTuning | None = None, *, kernel_dir: Path | None = None
) -> PreparedTail:
    """:func:`prepare_tail`, made once per contract owner, dialect, tuning and kernel
    folder (the constants then stay on the device, as an engine keeps them); a contract
    without an owner is prepared anew on every call."""
    tuning = kernel_tuning.checked_tuning(tuning)
    kernel_dir = None if kernel_dir is None else Path(kernel_dir)
    if launch.owner is None:
        return prepare_tail(launch, dialect, tuning, kernel_dir=kernel_dir)
    per = _PREPARED.setdefault(launch.owner, {})
    key = (dialect, tuning, kernel_dir)
    if key not in per:
        per[key] = prepare_tail(launch, dialect, tuning, kernel_dir=kernel_dir)
    return per[key]


def as_mx32(a: Any) -> mx.array:
    """``a`` (numpy or MLX) as a float32 ``mx.array``."""
    return a.astype(mx.float32) if isinstance(a, mx.array) else mx.array(np.asarray(a, dtype=np.float32))
