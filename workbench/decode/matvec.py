"""The matrix-vector products of a hybrid model's decode step, on one of two paths.

``workbench.decode.schedule`` runs a decode token stage by stage of the plan; every weight it
streams passes through one of five products (``attn_qkv``, ``gdn_in``, ``out_add``, ``ffn``,
``logits``), which this module provides twice, so the project's kernels can be checked
against MLX ops on the same token:

* ``"mlx"`` (:class:`MlxMatvecs`): MLX ops, on any MLX device;
* ``"kernels"`` (:class:`KernelMatvecs`): the project's own kernels (``kernels/``), weights
  read in their stored format and float32 activations, so nothing is cast per call. Where no
  kernel backend exists (CUDA, Metal), :func:`resolve_matvec` raises ``BackendUnavailable``
  rather than silently falling back to MLX ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.fold.weights import QuantizedBase, WeightMatrix
from workbench.kernels import gdn_step as gdn_kernel
from workbench.kernels import head as kernel_head
from workbench.kernels import launch as kernel_launch
from workbench.kernels import matrices as kernel_matrices
from workbench.kernels import run as kernel_run
from workbench.kernels import tuning as kernel_tuning
from workbench.kernels.contract import TailLaunch
from workbench.kernels.tuning import KernelTuning
from workbench.validate import one_of

#: The decode step's matvec paths.
MATVEC_PATHS: tuple[str, ...] = ("mlx", "kernels")

#: What the ``"mlx"`` path multiplies a dense weight by: x cast to the weights' dtype,
#: or float32 throughout (the weight cast per call, as the kernels' arithmetic).
ACTIVATIONS: tuple[str, ...] = ("weights", "float32")


def kernel_dialect() -> str | None:
    """The kernel dialect this machine runs (``"cuda"`` or ``"metal"``), or None."""
    if backends.cuda_available():
        return "cuda"
    if backends.metal_available():
        return "metal"
    return None


def resolve_matvec(matvec: str) -> tuple[str, str | None]:
    """``(path, dialect)`` for ``matvec`` (``"mlx"`` or ``"kernels"``).

    ``"kernels"`` where no kernel backend exists raises ``BackendUnavailable`` (never a
    silent fall back to MLX ops).
    """
    one_of("matvec", matvec, MATVEC_PATHS)
    if matvec == "mlx":
        return "mlx", None
    dialect = kernel_dialect()
    if dialect is None:
        raise backends.BackendUnavailable(
            "matvec: 'kernels' needs a kernel backend (MLX with CUDA on an NVIDIA GPU, or Metal on an Apple GPU); "
            f"this MLX runs on {backends.device_kind()}. Use matvec='mlx' (MLX ops) here."
        )
    return "kernels", dialect


def rms(x: mx.array, w: mx.array, eps: float) -> mx.array:
    """``rms_norm(x) * w`` over the last axis, float32."""
    return x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps) * w


def mlx_matvec(w: mx.array | QuantizedBase, x: mx.array, activations: str = "weights") -> mx.array:
    """``w @ x`` as MLX ops, float32 out: dense (x in the weights' dtype, or float32), or quantized."""
    if isinstance(w, QuantizedBase):
        s = w.spec
        # One row in: MLX 0.32.4's CUDA quantized_matmul fails on 1-D input.
        return mx.quantized_matmul(
            x.astype(mx.float32)[None],
            w.w,
            w.scales,
            w.biases,
            transpose=True,
            group_size=s.group_size,
            bits=s.bits,
            mode=s.mode,
        )[0].astype(mx.float32)
    if activations == "float32":
        return x.astype(mx.float32) @ w.astype(mx.float32).T
    return (x.astype(w.dtype) @ w.T).astype(mx.float32)


def matrix_bytes(w: mx.array | QuantizedBase) -> int:
    """Bytes a product with ``w`` streams: the weights, and scales and biases where quantized."""
    return int(w.nbytes)


class MlxMatvecs:
    """The step's products as MLX ops (any device). ``activations``: see :data:`ACTIVATIONS`.

    A dense weight multiplies ``x`` cast to its dtype (``activations="weights"``: what the
    schedule always did) or a float32 copy of itself (``activations="float32"``: the same
    arithmetic as the kernels, which is what the kernels are checked against); a quantized
    one goes through ``mx.quantized_matmul``.
    """

    path = "mlx"

    def __init__(self, eps: float, activations: str = "weights"):
        self.eps = float(eps)
        self.activations = one_of("activations", activations, ACTIVATIONS)

    def describe(self) -> str:
        how = (
            "x cast to the weights' dtype"
            if self.activations == "weights"
            else "float32 activations, each weight cast to float32 per call"
        )
        return f"MLX ops ({how}; quantized weights through mx.quantized_matmul)"

    def _mv(self, w, x):
        return mlx_matvec(w, x, self.activations)

    def attn_qkv(self, lw: Mapping[str, Any], x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        h = rms(x, lw["norm"], self.eps)
        return self._mv(lw["wq"], h), self._mv(lw["wk"], h), self._mv(lw["wv"], h)

    def gdn_in(self, lw: Mapping[str, Any], x: mx.array, mixed: int) -> tuple[mx.array, mx.array, mx.array]:
        h = rms(x, lw["norm"], self.eps)
        qkvz = self._mv(lw["in_qkvz"], h)
        return qkvz[:mixed], qkvz[mixed:], self._mv(lw["in_ba"], h)

    def out_add(self, lw: Mapping[str, Any], name: str, v: mx.array, x: mx.array) -> mx.array:
        return x + self._mv(lw[name], v)

    def ffn(self, lw: Mapping[str, Any], x: mx.array) -> mx.array:
        n = rms(x, lw["ffn_norm"], self.eps)
        g = self._mv(lw["gate"], n)
        return x + self._mv(lw["down"], (g * mx.sigmoid(g)) * self._mv(lw["up"], n))

    def logits(self, lm_head, final_norm: mx.array, x: mx.array) -> mx.array:
        return self._mv(lm_head, rms(x, final_norm, self.eps))


# -- the kernels path -------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One prepared kernel launch: ``kernel(inputs=[*dynamic, *consts], **kw)``, or with
    ``split`` ``[x, *consts, residual]`` (``wo_residual`` takes x first, the residual last)."""

    kernel: Any
    consts: tuple
    kw: dict
    split: bool = False

    def __post_init__(self) -> None:
        kernel_launch.settle_constants(*self.consts)  # a recurrent layer is traced by mx.compile

    def inputs(self, *dynamic: mx.array) -> list[mx.array]:
        if self.split:
            return [dynamic[0], *self.consts, dynamic[1]]
        return [*dynamic, *self.consts]

    def __call__(self, *dynamic: mx.array) -> list[mx.array]:
        return self.kernel(inputs=self.inputs(*dynamic), **self.kw)


def _kernel_matrix(name: str, w: mx.array | QuantizedBase):
    return kernel_matrices.kernel_matrix(name, WeightMatrix(w))


def matvec_launch(dialect: str, w: mx.array | QuantizedBase, t: KernelTuning, name: str) -> Launch:
    """``residual + W x`` through ``wo_residual`` with no fold (a plain matvec plus an add)."""
    m = _kernel_matrix(name, w)
    kernel_matrices.check_width(f"{name}'s in dimension", m.cols)
    rot = kernel_launch.rotation_template(None, m.cols)
    template = [
        ("NT", t.wo_nt),
        ("FMT", m.fmt),
        ("SFMT", m.sfmt),
        ("GS", m.gs),
        ("QI", m.qi),
        ("WIDTH", m.cols),
        ("ROWS", m.rows),
        ("ROT", False),
        ("M", 1),
        ("LOGP", 0),
        ("U", kernel_matrices.units_for(m.fmt, t.u_wo)),
        ("PRE", bool(t.pre_wo)),
    ]
    kernel_run.check_group_memory(dialect, "wo_residual", template, f"{name}'s in dimension ({m.cols})")
    kw = dict(
        template=template,
        grid=(kernel_tuning.grid_size(m.rows, t.wo_nt, t, t.wo_groups_per_sm), 1, 1),
        threadgroup=(t.wo_nt, 1, 1),
        output_shapes=[(m.rows,)],
        output_dtypes=[mx.float32],
    )
    consts = (rot["sdest"], rot["table"], kernel_launch.params_array(0.0, 1.0), m.w, m.s, m.b)
    return Launch(kernel_run.compiled_kernel(dialect, "wo_residual"), consts, kw, split=True)


def _head_launch(dialect: str, norm: mx.array, eps: float, mats: list[tuple[str, Any]], t: KernelTuning) -> Launch:
    """Three projections of ``rms_norm(x) * norm`` through ``head_qkv`` with no fold."""
    ms = [_kernel_matrix(n, w) for n, w in mats]
    rot = kernel_launch.rotation_template(None, ms[0].cols)
    kw = kernel_head.head_call(dialect, ms, rot, t, ", ".join(n for n, _ in mats))
    consts: list[mx.array] = [norm.astype(mx.float32), kernel_launch.params_array(eps, 1.0), rot["sdest"], rot["table"]]
    for m in ms:
        consts += [m.w, m.s, m.b]
    return Launch(kernel_run.compiled_kernel(dialect, "head_qkv"), tuple(consts), kw)


def _rows(w: mx.array | QuantizedBase, start: int, stop: int) -> mx.array | QuantizedBase:
    """Rows ``start:stop`` of a weight as its own contiguous arrays (the head launch takes
    three matrices; the Gated DeltaNet input projection is stored as one)."""
    if isinstance(w, QuantizedBase):
        parts = [mx.contiguous(a[start:stop]) for a in (w.w, w.scales)]
        b = None if w.biases is None else mx.contiguous(w.biases[start:stop])
        mx.eval(*parts, *([b] if b is not None else []))
        return QuantizedBase(parts[0], parts[1], b, w.spec, (stop - start, w.shape[1]))
    out = mx.contiguous(w[start:stop])
    mx.eval(out)
    return out


class KernelMatvecs:
    """The step's products through the project's kernels (``dialect``: ``"cuda"`` or ``"metal"``).

    The weights are read in their stored format (bf16, or a quantized format the kernels
    serve) and the activations are float32. The five products, with the kernel each runs:

    ========================  ===================================  ===========================
    product                   what                                 kernel
    ========================  ===================================  ===========================
    ``attn_qkv``              q, k, v of ``rms_norm(x) * norm``    ``head_qkv`` (one launch)
    ``gdn_in``                mixed, z, b/a of the same            ``head_qkv`` (one launch)
    ``out_add``               ``x + W v`` (wo, the GDN out)        ``wo_residual``, no fold
    ``ffn``                   ``x + down(silu(gate n) * up n)``    ``ffn_gate_up``, ``ffn_down``
    ``logits``                ``lm_head (rms_norm(x) * norm)``     ``wo_residual``, residual 0
    ========================  ===================================  ===========================

    The existing bodies serve all five: the head launch computes any three projections of
    one RMS-normed vector (the Gated DeltaNet input projection is one: mixed q/k/v, z and
    b/a), and ``wo_residual`` without a fold is ``residual + W x``. With
    ``Schedule(gdn="kernel")`` this path also runs a recurrent layer's step between
    ``gdn_in`` and ``out_add`` (conv, norms, gates, gated delta rule, RMS norm, z gate) as
    one launch: :meth:`gdn_step` (``workbench.kernels.gdn_step``, ``gdn_step.body``).

    Launches are prepared on first use per layer-weights dict (one set per layer kind
    when the weights are shared) and kept: the constants made into arrays, the grids
    computed, as ``kernel_launch.PreparedTail`` does for a tail, so a token costs MLX's own
    work and little Python. The FFN uses ``kernel_launch.PreparedTail``'s gate/up and down
    launches; the rest :class:`Launch` objects built the same way.
    """

    path = "kernels"

    def __init__(self, eps: float, dialect: str, tuning: KernelTuning | None = None):
        one_of("dialect", dialect, kernel_launch.KERNEL_BACKENDS)
        self.eps = float(eps)
        self.dialect = dialect
        self.tuning = kernel_tuning.checked_tuning(tuning)
        # Launches by layer-weights dict (a dict can be neither hashed nor weakly referenced):
        # each entry holds its dict, so the dict outlives its key and no other can take its
        # id. Bounded by the layers this object is handed; it dies with this object.
        self._prepared: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        self._keep: list = []  # lm_head stand-ins (_head_key)

    def describe(self) -> str:
        return (
            f"the project's kernels ({self.dialect}): head_qkv, wo_residual, ffn_gate_up, ffn_down; weights in "
            "their stored format, float32 activations"
        )

    def _for(self, lw: Mapping[str, Any], what: str, make) -> Any:
        entry = self._prepared.get(id(lw))
        if entry is None:
            entry = self._prepared[id(lw)] = (lw, {})
        per = entry[1]
        if what not in per:
            per[what] = make()
        return per[what]

    # The launches, prepared on first use (public so that a test can run each one alone,
    # e.g. emulated on the CPU, and a bench can time it).

    def qkv_launch(self, lw: Mapping[str, Any]) -> Launch:
        """The attention layer's head launch: q, k, v of ``rms_norm(x) * norm``; input x."""
        return self._for(
            lw,
            "attn_qkv",
            lambda: _head_launch(
                self.dialect, lw["norm"], self.eps, [("wq", lw["wq"]), ("wk", lw["wk"]), ("wv", lw["wv"])], self.tuning
            ),
        )

    def gdn_in_launch(self, lw: Mapping[str, Any], mixed: int) -> Launch:
        """The Gated DeltaNet input projection as one head launch: rows ``:mixed`` of
        in_qkvz (q, k, v before the convolution), the rest (z), and in_ba; input x."""

        def make() -> Launch:
            w = lw["in_qkvz"]
            rows = w.shape[0]
            return _head_launch(
                self.dialect,
                lw["norm"],
                self.eps,
                [
                    ("in_qkvz[:mixed]", _rows(w, 0, mixed)),
                    ("in_qkvz[mixed:]", _rows(w, mixed, rows)),
                    ("in_ba", lw["in_ba"]),
                ],
                self.tuning,
            )

        return self._for(lw, f"gdn_in:{mixed}", make)

    def gdn_step_launch(self, lw: Mapping[str, Any], k_heads: int) -> gdn_kernel.GdnStep:
        """The Gated DeltaNet layer's recurrent step as ONE launch (``kernels/gdn_step.body``):
        inputs mixed, z, ba (gdn_in's outputs), the conv state and the recurrent state."""
        return self._for(
            lw,
            f"gdn_step:{k_heads}",
            lambda: gdn_kernel.prepare(
                lw["conv"], lw["a_log"], lw["dt_bias"], lw["o_norm"], self.eps, k_heads=k_heads, backend=self.dialect
            ),
        )

    def gdn_step(
        self,
        lw: Mapping[str, Any],
        k_heads: int,
        mixed: mx.array,
        z: mx.array,
        ba: mx.array,
        conv: mx.array,
        ssm: mx.array,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """``(o, conv', ssm')``: what ``workbench.decode.layers.recurrent_layer`` passes to ``out_add`` and keeps."""
        return self.gdn_step_launch(lw, k_heads)(mixed, z, ba, conv, ssm)

    def logits_launch(self, lm_head) -> tuple[Launch, mx.array]:
        """lm_head through ``wo_residual`` and the resident zero residual it adds; inputs
        the normed x and that zero vector."""

        def make() -> tuple[Launch, mx.array]:
            ln = matvec_launch(self.dialect, lm_head, self.tuning, "lm_head")
            zeros = mx.zeros((ln.kw["output_shapes"][0][0],), dtype=mx.float32)
            mx.eval(zeros)
            return ln, zeros

        return self._for(self._head_key(lm_head), "logits", make)

    def attn_qkv(self, lw: Mapping[str, Any], x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        q, k, v = self.qkv_launch(lw)(x)
        return q, k, v

    def gdn_in(self, lw: Mapping[str, Any], x: mx.array, mixed: int) -> tuple[mx.array, mx.array, mx.array]:
        a, z, ba = self.gdn_in_launch(lw, mixed)(x)
        return a, z, ba

    def tail(self, lw: Mapping[str, Any], name: str) -> kernel_launch.PreparedTail:
        """The layer's ``x + W v`` (``name``: ``"wo"`` or ``"out"``) and its FFN, as a
        ``kernel_launch.PreparedTail`` (its ``launch_wo``, ``launch_gate_up``, ``launch_down``)."""

        def make() -> kernel_launch.PreparedTail:
            launch = TailLaunch(
                None,
                WeightMatrix(lw[name]),
                None,
                None,
                lw["ffn_norm"].astype(mx.float32),
                self.eps,
                WeightMatrix(lw["gate"]),
                WeightMatrix(lw["up"]),
                WeightMatrix(lw["down"]),
            )
            return kernel_launch.prepare_tail(launch, self.dialect, self.tuning)

        return self._for(lw, f"tail:{name}", make)

    def out_add(self, lw: Mapping[str, Any], name: str, v: mx.array, x: mx.array) -> mx.array:
        return self.tail(lw, name).launch_wo(v, x)

    def ffn(self, lw: Mapping[str, Any], x: mx.array) -> mx.array:
        # Any of the layer's tails carries the same FFN launches; take the one prepared.
        name = "wo" if "wo" in lw else "out"
        t = self.tail(lw, name)
        return t.launch_down(t.launch_gate_up(x), x)

    def logits(self, lm_head, final_norm: mx.array, x: mx.array) -> mx.array:
        # The final norm as MLX ops (a few tiny launches), then lm_head through wo_residual
        # with a resident zero residual.
        launch, zeros = self.logits_launch(lm_head)
        return launch(rms(x, final_norm, self.eps), zeros)[0]

    def _head_key(self, lm_head) -> dict:
        """A dict standing for ``lm_head`` in the per-weights store (made once, kept)."""
        for d in self._keep:
            if d.get("lm_head") is lm_head and len(d) == 1:
                return d
        d = {"lm_head": lm_head}
        self._keep.append(d)
        return d


def make_matvecs(
    matvec: str, eps: float, *, activations: str = "weights", tuning: KernelTuning | None = None
) -> MlxMatvecs | KernelMatvecs:
    """The products for ``matvec`` (``"mlx"`` | ``"kernels"``); ``"kernels"`` raises
    ``BackendUnavailable`` where no kernel backend exists."""
    path, dialect = resolve_matvec(matvec)
    if path == "mlx":
        return MlxMatvecs(eps, activations)
    assert dialect is not None
    return KernelMatvecs(eps, dialect, tuning)


def worst_scaled_error(a: Any, b: Any) -> float:
    """``max |a - b| / max(max |b|, 1)``: the difference of two outputs relative to the
    reference's largest value (a decode step's logits, compared as a whole)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"a: must have b's shape {b.shape}, got {a.shape}")
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1.0))
