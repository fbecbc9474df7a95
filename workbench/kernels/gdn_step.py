"""A Gated DeltaNet layer's recurrent step (decode, one token) as ONE kernel launch.

Why: on the H200 the hybrid decode step on the project's matvec kernels is bound by MLX's
cost per launch, not by bytes (``workbench.decode.schedule``: 26 ms a token against a 13.2 ms
weight-streaming floor, 20.8 ms of it inside ``mx.eval``). Between its input projection
(``gdn_in``) and its output projection (``out_add``) each of Bonsai-27B's 48 recurrent
layers ran its recurrence as a dozen and more small MLX launches: the short causal
convolution's window update, silu, the q and k L2 norms, the gates beta and gamma, the
gated delta update, the per-head RMS norm and the z gate. ``kernels/gdn_step.body`` does
all of it in one launch, one group a value head, the state read once and written once.

The arithmetic is ``workbench.decode.layers.recurrent_layer``'s, float32, op for op in meaning (so the MLX-ops
path, ``gdn="ops"``, is its float32 reference, and :func:`recurrent_step_exact` its
float64 oracle):

    window = [conv_state; mixed];  c = silu(sum_t window[t] * conv_w[t]);  conv_state' = window[1:]
    q = c_q rsqrt(|c_q|^2 + 1e-6) / sqrt(Dk);  k = c_k rsqrt(|c_k|^2 + 1e-6);  v = c_v
    beta = sigmoid(b);  gamma = exp(-exp(a_log) * softplus(a + dt_bias))
    S = gamma S;  S += beta (v - S k) k^T;  o = S q       (value head h reads key head h // (Hv / Hk))
    out = rms_norm(o) * o_norm * silu(z)                  (per value head, eps inside the root)

:func:`prepare` makes a layer's launch once (its constants arrays, its template values
and grid), like ``decode_matvec.Launch``; :class:`GdnStep` runs it on the ``"cuda"`` or
``"metal"`` dialect through MLX, or on ``"metal-emulated"`` (the Metal source compiled by
clang and executed on the CPU, ``workbench.kernels.metal_emulation``). A backend that is absent
raises ``backends.BackendUnavailable``; nothing falls back to MLX ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.kernels import run as kernel_run
from workbench.kernels import source as kernel_source
from workbench.kernels.tuning import MAX_GROUP_THREADS, METAL_THREADGROUP_LIMIT
from workbench.validate import describe, integer, number, one_of

#: Where :class:`GdnStep` runs: MLX's CUDA or Metal kernels, or the Metal source emulated on the CPU.
GDN_BACKENDS: tuple[str, ...] = ("cuda", "metal", kernel_run.METAL_EMULATED)

#: The L2 norm's epsilon on q and k (``workbench.decode.layers.recurrent_layer``'s ``1e-6``, a constant of the
#: model family, not the layer's RMS eps).
L2_EPS = 1e-6

#: Threads a group when not given: 16 warps, so a head's DV rows of the state are read by
#: 16 rows in flight at a time (8 rows a warp at Bonsai's DV = 128); fewer when DV is small.
DEFAULT_THREADS = 512

#: A lane holds DK / 32 floats of a state row in registers; past 16 (DK = 512) they would spill.
MAX_DK = 512

#: A lane holds all its warp's rows at once (rows a warp x DK / 32 floats, loaded before
#: any is used, so the loads are in flight together); at most this many floats.
MAX_LANE_FLOATS = 64

#: Apple GPUs' threadgroup memory a group (the same algorithm runs on CUDA, so the same limit holds).
GROUP_LIMIT = METAL_THREADGROUP_LIMIT


@dataclass(frozen=True)
class GdnShape:
    """A recurrent layer's widths: key and value heads, their dims, the conv kernel's width."""

    hk: int
    hv: int
    dk: int
    dv: int
    kw: int

    @property
    def channels(self) -> int:
        """The conv's channels (q | k | v): ``2 hk dk + hv dv``."""
        return 2 * self.hk * self.dk + self.hv * self.dv

    @property
    def vd(self) -> int:
        """The value width (the output's length): ``hv dv``."""
        return self.hv * self.dv

    def group_bytes(self, threads: int) -> int:
        """Group memory one group declares (``kernels/gdn_step.body``: q, k, v, o and the
        reduction scratch, each rounded to 16 bytes as Metal allocates)."""
        return sum(-(-4 * n // 16) * 16 for n in (self.dk, self.dk, self.dv, self.dv, threads // 32))


def check_shape(shape: GdnShape, threads: int) -> None:
    """ValueError, naming the width, for a shape or group size the kernel cannot run."""
    if not isinstance(shape, GdnShape):
        raise ValueError(f"shape: must be a GdnShape, got {describe(shape)}")
    for name in ("hk", "hv", "dk", "dv", "kw"):
        integer(name, getattr(shape, name), minimum=1)
    if shape.hv % shape.hk:
        raise ValueError(f"value heads: must be a multiple of the key heads ({shape.hk}), got {shape.hv}")
    if shape.dk % 32 or shape.dk > MAX_DK:
        raise ValueError(
            f"key head dim: must be a multiple of 32 (a warp's lanes share a state row) and at most "
            f"{MAX_DK} (a lane's share of a row in registers), got {shape.dk}"
        )
    if shape.kw < 2:
        raise ValueError(f"conv kernel width: must be >= 2 (the conv state holds kw - 1 rows), got {shape.kw}")
    threads = integer("threads", threads, minimum=32, maximum=MAX_GROUP_THREADS)
    if threads % 32:
        raise ValueError(f"threads: must be a multiple of 32 (whole warps), got {threads}")
    used = shape.group_bytes(threads)
    if used > GROUP_LIMIT:
        raise ValueError(
            f"head dims ({shape.dk}, {shape.dv}): gdn_step would declare {used} bytes of group memory, "
            f"more than Apple GPUs' {GROUP_LIMIT}"
        )
    held = lane_floats(shape, threads)
    if held > MAX_LANE_FLOATS:
        raise ValueError(
            f"threads: {threads} leave each lane {held} floats of the state to hold (rows a warp x Dk / 32), "
            f"more than {MAX_LANE_FLOATS}; give more threads (whole warps, at most "
            f"{MAX_GROUP_THREADS})"
        )


def lane_floats(shape: GdnShape, threads: int) -> int:
    """The state floats one lane holds in registers: its warp's rows times Dk / 32."""
    warps = threads // 32
    return -(-shape.dv // warps) * (shape.dk // 32)


def default_threads(shape: GdnShape) -> int:
    """:data:`DEFAULT_THREADS`, or fewer where the head has fewer rows than warps (a warp a
    row), or more where a lane would hold over :data:`MAX_LANE_FLOATS` of the state."""
    threads = min(DEFAULT_THREADS, 32 * shape.dv)
    while threads < MAX_GROUP_THREADS and lane_floats(shape, threads) > MAX_LANE_FLOATS:
        threads += 32
    return threads


def template(shape: GdnShape, threads: int) -> list[tuple[str, Any]]:
    """The launch's template values, in ``kernel_source.KERNELS["gdn_step"].template``'s order."""
    return [("NT", threads), ("HK", shape.hk), ("HV", shape.hv), ("DK", shape.dk), ("DV", shape.dv), ("KW", shape.kw)]


def cuda_translation_unit(shape: GdnShape, threads: int | None = None) -> str:
    """The CUDA file MLX would compile for this shape (every input float32), for ``nvcc -c``."""
    threads = default_threads(shape) if threads is None else threads
    check_shape(shape, threads)
    spec = kernel_source.KERNELS["gdn_step"]
    return kernel_source.cuda_translation_unit(
        "gdn_step", dict.fromkeys(spec.inputs, "float32"), dict(template(shape, threads))
    )


def _array(name: str, a: Any, shape: Sequence[int] | None = None) -> mx.array:
    """``a`` (an MLX or numpy array) as an MLX float32 array, or a ValueError naming ``name``."""
    if isinstance(a, np.ndarray):
        if a.dtype != np.float32:
            raise ValueError(f"{name}: must be float32 (the kernel reads float32), got {describe(a)}")
        a = mx.array(a)
    if not isinstance(a, mx.array):
        raise ValueError(f"{name}: must be an MLX or numpy float32 array, got {describe(a)}")
    if a.dtype != mx.float32:
        raise ValueError(f"{name}: must be float32 (the kernel reads float32), got {describe(a)}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: must have shape {tuple(shape)}, got {describe(a)}")
    return a


class GdnStep:
    """One layer's prepared launch: constants as arrays, template values, grid (see :func:`prepare`).

    Call it with the token's ``mixed`` [C], ``z`` [Hv Dv], ``ba`` [2 Hv], the conv state
    [K-1, C] and the recurrent state [Hv, Dv, Dk] (or [1, Hv, Dv, Dk], as the schedule
    keeps it); it returns ``(out [Hv Dv], conv_state' [K-1, C], state' of state's shape)``.
    On ``"cuda"`` / ``"metal"`` the three are lazy MLX arrays (one launch in the graph); on
    ``"metal-emulated"`` the launch runs on the CPU at once, in thread ``order``.
    """

    def __init__(
        self,
        shape: GdnShape,
        backend: str,
        threads: int,
        consts: tuple[mx.array, ...],
        kernel_dir: Path | None = None,
    ):
        self.shape, self.backend, self.threads = shape, backend, threads
        self.consts = consts
        self.dialect = kernel_run.source_dialect(backend)
        self.kernel = kernel_run.compiled_kernel(backend, "gdn_step", kernel_dir)
        s = shape
        self.kw = dict(
            template=template(s, threads),
            grid=(s.hv * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(s.vd,), (s.kw - 1, s.channels), (s.hv, s.dv, s.dk)],
            output_dtypes=[mx.float32] * 3,
        )

    def describe(self) -> str:
        s = self.shape
        return (
            f"gdn_step ({self.backend}): Hk {s.hk}, Hv {s.hv}, Dk {s.dk}, Dv {s.dv}, conv {s.kw}; "
            f"{s.hv} groups of {self.threads} threads"
        )

    def inputs(self, mixed: Any, z: Any, ba: Any, conv_state: Any, state: Any) -> list[mx.array]:
        """The launch's inputs in the kernel's order, each checked (shape, float32)."""
        s = self.shape
        st = _array("state", state)
        if tuple(st.shape) not in ((s.hv, s.dv, s.dk), (1, s.hv, s.dv, s.dk)):
            raise ValueError(
                f"state: must have shape {(s.hv, s.dv, s.dk)} or {(1, s.hv, s.dv, s.dk)} (Hv: a_log's length, "
                f"Dv: o_norm's length, Dk: what conv_w's channels leave), got {describe(state)}; where the state "
                f"is right, the launch was prepared with a wrong a_log, o_norm or conv_w"
            )
        return [
            _array("mixed", mixed, (s.channels,)),
            _array("z", z, (s.vd,)),
            _array("ba", ba, (2 * s.hv,)),
            _array("conv_state", conv_state, (s.kw - 1, s.channels)),
            st,
            *self.consts,
        ]

    def __call__(
        self,
        mixed: Any,
        z: Any,
        ba: Any,
        conv_state: Any,
        state: Any,
        *,
        order: str = kernel_run.DEFAULT_ORDER,
        seed: int = 0,
    ) -> tuple[mx.array, mx.array, mx.array]:
        ins = self.inputs(mixed, z, ba, conv_state, state)
        state_shape = tuple(ins[4].shape)
        out, conv, st = kernel_run.launch(self.backend, self.kernel, ins, self.kw, order=order, seed=seed)
        return out, conv, st.reshape(state_shape)


def prepare(
    conv_w: Any,
    a_log: Any,
    dt_bias: Any,
    o_norm: Any,
    eps: float,
    *,
    k_heads: int,
    backend: str,
    threads: int | None = None,
    kernel_dir: Path | None = None,
) -> GdnStep:
    """A layer's launch, made once: its constants (``conv_w`` [K, C], ``a_log`` and
    ``dt_bias`` [Hv], ``o_norm`` [Dv], float32) and ``eps`` (the RMS norm's) as arrays.

    ``k_heads``: the key heads Hk (C = 2 Hk Dk + Hv Dv fixes Dk from it). ``backend``: one
    of :data:`GDN_BACKENDS`; an absent one raises ``backends.BackendUnavailable``.
    ``threads``: a group's (a multiple of 32; default :func:`default_threads`).
    ``kernel_dir``: a folder shaped like ``kernels/`` whose ``gdn_step.body`` runs instead
    of the workbench's (a user's own step, ``workbench.check``).
    """
    one_of("backend", backend, GDN_BACKENDS)
    backends.resolve_backend(backend)  # BackendUnavailable, saying what is missing
    eps = number("eps", eps, minimum=0, exclusive_minimum=True)
    hk = integer("k_heads", k_heads, minimum=1)
    cw = _array("conv_w", conv_w)
    if cw.ndim != 2:
        raise ValueError(f"conv_w: must be [kernel width, channels], got {describe(conv_w)}")
    al = _array("a_log", a_log)
    if al.ndim != 1:
        raise ValueError(f"a_log: must be [value heads], got {describe(a_log)}")
    hv = int(al.shape[0])
    dtb = _array("dt_bias", dt_bias)
    if tuple(dtb.shape) != (hv,):
        # Hv is read from a_log, so a mismatch may be either array's fault: name both.
        raise ValueError(
            f"a_log, dt_bias: must both be [value heads] of one length, got a_log {describe(a_log)} "
            f"and dt_bias {describe(dt_bias)}"
        )
    on = _array("o_norm", o_norm)
    if on.ndim != 1:
        raise ValueError(f"o_norm: must be [value head dim], got {describe(o_norm)}")
    dv = int(on.shape[0])
    kw, c = (int(n) for n in cw.shape)
    kd2 = c - hv * dv
    if kd2 <= 0 or kd2 % (2 * hk) or (kd2 // (2 * hk)) % 32:
        # Dk is not given: it is what conv_w's channels leave once a_log (Hv) and o_norm (Dv)
        # have theirs, so a wrong length in any of the three shows here, and all are named.
        raise ValueError(
            f"conv_w: its {c} channels must be 2 k_heads Dk + Hv Dv = 2 x {hk} x Dk + {hv} x {dv} "
            f"(Hv: a_log's length, Dv: o_norm's) for a key head dim Dk that is a positive multiple of 32; "
            f"one of conv_w {describe(conv_w)}, a_log of {hv}, o_norm of {dv}, k_heads {hk} is wrong"
        )
    shape = GdnShape(hk, hv, kd2 // (2 * hk), dv, kw)
    threads = default_threads(shape) if threads is None else threads
    check_shape(shape, threads)
    params = np.zeros(8, dtype=np.float32)
    params[:3] = eps, math.sqrt(shape.dk), L2_EPS
    consts = (cw, al, dtb, on, mx.array(params))
    mx.eval(*consts)
    return GdnStep(shape, backend, int(threads), consts, None if kernel_dir is None else Path(kernel_dir))


def gdn_step(
    mixed: Any,
    z: Any,
    ba: Any,
    conv_state: Any,
    conv_w: Any,
    a_log: Any,
    dt_bias: Any,
    o_norm: Any,
    state: Any,
    *,
    k_heads: int,
    eps: float,
    backend: str,
    threads: int | None = None,
    order: str = kernel_run.DEFAULT_ORDER,
    seed: int = 0,
) -> tuple[mx.array, mx.array, mx.array]:
    """One recurrent step in one launch: ``(out, conv_state', state')`` (see the module's
    formulas). Prepares the launch each call; a decode loop keeps :func:`prepare`'s."""
    return prepare(conv_w, a_log, dt_bias, o_norm, eps, k_heads=k_heads, backend=backend, threads=threads)(
        mixed, z, ba, conv_state, state, order=order, seed=seed
    )


def recurrent_step_exact(
    mixed: Any,
    z: Any,
    ba: Any,
    conv_state: Any,
    conv_w: Any,
    a_log: Any,
    dt_bias: Any,
    o_norm: Any,
    state: Any,
    *,
    k_heads: int,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step in float64 numpy, from the formulas (the oracle): ``(out, conv_state', state')``
    with state [Hv, Dv, Dk]."""
    f = [np.asarray(a, dtype=np.float64) for a in (mixed, z, ba, conv_state, conv_w, a_log, dt_bias, o_norm, state)]
    mixed, z, ba, conv_state, conv_w, a_log, dt_bias, o_norm, state = f
    hv, dv, dk = state.shape[-3:]
    state = state.reshape(hv, dv, dk)
    hk = integer("k_heads", k_heads, minimum=1)
    kd = hk * dk
    window = np.concatenate([conv_state, mixed[None]], axis=0)
    c = (window * conv_w).sum(axis=0)
    c = c / (1.0 + np.exp(-c))
    q = c[:kd].reshape(hk, dk)
    k = c[kd : 2 * kd].reshape(hk, dk)
    v = c[2 * kd :].reshape(hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + L2_EPS) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + L2_EPS)
    rep = hv // hk
    q, k = np.repeat(q, rep, axis=0), np.repeat(k, rep, axis=0)  # value head h reads key head h // rep
    beta = 1.0 / (1.0 + np.exp(-ba[:hv]))
    x = ba[hv:] + dt_bias
    gamma = np.exp(-np.exp(a_log) * np.logaddexp(x, 0.0))
    s = state * gamma[:, None, None]
    delta = (v - np.einsum("hij,hj->hi", s, k)) * beta[:, None]
    s = s + delta[:, :, None] * k[:, None, :]
    o = np.einsum("hij,hj->hi", s, q)
    o = o / np.sqrt((o * o).mean(-1, keepdims=True) + eps) * o_norm
    zz = z.reshape(hv, dv)
    out = (o * zz / (1.0 + np.exp(-zz))).reshape(hv * dv)
    return out, window[1:], s
