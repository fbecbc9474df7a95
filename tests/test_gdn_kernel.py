"""The gdn_step kernel: a Gated DeltaNet layer's recurrent step in one launch.

Checked here, on the CPU: the Metal source MLX generates for the launch, compiled by clang
and executed by the emulator (backend ``"metal-emulated"``) in every thread order (the
same bits required), against the float64 oracle (``gdn_kernel.recurrent_step_exact``,
written from the formulas) and against ``layers.recurrent_layer``'s own MLX ops (the float32
reference, ``gdn="ops"`` and ``"fast"``), at small geometries and at Bonsai-27B's head dims
(Dk = Dv = 128, Hv / Hk = 3), one step and several in a row with the states carried, and
Bonsai-27B's whole layer (48 value heads), which also runs on a GPU where there is one
(``cuda`` / ``metal`` marks); the CUDA translation unit compiled by nvcc; bad input; and a
hybrid's decode through ``Schedule`` with the recurrent step on the emulated kernel.

Metric: ``decode_matvec.worst_scaled_error``, max |kernel - reference| / max(max |reference|, 1),
per output (o, the conv state, the recurrent state). Tolerance :data:`TOL` = 1e-5: the kernel
computes in float32, so it differs from float64 by rounding only: dot products of Dk <= 128
terms and a handful of elementwise ops, measured 4.5e-8 to 2.8e-7 over the shapes below
(the MLX-ops path, float32 too, differs from float64 by as much: 4e-8 to 5.7e-7; the conv
state is a copy, exact). 1e-5 leaves ~20x room over the worst of them for another summation
order and Apple's / NVIDIA's exp, log and rsqrt, and is far below what a wrong formula
makes (the gate without dt_bias, b and a swapped, a key head mapped wrong, the RMS eps
ignored: checked below, each > 100 x TOL).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends as B
from workbench.decode import layers
from workbench.decode import matvec as D
from workbench.decode import schedule as S
from workbench.decode.geometry import Geometry
from workbench.decode.state import DecodeState, HybridWeights, new_state
from workbench.kernels import gdn_step as G
from workbench.kernels import source as ks
from workbench.models.loader import load_model
from workbench.waits import plan as waits

needs_clang = pytest.mark.skipif(
    not B.clang_available(), reason="the Metal emulation needs clang (apt-get install clang)"
)

#: See the module's docstring.
TOL = 1e-5

#: (hk, hv, dk, dv, kw): small; Bonsai-27B's head dims and ratio with 1 and 2 key heads;
#: and a 2:1 ratio with Dv != Dk.
SMALL = G.GdnShape(2, 4, 32, 32, 4)
SHAPES = {
    "small": SMALL,
    "bonsai-heads-1x3": G.GdnShape(1, 3, 128, 128, 4),
    "bonsai-heads-2x6": G.GdnShape(2, 6, 128, 128, 4),
    "dv64-dk32-1x2-conv3": G.GdnShape(1, 2, 32, 64, 3),
}
EPS = 1e-6


def _case(shape: G.GdnShape, seed: int) -> dict[str, np.ndarray]:
    """Random inputs of the ranges a layer sees: activations U(-1, 1) (z, b, a wider), the
    schedule's a_log, dt_bias and o_norm draws, a non-zero state (a decode's later token)."""
    rng = np.random.default_rng(seed)
    s = shape

    def u(*dims: int, a: float = 1.0) -> np.ndarray:
        return rng.uniform(-a, a, dims).astype(np.float32)

    return dict(
        mixed=u(s.channels),
        z=u(s.vd, a=3.0),
        ba=u(2 * s.hv, a=3.0),
        conv_state=u(s.kw - 1, s.channels),
        conv_w=u(s.kw, s.channels, a=math.sqrt(3.0 / s.kw)),
        a_log=np.log(rng.uniform(1.0, 16.0, s.hv)).astype(np.float32),
        dt_bias=u(s.hv),
        o_norm=(1.0 + u(s.dv, a=0.25)).astype(np.float32),
        state=u(s.hv, s.dv, s.dk, a=0.5),
    )


def _kernel(c: dict, shape: G.GdnShape, order: str = "ascending", seed: int = 0) -> list[np.ndarray]:
    outs = G.gdn_step(**c, k_heads=shape.hk, eps=EPS, backend="metal-emulated", order=order, seed=seed)
    return [np.array(a) for a in outs]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


class _Around:
    """A stand-in for the step's matvecs that hands ``layers.recurrent_layer`` a given gdn_in
    output and returns what it passes to out_add: so the recurrent step between them is
    exactly ``_recurrent``'s own MLX ops."""

    def __init__(self, mixed: mx.array, z: mx.array, ba: mx.array):
        self.got = (mixed, z, ba)
        self.o: mx.array | None = None

    def gdn_in(self, lw: Any, x: mx.array, mixed: int) -> tuple[mx.array, mx.array, mx.array]:
        assert mixed == self.got[0].shape[0]
        return self.got

    def out_add(self, lw: Any, name: str, v: mx.array, x: mx.array) -> mx.array:
        self.o = v
        return x

    def ffn(self, lw: Any, x: mx.array) -> mx.array:
        return x


