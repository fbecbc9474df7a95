"""The fused tail as GPU kernels: ``kernels/`` sources into ``mx.fast.metal_kernel`` /
``mx.fast.cuda_kernel``, and the launches that run them.

One tail is three launches encoded in ONE evaluation, as frink-models' ``launch_attn_tail``
encodes them in one command buffer: ``wo_residual`` (``h = residual + wo' R x``),
``ffn_gate_up`` (``act = silu(gate n) * up n``, ``n = rms_norm(h) * ffn_norm``) and
``ffn_down`` (``h + down act``). The head launch (Q, K, V from ``attn_norm(hidden)``, one
shared rotation) is one more. ``workbench.kernels.source`` composes the sources; this
module decides which values the launches take (weight formats, shapes, the fold's plan)
and how big their grids are.

From :func:`workbench.tail.fused_tail` to a launch: ``fused_tail(backend="cuda")``
resolves the name with :func:`workbench.backends.resolve_backend` (which raises when the
device is absent), builds a :class:`workbench.tail.TailLaunch`, and calls
:func:`run_kernel_tail` with the backend's name as the dialect; that prepares the
launch once per weights object (:func:`prepared`) and evaluates the three launches.
Both kernel backends (:data:`KERNEL_BACKENDS`) always exist in code; only the device
decides whether one can run. ``fused_tail(backend="metal-emulated")`` prepares the same
Metal launches and runs them on the CPU (:func:`emulated_tail`: MLX's generated source
compiled by clang, executed by :mod:`workbench.kernels.metal_emulation`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import mlx.core as mx
import numpy as np

from workbench import backends, validate
from workbench.kernels import source as kernel_source
from workbench.models import config as model
from workbench.models import refusals
from workbench.fold.rotation import FoldPlan, FoldSite
from workbench.fold.weights import QuantizedBase, WeightMatrix

if TYPE_CHECKING:  # tail imports this module at its top; a runtime import back would be a circle
    from workbench.tail.paths import TailLaunch
    from workbench.tail.weights import TailWeights

#: The backends of ``fused_tail`` that run these kernels; each name is also the dialect
#: its sources are composed in (``kernel_source.DIALECTS``).
KERNEL_BACKENDS: tuple[str, ...] = kernel_source.DIALECTS

#: The most floats one group stages in group memory (Metal's 32 KB threadgroup limit;
#: the same algorithm runs on CUDA, so the same limit holds there).
MAX_GROUP_FLOATS = 8192

#: The most threads one group may have (Metal's and CUDA's limit alike).
MAX_GROUP_THREADS = 1024

#: The most 16-byte units a lane may load before using any (``KernelTuning.u_*``): the
#: loads are held in registers, and the tuning sweep never went past 16.
MAX_UNITS = 64

#: Apple GPUs' threadgroup memory a group, in bytes: every Metal launch is checked
#: against it (:func:`threadgroup_bytes`), since a pipeline over it fails to build.
METAL_THREADGROUP_LIMIT = 32768

#: The backend that compiles the Metal kernels with clang and runs them on the CPU
#: (:mod:`workbench.kernels.metal_emulation`): the same launches as ``"metal"``, emulated.
METAL_EMULATED = "metal-emulated"


@dataclass(frozen=True)
class KernelTuning:
    """Group sizes and grids of the launches (defaults tuned on the H200, 132 SMs).

    ``rows_nt`` threads a group of gate/up, ``wo_nt`` / ``head_nt`` of wo and the head
    launch (one warp a row in all three). wo and the head rotate their input in group
    memory first (24 KB for Bonsai): done by every group, so they run two 512-thread
    groups an SM (640 small groups cost ~40 us of shared-memory traffic when the rotation
    was ten passes through group memory; 1024 threads would cap registers at 64 a thread,
    which the m = 28 mixing reaches).
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


#: The tuning used when none is given (``bench.kernel_bench.run`` sets the best its sweep measured).
DEFAULT_TUNING = KernelTuning()