def _geometry(shape: G.GdnShape) -> Geometry:
    return Geometry(
        hidden=32,
        ffn=32,
        n_q=1,
        n_kv=1,
        head_dim=8,
        attn_output_gate=False,
        gdn_k_heads=shape.hk,
        gdn_v_heads=shape.hv,
        gdn_k_dim=shape.dk,
        gdn_v_dim=shape.dv,
        conv_kernel=shape.kw,
        vocab=8,
        eps=EPS,
    )


def _mlx_ops(c: dict, shape: G.GdnShape, gdn: str) -> list[np.ndarray]:
    """``layers.recurrent_layer``'s ops (``gdn``: ``"ops"`` or ``"fast"``) on the case: (o, conv', state')."""
    mv = _Around(mx.array(c["mixed"]), mx.array(c["z"]), mx.array(c["ba"]))
    w = {
        "conv": mx.array(c["conv_w"]),
        "a_log": mx.array(c["a_log"]),
        "dt_bias": mx.array(c["dt_bias"]),
        "o_norm": mx.array(c["o_norm"]),
    }
    st = DecodeState({0: mx.array(c["state"])[None]}, {0: mx.array(c["conv_state"])}, {}, {}, {}, {}, 0)
    layers.recurrent_layer(_geometry(shape), w, mx.zeros((32,)), st, 0, gdn, mv)
    assert mv.o is not None
    return [np.array(mv.o), np.array(st.conv[0]), np.array(st.ssm[0][0])]


def _errors(got, want) -> list[float]:
    return [D.worst_scaled_error(g, w) for g, w in zip(got, want)]


# -- against the float64 oracle and the MLX ops ----------------------------------------------


@needs_clang
@pytest.mark.parametrize("name", list(SHAPES))
def test_one_step_matches_float64_and_the_mlx_ops_in_every_thread_order(name):
    shape = SHAPES[name]
    c = _case(shape, seed=1)
    outs = {o: _kernel(c, shape, o, seed=5) for o in ("ascending", "descending", "shuffled")}
    for o, got in outs.items():
        for a, b in zip(got, outs["ascending"]):
            assert np.array_equal(_bits(a), _bits(b)), f"{o} order differs from ascending: a race"
    got = outs["ascending"]
    exact = G.recurrent_step_exact(**c, k_heads=shape.hk, eps=EPS)
    assert [g.shape for g in got] == [(shape.vd,), (shape.kw - 1, shape.channels), (shape.hv, shape.dv, shape.dk)]
    assert [e.shape for e in exact] == [g.shape for g in got]
    errs = _errors(got, exact)
    assert max(errs) <= TOL, f"kernel vs float64 (o, conv, state): {errs}"
    assert errs[1] == 0.0  # the conv state is a copy of the window: exact
    for gdn in ("ops", "fast"):
        ref = _mlx_ops(c, shape, gdn)
        assert max(_errors(ref, exact)) <= TOL  # the reference itself is within rounding of float64
        e = _errors(got, ref)
        assert max(e) <= TOL, f"kernel vs _recurrent's MLX ops (gdn={gdn}): {e}"


@needs_clang
@pytest.mark.parametrize("name", ["small", "bonsai-heads-2x6"])
def test_steps_in_a_row_carry_both_states(name):
    """Eight tokens, each step's conv and recurrent states fed to the next: the kernel's
    trajectory against float64's own, every output within TOL at every step."""
    shape = SHAPES[name]
    c = _case(shape, seed=2)
    c["state"] = np.zeros_like(c["state"])  # a fresh decode: zero state, as new_state makes it
    c["conv_state"] = np.zeros_like(c["conv_state"])
    mine, exact = dict(c), {k: v.astype(np.float64) for k, v in c.items()}
    rng = np.random.default_rng(3)
    for t in range(8):
        fresh = _case(shape, seed=100 + t)  # the token's own gdn_in outputs
        for k in ("mixed", "z", "ba"):
            mine[k], exact[k] = fresh[k], fresh[k].astype(np.float64)
        o, conv, st = _kernel(mine, shape, order="shuffled", seed=int(rng.integers(1 << 30)))
        eo, econv, est = G.recurrent_step_exact(**exact, k_heads=shape.hk, eps=EPS)
        errs = _errors([o, conv, st], [eo, econv, est])
        assert max(errs) <= TOL, f"step {t}: {errs}"
        mine["conv_state"], mine["state"] = conv, st
        exact["conv_state"], exact["state"] = econv, est
    assert np.abs(mine["state"]).max() > 0.01  # the state really was carried and grew


@needs_clang
def test_a_wrong_formula_is_caught():
    """The tolerance separates rounding from the mistakes a port makes: the float64 oracle
    given the inputs of each mistake (the gate without dt_bias, b and a swapped, value
    head h reading key head h % Hk instead of h // (Hv / Hk), the RMS eps ignored) is far
    outside TOL from the kernel. (A missing 1/sqrt(Dk) on q is not among them: it scales
    o before the RMS norm, which removes it up to eps; the state never sees q.)"""
    shape = SHAPES["bonsai-heads-2x6"]
    hk, dk, hv = shape.hk, shape.dk, shape.hv
    c = _case(shape, seed=4)
    got = _kernel(c, shape)

    def oracle(eps: float = EPS, **changed: np.ndarray) -> tuple[np.ndarray, ...]:
        return G.recurrent_step_exact(**dict(c, **changed), k_heads=hk, eps=eps)

    kd = hk * dk

    def swap_key_heads(a: np.ndarray) -> np.ndarray:  # key heads' q and k channels in reverse order
        a = a.copy()
        for lo in (0, kd):
            a[..., lo : lo + kd] = (
                a[..., lo : lo + kd].reshape(*a.shape[:-1], hk, dk)[..., ::-1, :].reshape(*a.shape[:-1], kd)
            )
        return a

    errs = {
        "gate without dt_bias": max(_errors(got, oracle(dt_bias=np.zeros_like(c["dt_bias"])))),
        "b and a swapped": max(_errors(got, oracle(ba=np.concatenate([c["ba"][hv:], c["ba"][:hv]])))),
        "key heads h % Hk": max(
            _errors(
                got,
                oracle(
                    mixed=swap_key_heads(c["mixed"]),
                    conv_w=swap_key_heads(c["conv_w"]),
                    conv_state=swap_key_heads(c["conv_state"]),
                ),
            )
        ),
    }
    big = [np.array(a) for a in G.gdn_step(**c, k_heads=hk, eps=0.5, backend="metal-emulated")]
    assert max(_errors(big, oracle(eps=0.5))) <= TOL  # a large eps, where it is
    errs["RMS eps ignored"] = D.worst_scaled_error(big[0], oracle(eps=1e-30)[0])
    for what, e in errs.items():
        assert e > 100 * TOL, f"{what}: only {e:.2e} from the kernel"


# -- Bonsai-27B's whole layer: on a GPU (skipped here, saying why) and emulated ------------------

_GPU = [
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not B.cuda_available(), reason="needs an NVIDIA GPU with MLX's CUDA back-end (mlx[cuda13])"
            ),
        ],
    ),
    pytest.param(
        "metal",
        marks=[
            pytest.mark.metal,
            pytest.mark.skipif(not B.metal_available(), reason="needs an Apple GPU with MLX's Metal back-end"),
        ],
    ),
    pytest.param("metal-emulated", marks=needs_clang),  # here too: ~3 s on the CPU
]