def set_default_tuning(tuning: KernelTuning) -> None:
    """Use ``tuning`` for every launch that names none (``fused_tail``'s kernel backends among them)."""
    global DEFAULT_TUNING
    if not isinstance(tuning, KernelTuning):
        raise ValueError(f"tuning must be a KernelTuning; got {type(tuning).__name__}")
    DEFAULT_TUNING = tuning


@lru_cache(maxsize=None)
def compiled_kernel(dialect: str, kernel: str, kernel_dir: Path | None = None) -> Any:
    """The MLX kernel object for ``kernel`` in ``dialect``, its bodies read from
    ``kernel_dir`` (default: ``kernels/``); built once per the three."""
    spec = kernel_source.KERNELS[kernel]
    # MLX keys its compiled kernels by name and template values only: another folder's
    # sources under the plain name would run whichever was compiled first.
    name = kernel_source.mlx_name(kernel, kernel_dir=kernel_dir)
    header, source = kernel_source.compose(dialect, kernel, kernel_dir=kernel_dir)
    if dialect == "metal":
        return mx.fast.metal_kernel(name=name, input_names=list(spec.inputs), output_names=list(spec.outputs),
                                    source=source, header=header, ensure_row_contiguous=True)
    return mx.fast.cuda_kernel(name=name, input_names=list(spec.inputs), output_names=list(spec.outputs),
                               source=source, header=header, ensure_row_contiguous=True)


@dataclass(frozen=True)
class KernelMatrix:
    """One weight matrix as a kernel takes it: format, the arrays, its shape."""

    fmt: int
    sfmt: int
    gs: int
    qi: bool
    w: mx.array
    s: mx.array
    b: mx.array
    rows: int
    cols: int
    nbytes: int  # what the kernel streams: weights, and scales and biases where quantized


def units_for(fmt: int, u: int) -> int:
    """Units a lane loads per batch: a 4-bit unit is 32 weights (4 x the work of a bf16
    one, and its dot products unroll into registers), so a quarter as many; an 8-bit unit
    16 weights, so half as many."""
    if fmt in (kernel_source.WF_Q4, kernel_source.WF_FP4):
        return max(1, u // 4)
    return max(1, u // 2) if fmt == kernel_source.WF_Q8 else u


#: What the kernels serve, for error messages.
SERVED = "float32, bfloat16, affine 4- and 8-bit, mxfp4 and nvfp4 weights"


def _dummy() -> mx.array:
    # 8 floats: MLX's Metal signature puts arrays under 8 elements in `constant` space.
    return mx.zeros((8,), dtype=mx.float32)


def kernel_matrix(name: str, wm: WeightMatrix) -> KernelMatrix:
    """``wm`` (a WeightMatrix, no fold) in the form the kernels take; ValueError if unserved."""
    base, fold = wm.launch_parts()
    if fold is not None:
        raise ValueError(f"{name} must carry no fold for the kernels (only wo's and Q/K/V's input folds are applied)")
    rows, cols = wm.shape
    if isinstance(base, QuantizedBase):
        spec = base.spec
        fmt = kernel_source.KERNEL_QUANT.get((spec.mode, spec.bits))
        if fmt is None:
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
            sfmt = kernel_source.SF_BF16 if scales.dtype == mx.bfloat16 else kernel_source.SF_F32
        else:
            sfmt = kernel_source.SF_E8M0 if spec.mode == "mxfp4" else kernel_source.SF_E4M3
        unit = 128 // spec.bits  # weights in a 16-byte unit
        if cols % unit:
            raise ValueError(f"{name}: its in dimension ({cols}) must be a multiple of {unit} for {spec} units")
        # Interleaved words (kernels/common.h, Q_WORD) need rows of a multiple of 128 words.
        qi = (cols // (32 // spec.bits)) % 128 == 0
        nbytes = int(base.w.nbytes + scales.nbytes + (biases.nbytes if biases is not None else 0))
        biases = biases if biases is not None else _dummy()  # fp4 formats: none, never read
        return KernelMatrix(fmt, sfmt, spec.group_size, qi, base.w, scales, biases, rows, cols, nbytes)
    if base.dtype == mx.float32:
        fmt = kernel_source.WF_F32
    elif base.dtype == mx.bfloat16:
        fmt = kernel_source.WF_BF16
    else:
        raise ValueError(f"{name}: the kernels serve {SERVED}; got {base.dtype}")
    per = 4 if fmt == kernel_source.WF_F32 else 8
    if cols % per:
        raise ValueError(f"{name}: its in dimension ({cols}) must be a multiple of {per} for 16-byte loads")
    return KernelMatrix(fmt, 0, 32, False, base, _dummy(), _dummy(), rows, cols, int(base.nbytes))


def check_width(name: str, width: int) -> None:
    """ValueError unless ``width`` fits the kernels' group-memory staging."""
    if width % 8 or width > MAX_GROUP_FLOATS:
        raise ValueError(f"{name} ({width}) must be a multiple of 8 and at most {MAX_GROUP_FLOATS} "
                         "(the kernels stage it in 32 KB of group memory)")


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


#: The weight formats whose rows read x tiled in group memory (``kernels/common.h``,
#: ``TILED_X``, which this mirrors; kernels/README.md says why only these).
TILED_X_FORMATS: tuple[int, ...] = (kernel_source.WF_Q8,)


def tiled_x_bytes(fmt: int, gs: int, width: int) -> tuple[int, int]:
    """The group memory a launch's input vector of ``width`` floats takes, as
    ``kernels/common.h`` (``WFormat``'s ``XL4`` and ``SUM4``) lays it out: x itself (whole
    128-byte lines for a :data:`TILED_X_FORMATS` format, which ``tile_x`` swizzles within a
    line) and the sums of x over each unit (each scale group when a unit holds two) that
    tiled rows read; no sums for the other formats."""
    if fmt not in TILED_X_FORMATS:
        return -(-4 * width // 16) * 16, 0
    unit = {kernel_source.WF_Q8: 16}.get(fmt, 32)
    block = min(gs, unit)
    return -(-width // 32) * 128, -(-(width // block) // 4) * 16


def check_threadgroup_memory(kernel: str, template: list[tuple[str, Any]], width: str) -> None:
    """ValueError when a Metal launch of ``kernel`` would declare more than Apple GPUs'
    32 KB of threadgroup memory (``width``: which dimension sets it, for the message)."""
    used = threadgroup_bytes(kernel, dict(template))
    if used > METAL_THREADGROUP_LIMIT:
        raise ValueError(f"{width}: {kernel} would declare {used} bytes of threadgroup memory, more than Apple "
                         f"GPUs' {METAL_THREADGROUP_LIMIT}; the Metal launch refuses it")


def rotation_template(plan: FoldPlan | None, width: int) -> dict[str, Any]:
    """The fold plan's arrays and template values (identity ones without a fold)."""
    if plan is None:
        return {"sdest": 2 * mx.arange(width, dtype=mx.int32),
                "table": mx.ones((8,), dtype=mx.int8), "ROT": False, "M": 1, "LOGP": 0, "scale": 1.0}
    table = np.zeros(max(8, plan.m * plan.m), dtype=np.int8)
    table[: plan.m * plan.m] = np.asarray(plan.table, dtype=np.int8).reshape(-1)
    return {"sdest": mx.array(sdest(plan)),
            "table": mx.array(table), "ROT": True, "M": int(plan.m), "LOGP": int(plan.k), "scale": plan.scale}


def sdest(plan: FoldPlan) -> np.ndarray:
    """What the kernels take for the signs and the permutation: ``2 dest[p] + (signs[p] < 0)``.

    ``dest`` is the inverse permutation (``dest[perm[i]] = i``): the kernels scatter
    ``signs[p] * x[p]`` to ``dest[p]`` in group memory, which makes every read of device
    memory coalesced; the sign rides in the low bit (one array read instead of two).
    """
    dest = np.argsort(np.asarray(plan.perm)).astype(np.int64)
    return (2 * dest + (np.asarray(plan.signs) < 0)).astype(np.int32)


def params_array(eps: float, scale: float) -> mx.array:
    """The launches' scalars as one array (eight floats: see :func:`_dummy`)."""
    p = np.zeros(8, dtype=np.float32)
    p[0], p[1] = eps, scale
    return mx.array(p)


def grid_size(rows: int, nt: int, t: KernelTuning, groups_per_sm: int) -> int:
    """Threads in a row kernel's grid: one warp a row, at most ``groups_per_sm`` groups an SM (0: no cap)."""
    groups = -(-rows // (nt // 32))
    if groups_per_sm > 0:
        groups = min(groups, t.sms() * groups_per_sm)
    return max(1, groups) * nt


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

    def weight_bytes(self) -> int:
        """Bytes of every weight the three launches read (codes, scales and biases where quantized)."""
        return int(sum(m.nbytes for m in (self.wo, self.gate, self.up, self.down)) + self.norm.nbytes)

    def templates(self) -> dict[str, list[tuple[str, Any]]]:
        """The template values of the three launches (what the generated source is checked for)."""
        t, wo, g, d = self.tuning, self.wo, self.gate, self.down
        return {
            "wo_residual": [("NT", t.wo_nt), ("FMT", wo.fmt), ("SFMT", wo.sfmt), ("GS", wo.gs), ("QI", wo.qi),
                            ("WIDTH", self.branch_dim), ("ROWS", self.hidden), ("ROT", bool(self.rot["ROT"])),
                            ("M", self.rot["M"]), ("LOGP", self.rot["LOGP"]), ("U", units_for(wo.fmt, t.u_wo)),
                            ("PRE", bool(t.pre_wo))],
            "ffn_gate_up": [("NT", t.rows_nt), ("FMT", g.fmt), ("SFMT", g.sfmt), ("GS", g.gs), ("QI", g.qi),
                            ("HID", self.hidden), ("FFN", self.ffn), ("U", units_for(g.fmt, t.u_gate_up)),
                            ("PRE", bool(t.pre_gate_up))],
            "ffn_down": [("NT", t.down_nt), ("FMT", d.fmt), ("SFMT", d.sfmt), ("GS", d.gs), ("QI", d.qi),
                         ("HID", self.hidden), ("FFN", self.ffn), ("U", max(1, units_for(d.fmt, t.u_down) // t.down_rows)),
                         ("DR", t.down_rows)],
        }

    def __post_init__(self) -> None:
        # Everything but the activations, computed once: a launch then costs MLX's own
        # work and little Python (the per-wait overhead is what the benchmark measures).
        t, tp = self.tuning, self.templates()
        wo, g, u, d = self.wo, self.gate, self.up, self.down
        self._wo = (compiled_kernel(self.dialect, "wo_residual", self.kernel_dir),
                    [self.rot["sdest"], self.rot["table"], self.params, wo.w, wo.s, wo.b],
                    dict(template=tp["wo_residual"], grid=(grid_size(self.hidden, t.wo_nt, t, t.wo_groups_per_sm), 1, 1),
                         threadgroup=(t.wo_nt, 1, 1), output_shapes=[(self.hidden,)], output_dtypes=[mx.float32]))
        self._gu = (compiled_kernel(self.dialect, "ffn_gate_up", self.kernel_dir),
                    [self.norm, self.params, g.w, g.s, g.b, u.w, u.s, u.b],
                    dict(template=tp["ffn_gate_up"], grid=(grid_size(self.ffn, t.rows_nt, t, t.gu_groups_per_sm), 1, 1),
                         threadgroup=(t.rows_nt, 1, 1), output_shapes=[(self.ffn,)], output_dtypes=[mx.float32]))
        self._dn = (compiled_kernel(self.dialect, "ffn_down", self.kernel_dir), [d.w, d.s, d.b],
                    dict(template=tp["ffn_down"], grid=(self.hidden // t.down_rows * t.down_nt, 1, 1),
                         threadgroup=(t.down_nt, 1, 1), output_shapes=[(self.hidden,)], output_dtypes=[mx.float32]))

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
        """``self`` traced once by ``mx.compile``: the same launches with less Python a call
        (measured on the H200: about 0.05-0.09 ms less per one-wait tail)."""
        if getattr(self, "_compiled", None) is None:
            self._compiled = mx.compile(lambda b, r: self(b, r))
        return self._compiled

    def __call__(self, branch: mx.array, residual: mx.array, *, verbose: bool = False) -> mx.array:
        """The tail's three launches, lazily (evaluate the result once: one submission)."""
        h = self.launch_wo(branch, residual, verbose=verbose)
        act = self.launch_gate_up(h, verbose=verbose)
        return self.launch_down(act, h, verbose=verbose)


def prepare_tail(launch: TailLaunch, dialect: str, tuning: KernelTuning | None = None, *,
                 kernel_dir: Path | None = None) -> PreparedTail:
    """The kernel form of a :class:`workbench.tail.TailLaunch` (from ``tail.tail_launch``).

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
    if launch.fold is not None and launch.fold.site is not FoldSite.INPUT:
        raise ValueError("wo's fold must be at its INPUT site for the kernels (they rotate wo's input, as "
                         "frink-models' metal_plan(branch.len()) does); got site OUTPUT")
    wo = kernel_matrix("wo", launch.wo)
    gate, up, down = kernel_matrix("gate", launch.gate), kernel_matrix("up", launch.up), kernel_matrix("down", launch.down)
    hidden, branch_dim, ffn = wo.rows, wo.cols, gate.rows
    check_width("branch (wo's in dimension)", branch_dim)
    check_width("hidden", hidden)
    if ffn % 8:
        raise ValueError(f"ffn ({ffn}) must be a multiple of 8")
    if (gate.fmt, gate.sfmt, gate.gs, gate.qi) != (up.fmt, up.sfmt, up.gs, up.qi):
        raise ValueError("gate and up must have the same format (one launch reads both)")
    rot = rotation_template(launch.fold_plan, branch_dim)
    prep = PreparedTail(dialect, hidden, branch_dim, ffn, wo, gate, up, down, rot,
                        launch.ffn_norm.astype(mx.float32), params_array(launch.eps, rot["scale"]),
                        tuning or DEFAULT_TUNING, None if kernel_dir is None else Path(kernel_dir))
    if dialect == "metal":
        for kernel, width in (("wo_residual", f"branch ({branch_dim})"), ("ffn_gate_up", f"hidden ({hidden})"),
                              ("ffn_down", f"hidden ({hidden})")):
            check_threadgroup_memory(kernel, prep.templates()[kernel], width)
    return prep


#: Prepared tails per weights object, held weakly: they live as long as the weights do.
_PREPARED: weakref.WeakKeyDictionary[TailWeights, dict[tuple, PreparedTail]] = weakref.WeakKeyDictionary()


def prepared(launch: TailLaunch, dialect: str, tuning: KernelTuning | None = None, *,
             kernel_dir: Path | None = None) -> PreparedTail:
    """:func:`prepare_tail`, made once per weights object, dialect, tuning and kernel
    folder (the constants then stay on the device, as an engine keeps them)."""
    tuning = tuning or DEFAULT_TUNING
    kernel_dir = None if kernel_dir is None else Path(kernel_dir)
    per = _PREPARED.setdefault(launch.weights, {})
    key = (dialect, tuning, kernel_dir)
    if key not in per:
        per[key] = prepare_tail(launch, dialect, tuning, kernel_dir=kernel_dir)
    return per[key]


def kernel_tail(launch: TailLaunch, branch: mx.array, residual: mx.array, dialect: str,
                tuning: KernelTuning | None = None) -> mx.array:
    """The kernel tail as a lazy MLX array (leading batch axes allowed: each row its launches)."""
    prep = prepared(launch, dialect, tuning)
    b = branch.astype(mx.float32)
    r = residual.astype(mx.float32)
    if b.ndim == 1:
        return prep.compiled()(b, r)
    lead = b.shape[:-1]
    bf, rf = b.reshape(-1, b.shape[-1]), r.reshape(-1, r.shape[-1])
    return mx.stack([prep(bf[i], rf[i]) for i in range(bf.shape[0])]).reshape(*lead, prep.hidden)


def as_mx32(a: Any) -> mx.array:
    """``a`` (numpy or MLX) as a float32 ``mx.array``."""
    return a.astype(mx.float32) if isinstance(a, mx.array) else mx.array(np.asarray(a, dtype=np.float32))


def run_kernel_tail(dialect: str, launch: TailLaunch, branch: Any, residual: Any) -> np.ndarray:
    """The fused tail through the ``dialect`` kernels' three launches (``"metal"`` or
    ``"cuda"``) in one evaluation, float32 numpy out: what ``fused_tail(backend="metal")``
    runs (``fused_tail(backend="cuda")`` runs ``workbench.kernels.one_launch.run_cuda_tail``: one
    launch, these three only where it does not fit).

    ``branch`` / ``residual``: numpy or MLX, optional leading batch axes. Raises
    ``ValueError`` for a dialect that is not a kernel backend and
    :class:`workbench.backends.BackendUnavailable` when its device is absent here.
    """
    if dialect not in KERNEL_BACKENDS + (METAL_EMULATED,):
        raise ValueError(f"dialect must be one of {KERNEL_BACKENDS + (METAL_EMULATED,)} (the kernel backends; "
                         f"'graph' runs as workbench.tail.tail_graph); got {dialect!r}")
    backends.resolve_backend(dialect)  # a kernel asked for on a machine without its device says so
    if dialect == METAL_EMULATED:
        return emulated_tail(launch, branch, residual)
    out = kernel_tail(launch, as_mx32(branch), as_mx32(residual), dialect)
    mx.eval(out)  # the ONE submission: all launches of the tail
    return np.array(out)


# -- the head launch ----------------------------------------------------------------------


def head_refusals(q: WeightMatrix, k: WeightMatrix, v: WeightMatrix) -> list[refusals.HeadRefusal]:
    """Every ``HeadRefusal`` for Q/K/V weights (``workbench.models.refusals.head_launch_refusals``,
    asked about a plain GQA layer of this hidden size); [] = the head launch runs."""
    hidden = q.shape[1]
    cfg = model.ModelConfig.synthetic(hidden, ffn_dim=hidden)

    def served(wm: WeightMatrix) -> bool:
        try:
            kernel_matrix("x", type(wm)(wm.launch_parts()[0]))
            return True
        except ValueError:
            return False

    return list(refusals.head_launch_refusals(
        cfg, 0, q_fold=q.fold, k_fold=k.fold, v_fold=v.fold,
        q_kernel=served(q), k_kernel=served(k), v_kernel=served(v)))


def head_launch(hidden: mx.array, attn_norm: Any, eps: float, q: WeightMatrix, k: WeightMatrix,
                v: WeightMatrix, dialect: str, tuning: KernelTuning | None = None, *, verbose: bool = False,
                kernel_dir: Path | None = None) -> tuple[mx.array, mx.array, mx.array]:
    """Q, K, V of ``rms_norm(hidden) * attn_norm`` in ONE launch, lazily.

    ``q`` / ``k`` / ``v`` are WeightMatrix objects sharing one fold (the same object, as
    frink-models asks with Rust's pointer-identity test ``Arc::ptr_eq``) at the INPUT site, or all unfolded; the kernel
    rotates their common input once. ``attn_norm``: numpy or MLX, [hidden].
    ``kernel_dir``: as for :func:`prepare_tail`. Raises ``ValueError`` listing every
    head refusal.
    """
    emulated = dialect == METAL_EMULATED
    if emulated:
        backends.resolve_backend(dialect)  # without clang, say so before building anything
    kernel_source.check_dialect("metal" if emulated else dialect)
    found = head_refusals(q, k, v)
    if found:
        raise ValueError("the head launch refuses these projections: " + ", ".join(r.name for r in found))
    fold = q.fold
    if fold is not None and fold.site is not FoldSite.INPUT:
        raise ValueError("the Q/K/V fold must be at the INPUT site (the kernel rotates their common input)")
    mats = [kernel_matrix(n, WeightMatrix(m.launch_parts()[0])) for n, m in (("q", q), ("k", k), ("v", v))]
    if len({(m.fmt, m.sfmt, m.gs, m.qi) for m in mats}) != 1:
        raise ValueError("q, k and v must have the same weight format (one launch reads all three)")
    hid = mats[0].cols
    check_width("hidden", hid)
    t = tuning or DEFAULT_TUNING
    rot = rotation_template(None if fold is None else fold.plan(hid), hid)
    nq, nk, nv = (m.rows for m in mats)
    m0 = mats[0]
    template = [("NT", t.head_nt), ("FMT", m0.fmt), ("SFMT", m0.sfmt), ("GS", m0.gs), ("QI", m0.qi), ("HID", hid),
                ("NQ", nq), ("NK", nk), ("NV", nv), ("ROT", bool(rot["ROT"])), ("M", rot["M"]),
                ("LOGP", rot["LOGP"]), ("U", units_for(m0.fmt, t.u_head)), ("PRE", bool(t.pre_head))]
    norm = attn_norm.astype(mx.float32) if isinstance(attn_norm, mx.array) else mx.array(
        np.asarray(attn_norm, dtype=np.float32))
    if dialect != "cuda":
        check_threadgroup_memory("head_qkv", template, f"hidden ({hid})")
    inputs = [hidden.astype(mx.float32), norm, params_array(eps, rot["scale"]), rot["sdest"], rot["table"]]
    for m in mats:
        inputs += [m.w, m.s, m.b]
    kernel = compiled_kernel("metal" if emulated else dialect, "head_qkv", None if kernel_dir is None else Path(kernel_dir))
    kw = dict(template=template, grid=(grid_size(nq + nk + nv, t.head_nt, t, t.head_groups_per_sm), 1, 1),
              threadgroup=(t.head_nt, 1, 1), output_shapes=[(nq,), (nk,), (nv,)], output_dtypes=[mx.float32] * 3)
    if emulated:
        q_out, k_out, v_out = (mx.array(o) for o in emulate_launch(kernel, inputs, kw))
        return q_out, k_out, v_out
    outs = kernel(inputs=inputs, verbose=verbose, **kw)
    return outs[0], outs[1], outs[2]


# -- the generated Metal source, without a GPU ------------------------------------------


@contextlib.contextmanager
def _stdout_to(path: str) -> Iterator[None]:
    """Send file descriptor 1 (where MLX's C++ prints) to ``path`` while the block runs."""
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.dup2(fd, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(fd)
        os.close(saved)


def generated_source(fn: Callable[..., Any], *args: mx.array) -> dict[str, str]:
    """The kernel sources MLX generates when ``fn(*args)`` calls kernels with ``verbose=True``.

    Works without the kernels' device: ``mx.export_function`` traces ``fn`` (building the
    graph, printing each kernel's generated source) and runs nothing. Returns
    ``{generated kernel name: source}``.
    """
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "stdout.txt")
        with _stdout_to(log):
            mx.export_function(os.path.join(d, "fn.mlxfn"), fn, *args)
        text = Path(log).read_text()
    out: dict[str, str] = {}
    marker = "Generated source code for `"
    for chunk in text.split(marker)[1:]:
        name, rest = chunk.split("`", 1)
        body = rest.split("```", 2)
        out[name] = body[1].strip("\n") if len(body) > 1 else rest
    return out


def metal_tail_source(launch: TailLaunch, tuning: KernelTuning | None = None) -> dict[str, str]:
    """The Metal source MLX would compile for this launch's tail (three kernels), on any machine."""
    prep = prepare_tail(launch, "metal", tuning)
    return generated_source(lambda b, r: prep(b, r, verbose=True),
                            mx.zeros((prep.branch_dim,), dtype=mx.float32), mx.zeros((prep.hidden,), dtype=mx.float32))


# -- the Metal kernels on the CPU (backend "metal-emulated") ------------------------------

#: Generated Metal sources, by kernel name, template values and input dtypes (all the
#: generated text depends on).
_EMULATED_SOURCES: dict[tuple, str] = {}


def _host(a: mx.array) -> np.ndarray:
    """``a``'s bytes as numpy (bfloat16 as its 16-bit patterns: numpy has no bfloat16)."""
    return np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)


def launch_source(kernel: Any, inputs: list[mx.array], kw: dict[str, Any]) -> str:
    """The Metal source MLX generates for ``kernel(inputs=inputs, **kw)`` (made once per
    kernel, template values and input dtypes)."""
    key = (id(kernel), tuple((n, str(v)) for n, v in kw["template"]),
           tuple((str(a.dtype), a.size < 8) for a in inputs))
    if key not in _EMULATED_SOURCES:
        (src,) = generated_source(lambda *xs: kernel(inputs=list(xs), verbose=True, **kw), *inputs).values()
        _EMULATED_SOURCES[key] = src
    return _EMULATED_SOURCES[key]


def emulated_tail_sources(launch: TailLaunch, tuning: KernelTuning | None = None, *,
                          kernel_dir: Path | None = None) -> list[str]:
    """The three Metal sources :func:`emulated_tail` compiles for ``launch`` (to compile
    many at once: ``metal_emulation.compile_all``)."""
    prep = prepared(launch, "metal", tuning, kernel_dir=kernel_dir)
    b, r = mx.zeros((prep.branch_dim,), dtype=mx.float32), mx.zeros((prep.hidden,), dtype=mx.float32)
    return [launch_source(prep._wo[0], [b, *prep._wo[1], r], prep._wo[2]),
            launch_source(prep._gu[0], [r, *prep._gu[1]], prep._gu[2]),
            launch_source(prep._dn[0], [mx.zeros((prep.ffn,), dtype=mx.float32), r, *prep._dn[1]], prep._dn[2])]


def emulate_launch(kernel: Any, inputs: list[mx.array], kw: dict[str, Any], *, order: str = "ascending",
                   seed: int = 0) -> list[np.ndarray]:
    """One Metal launch run on the CPU: the source MLX generates for ``kernel(inputs=inputs,
    **kw)`` (``kw``: template, grid, threadgroup, output shapes and dtypes, as a launch
    passes them), compiled by clang and executed by :mod:`workbench.kernels.metal_emulation` in
    the thread ``order`` given. Raises ``metal_emulation.EmulationError`` /
    ``MetalCompileError`` with the diagnosis."""
    from workbench import metal_emulation  # noqa: PLC0415 -- only this backend needs clang and ctypes

    compiled = metal_emulation.compile_source(launch_source(kernel, inputs, kw))
    threads = int(kw["threadgroup"][0])
    groups = int(kw["grid"][0]) // threads
    return compiled.launch([_host(a) for a in inputs],
                           [(tuple(s), np.float32) for s in kw["output_shapes"]], groups=groups, threads=threads,
                           order=order, seed=seed)


def emulated_tail(launch: TailLaunch, branch: Any, residual: Any, *, order: str = "ascending", seed: int = 0,
                  tuning: KernelTuning | None = None, kernel_dir: Path | None = None) -> np.ndarray:
    """The fused tail's three Metal launches run on the CPU (``fused_tail(backend="metal-emulated")``).

    The same :class:`PreparedTail` as the ``"metal"`` backend (same refusals, template
    values, grids and constants); each launch's generated source is compiled by clang
    against the stand-in header and executed by the emulator, in thread ``order``
    (``metal_emulation.ORDERS``; ``seed`` for ``"shuffled"``). float32 numpy out, with
    ``branch``'s leading batch axes. ``kernel_dir``: as for :func:`prepare_tail` (the
    mutation tests run deliberately broken copies of ``kernels/``).
    """
    backends.resolve_backend(METAL_EMULATED)  # without clang, say what to install
    prep = prepared(launch, "metal", tuning, kernel_dir=kernel_dir)
    b = np.asarray(_host(as_mx32(branch)), dtype=np.float32)
    r = np.asarray(_host(as_mx32(residual)), dtype=np.float32)
    lead = b.shape[:-1]
    bf, rf = b.reshape(-1, b.shape[-1]), r.reshape(-1, r.shape[-1])
    rows = []
    for i in range(bf.shape[0]):
        k, consts, kw = prep._wo
        (h,) = emulate_launch(k, [mx.array(bf[i]), *consts, mx.array(rf[i])], kw, order=order, seed=seed)
        k, consts, kw = prep._gu
        (act,) = emulate_launch(k, [mx.array(h), *consts], kw, order=order, seed=seed)
        k, consts, kw = prep._dn
        (out,) = emulate_launch(k, [mx.array(act), mx.array(h), *consts], kw, order=order, seed=seed)
        rows.append(out)
    return np.stack(rows).reshape(*lead, prep.hidden)