@pytest.mark.parametrize("dialect", _GPU)
def test_bonsai_layer_matches_float64_and_steps_in_a_row(dialect: str):
    """Bonsai-27B's whole layer (16 key heads, 48 value heads of 128, conv 4) on the
    device (and emulated): one step, then four in a row with the states carried in the
    schedule's [1, Hv, Dv, Dk], each within TOL of float64; the same inputs twice give
    the same bits."""
    shape = G.GdnShape(16, 48, 128, 128, 4)
    c = _case(shape, seed=6)
    step = G.prepare(c["conv_w"], c["a_log"], c["dt_bias"], c["o_norm"], EPS, k_heads=shape.hk, backend=dialect)
    exact = {k: v.astype(np.float64) for k, v in c.items()}
    conv, st = mx.array(c["conv_state"]), mx.array(c["state"])[None]  # the schedule's [1, Hv, Dv, Dk]
    for t in range(4):
        fresh = _case(shape, seed=200 + t)
        o, conv, st = step(fresh["mixed"], fresh["z"], fresh["ba"], conv, st)
        mx.eval(o, conv, st)
        if t == 0:
            again = step(fresh["mixed"], fresh["z"], fresh["ba"], mx.array(c["conv_state"]), mx.array(c["state"])[None])
            assert all(np.array_equal(_bits(np.array(a)), _bits(np.array(b))) for a, b in zip(again, (o, conv, st)))
        for k in ("mixed", "z", "ba"):
            exact[k] = fresh[k].astype(np.float64)
        eo, ec, es = G.recurrent_step_exact(**exact, k_heads=shape.hk, eps=EPS)
        assert tuple(st.shape) == (1, shape.hv, shape.dv, shape.dk)
        errs = _errors([np.array(o), np.array(conv), np.array(st)[0]], [eo, ec, es])
        assert max(errs) <= TOL, f"step {t}: {errs}"
        exact["conv_state"], exact["state"] = ec, es


# -- the CUDA translation unit ---------------------------------------------------------------


def _nvcc(src) -> subprocess.CompletedProcess:
    # Device code only (-cubin), as MLX compiles a kernel (NVRTC): the host pass is most of
    # nvcc's time and gives nothing this test reads.
    return subprocess.run(
        ["nvcc", "-arch=sm_90", "-cubin", "-o", str(src.with_suffix(".cubin")), "-Xptxas", "-v", str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_the_cuda_translation_unit_compiles_without_spills(tmp_path):
    """Bonsai-27B's layer (16 key heads, 48 value heads of 128) and the small shape."""
    shapes = {"bonsai": G.GdnShape(16, 48, 128, 128, 4), "small": SMALL}
    sources = {}
    for name, shape in shapes.items():
        src = tmp_path / f"gdn_step-{name}.cu"
        src.write_text(G.cuda_translation_unit(shape))
        sources[name] = src
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(sources, pool.map(_nvcc, sources.values())))
    for name, r in done.items():
        assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
        assert "0 bytes spill stores" in r.stderr and "error" not in r.stderr.lower(), r.stderr[-2000:]
    tu = sources["bonsai"].read_text()
    assert "__global__ void custom_kernel_fat_gdn_step(" in tu and "constexpr int HV = 48;" in tu
    assert "const float* state" in tu and "float* state_out) {" in tu


def test_the_body_is_one_text_for_both_dialects():
    _, metal_s = ks.compose("metal", "gdn_step")
    _, cuda_s = ks.compose("cuda", "gdn_step")
    body = ks.read("gdn_step.body")
    assert body in metal_s and body in cuda_s
    assert ks.KERNELS["gdn_step"].template == tuple(n for n, _ in G.template(SMALL, 64))


@needs_clang
def test_one_group_a_value_head():
    """The RMS norm of o needs a head's whole DV in one group: the grid is Hv groups."""
    for shape in SHAPES.values():
        step = G.prepare(**_consts(shape), eps=EPS, k_heads=shape.hk, backend="metal-emulated")
        assert step.kw["grid"][0] == shape.hv * step.threads and step.kw["threadgroup"][0] == step.threads
        assert step.threads == min(512, 32 * shape.dv)
        assert G.lane_floats(shape, step.threads) <= G.MAX_LANE_FLOATS


# -- bad input --------------------------------------------------------------------------------


def _consts(shape: G.GdnShape = SMALL) -> dict:
    c = _case(shape, 0)
    return {k: c[k] for k in ("conv_w", "a_log", "dt_bias", "o_norm")}


@needs_clang
def test_bad_arguments_name_the_parameter():
    c = _case(SMALL, 0)
    ok = dict(k_heads=2, eps=EPS, backend="metal-emulated")
    with pytest.raises(ValueError, match="backend: must be one of 'cuda', 'metal', 'metal-emulated'"):
        G.gdn_step(**c, k_heads=2, eps=EPS, backend="graph")
    with pytest.raises(ValueError, match="eps: must be a finite number > 0"):
        G.gdn_step(**c, k_heads=2, eps=0.0, backend="metal-emulated")
    with pytest.raises(ValueError, match=r"state: must be float32 .*float64"):
        G.gdn_step(**dict(c, state=c["state"].astype(np.float64)), **ok)
    with pytest.raises(ValueError, match=r"mixed: must have shape \(256,\)"):
        G.gdn_step(**dict(c, mixed=c["mixed"][:-1]), **ok)
    with pytest.raises(ValueError, match=r"state: must have shape \(4, 32, 32\) or \(1, 4, 32, 32\)"):
        G.gdn_step(**dict(c, state=c["state"][:, :, :16].copy()), **ok)
    with pytest.raises(ValueError, match=r"state: .*Dv: o_norm's length.*a wrong a_log, o_norm or conv_w"):
        G.gdn_step(**dict(c, state=c["state"][:, :16, :].copy()), **ok)  # the state, or the o_norm it came with
    with pytest.raises(ValueError, match="conv_state: must have shape"):
        G.gdn_step(**dict(c, conv_state=c["conv_state"][:2].copy()), **ok)
    with pytest.raises(ValueError, match="z: must be an MLX or numpy float32 array, got"):
        G.gdn_step(**dict(c, z=list(c["z"])), **ok)
    with pytest.raises(ValueError, match="conv_w: its 256 channels must be 2 k_heads Dk"):
        G.gdn_step(**c, k_heads=3, eps=EPS, backend="metal-emulated")
    with pytest.raises(ValueError, match="threads: must be a multiple of 32"):
        G.gdn_step(**c, **ok, threads=48)
    with pytest.raises(ValueError, match="threads: must be an integer >= 32 and <= 1024"):
        G.gdn_step(**c, **ok, threads=2048)
    with pytest.raises(ValueError, match="key head dim: must be a multiple of 32"):
        G.check_shape(G.GdnShape(1, 1, 48, 32, 4), 64)
    with pytest.raises(ValueError, match="value heads: must be a multiple of the key heads"):
        G.check_shape(G.GdnShape(2, 3, 32, 32, 4), 64)
    with pytest.raises(ValueError, match="conv kernel width: must be >= 2"):
        G.check_shape(G.GdnShape(1, 1, 32, 32, 1), 64)
    with pytest.raises(ValueError, match="32768"):  # Metal's 32 KB of group memory
        G.check_shape(G.GdnShape(1, 1, 512, 8192, 4), 1024)
    with pytest.raises(ValueError, match="threads: 64 leave each lane 128 floats"):  # 32 rows a warp x 128 / 32
        G.check_shape(G.GdnShape(1, 1, 128, 64, 4), 64)
    assert G.default_threads(G.GdnShape(1, 1, 512, 128, 4)) == 1024  # 4 rows a warp x 16 floats
    with pytest.raises(ValueError, match="order: must be one of"):
        G.gdn_step(**c, **ok, order="random")


@pytest.mark.skipif(B.cuda_available(), reason="this machine has the CUDA back-end")
def test_an_absent_backend_raises_and_never_falls_back():
    c = _case(SMALL, 0)
    with pytest.raises(B.BackendUnavailable, match="backend 'cuda' needs an NVIDIA GPU"):
        G.gdn_step(**c, k_heads=2, eps=EPS, backend="cuda")
    if not B.metal_available():
        with pytest.raises(B.BackendUnavailable, match="backend 'metal' needs an Apple GPU"):
            G.prepare(**_consts(), eps=EPS, k_heads=2, backend="metal")


# -- in the schedule ----------------------------------------------------------------------------

#: Bonsai's 64-layer pattern at toy widths whose key head dim the kernel serves (a multiple of 32).
TINY = Geometry(
    hidden=32,
    ffn=48,
    n_q=4,
    n_kv=1,
    head_dim=8,
    attn_output_gate=True,
    gdn_k_heads=2,
    gdn_v_heads=4,
    gdn_k_dim=32,
    gdn_v_dim=32,
    conv_kernel=4,
    vocab=64,
)


@pytest.fixture(scope="module")
def bonsai():
    return load_model("bonsai-27b")


def test_the_schedule_refuses_the_kernel_without_the_kernels_path(bonsai):
    w = HybridWeights(bonsai, TINY, seed=3, share=True)
    with pytest.raises(ValueError, match=r"gdn: 'kernel' .*\(matvec='kernels'\), got matvec='mlx'"):
        S.Schedule(bonsai, w, gdn="kernel", matvec="mlx")
    with pytest.raises(ValueError, match="gdn: must be 'fast'.*'kernel'"):
        S.Schedule(bonsai, w, gdn="kernels")
    if D.kernel_dialect() is None:
        with pytest.raises(B.BackendUnavailable, match="matvec: 'kernels' needs a kernel backend"):
            S.Schedule(bonsai, w, gdn="kernel", matvec="kernels")


class _EmulatedGdn(D.MlxMatvecs):
    """The step's matvecs as float32 MLX ops, and the recurrent step on the emulated
    gdn_step kernel (prepared once per layer weights, as ``KernelMatvecs.gdn_step_launch``
    does). ``Schedule(matvec="kernels")`` needs a GPU; this runs ``Schedule.step`` with
    ``gdn="kernel"`` here, the kernel being the Metal source executed on the CPU."""

    path = "kernels"

    def __init__(self, eps: float):
        super().__init__(eps, "float32")
        self.prepared: dict[int, G.GdnStep] = {}
        self.calls: list[str] = []

    def gdn_in(self, lw, x, mixed):
        self.calls.append("gdn_in")
        return super().gdn_in(lw, x, mixed)

    def gdn_step(self, lw, k_heads, mixed, z, ba, conv, ssm):
        self.calls.append("gdn_step")
        if id(lw) not in self.prepared:
            self.prepared[id(lw)] = G.prepare(
                lw["conv"],
                lw["a_log"],
                lw["dt_bias"],
                lw["o_norm"],
                self.eps,
                k_heads=k_heads,
                backend="metal-emulated",
            )
        return self.prepared[id(lw)](mixed, z, ba, conv, ssm)

    def out_add(self, lw, name, v, x):
        self.calls.append(f"out_add:{name}")
        return super().out_add(lw, name, v, x)

    def ffn(self, lw, x):
        self.calls.append("ffn")
        return super().ffn(lw, x)


@needs_clang
def test_a_decode_with_the_kernel_step_is_the_mlx_ops_decode(bonsai):
    """Three tokens of Bonsai's 64 layers at toy widths, stage 6 (every piece on the device):
    gdn="kernel" (the emulated gdn_step) against gdn="ops" on the same float32 MLX matvecs.
    Same waits, same tokens, logits within schedule.CHECK_TOL (the check bench.schedule_run
    makes before timing); and a recurrent layer's pieces are gdn_in, gdn_step, out_add, ffn."""
    w = HybridWeights(bonsai, TINY, seed=3, share=True)
    ref = S.Schedule(bonsai, w, gdn="ops", matvec="mlx", activations="float32")
    sched = S.Schedule(bonsai, w, gdn="ops", matvec="mlx", activations="float32")
    emu = _EmulatedGdn(TINY.eps)
    sched.mv, sched.gdn = emu, "kernel"  # what Schedule(gdn="kernel", matvec="kernels") holds on a GPU
    sa, sb = new_state(w, context=4, max_new=4), new_state(w, context=4, max_new=4)
    for t in range(3):
        emu.calls.clear()
        a, b = sched.step(sa, 6), ref.step(sb, 6)
        assert a.waits == b.waits == waits.waits_per_token(bonsai, 6)
        err = D.worst_scaled_error(a.logits, b.logits)
        assert err <= S.CHECK_TOL, f"token {t}: {err:.2e}"
        assert a.next_token == b.next_token
    n_rec = sum(lay.kind == "recurrent" for lay in w.layers)
    rec_calls = [c for c in emu.calls if c != "out_add:wo"]
    assert rec_calls.count("gdn_step") == n_rec == 48
    first = emu.calls.index("gdn_in")
    assert emu.calls[first : first + 4] == ["gdn_in", "gdn_step", "out_add:out", "ffn"]
    for li in new_state(w).ssm:  # the states the kernel carried are the ops path's (rounding apart:
        # each layer's input x went through every layer before it, on two paths)
        assert D.worst_scaled_error(np.array(sa.ssm[li]), np.array(sb.ssm[li])) <= TOL
        assert D.worst_scaled_error(np.array(sa.conv[li]), np.array(sb.conv[li])) <= TOL
