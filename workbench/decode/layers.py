"""The layers of a hybrid's decode token as lazy ops: Gated DeltaNet's recurrent step and the attention.

A recurrent layer (:func:`recurrent_layer`) runs on the device, its recurrence through
``mx.fast.gated_delta_update``, or through :func:`gated_delta_ops` (the same rule as plain
MLX ops, for a device where the fast op does not run: :func:`fast_gdn_available`), or
with the project's kernels as one launch (``workbench.kernels.gdn_step``). The attention
of one token against its KV cache runs on the host in numpy (:func:`attend_np`), as
frink-models' engine runs it, or on the device as MLX ops (:func:`attend_mx`, the plan's
device floor).

Simplifications, none of which moves a wait: no RoPE and no per-head q/k norm in the
attention (host work of a few microseconds), no Hadamard fold on wo.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import mlx.core as mx
import numpy as np

from workbench.decode import matvec
from workbench.decode.geometry import Geometry
from workbench.decode.state import DecodeState


def gated_delta_ops(q, k, v, gamma, beta, state) -> tuple[mx.array, mx.array]:
    """One token of the gated delta rule as plain MLX ops: ``mx.fast.gated_delta_update``'s twin.

    Shapes as that op takes them with T = 1: q, k [B, 1, Hk, Dk], v [B, 1, Hv, Dv], gamma,
    beta [B, 1, Hv], state [B, Hv, Dv, Dk]; value head h reads key head h // (Hv / Hk).
    ``S = gamma S; S += beta (v - S k) k^T; o = S q``. For a device where the fast op is
    missing; the schedule says which one it ran.
    """
    hk, hv = k.shape[2], v.shape[2]
    qq = mx.repeat(q[:, 0], hv // hk, axis=1)
    kk = mx.repeat(k[:, 0], hv // hk, axis=1)
    s = state * gamma[:, 0][:, :, None, None]
    delta = (v[:, 0] - (s * kk[:, :, None, :]).sum(-1)) * beta[:, 0][:, :, None]
    s = s + delta[:, :, :, None] * kk[:, :, None, :]
    o = (s * qq[:, :, None, :]).sum(-1)
    return o[:, None], s


def fast_gdn_available() -> tuple[bool, str]:
    """Whether ``mx.fast.gated_delta_update`` runs on MLX's default device (and why not)."""
    try:
        q = mx.ones((1, 1, 1, 4))
        v = mx.ones((1, 1, 1, 4))
        g = mx.ones((1, 1, 1))
        mx.eval(mx.fast.gated_delta_update(q, q, v, g, g, initial_state=mx.zeros((1, 1, 4, 4))))
        return True, ""
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"


#: How a recurrent layer's recurrence runs (``Schedule``'s ``gdn``).
GDN_PATHS: tuple[str, ...] = ("fast", "ops", "kernel")


def recurrent_step(
    mixed: mx.array,
    z: mx.array,
    ba: mx.array,
    conv_state: mx.array,
    state: mx.array,
    conv_w: mx.array,
    a_log: mx.array,
    dt_bias: mx.array,
    o_norm: mx.array,
    *,
    k_heads: int,
    eps: float,
    gdn: str = "ops",
) -> tuple[mx.array, mx.array, mx.array]:
    """The Gated DeltaNet mixer of one token, float32 MLX ops, for B sequences at once: the
    workbench's float32 reference of the step (``workbench.kernels.gdn_step``'s formulas).

    ``mixed`` [B, C], ``z`` [B, Hv Dv], ``ba`` [B, 2 Hv] (b then a), ``conv_state`` [B, K-1, C],
    ``state`` [B, Hv, Dv, Dk]; the constants shared (``conv_w`` [K, C], ``a_log``, ``dt_bias``
    [Hv], ``o_norm`` [Dv]) or one set a sequence (a leading B); returns ``(out [B, Hv Dv],
    conv_state', state')``, lazy.
    ``gdn``: ``"fast"`` (``mx.fast.gated_delta_update``) or ``"ops"`` (:func:`gated_delta_ops`).
    """
    bsz, hv, dv, dk = state.shape
    kd = k_heads * dk
    window = mx.concatenate([conv_state, mixed[:, None]], axis=1)  # [B, K, C]: the short convolution
    c = (window * conv_w).sum(axis=1)
    c = c * mx.sigmoid(c)
    q = c[:, :kd].reshape(bsz, 1, k_heads, dk)
    k = c[:, kd : 2 * kd].reshape(bsz, 1, k_heads, dk)
    v = c[:, 2 * kd :].reshape(bsz, 1, hv, dv)
    q = q * mx.rsqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(dk)
    k = k * mx.rsqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    b, a = ba[:, :hv], ba[:, hv:]
    beta = mx.sigmoid(b).reshape(bsz, 1, hv)
    gamma = mx.exp(-mx.exp(a_log) * mx.logaddexp(a + dt_bias, 0.0)).reshape(bsz, 1, hv)
    if gdn == "fast":
        o, state = mx.fast.gated_delta_update(q, k, v, gamma, beta, initial_state=state)
    else:
        o, state = gated_delta_ops(q, k, v, gamma, beta, state)
    o = matvec.rms(o.reshape(bsz, hv, dv), o_norm[:, None] if o_norm.ndim == 2 else o_norm, eps)
    zz = z.reshape(bsz, hv, dv)
    return (o * (zz * mx.sigmoid(zz))).reshape(bsz, hv * dv), window[:, 1:], state


def recurrent_layer(
    geom: Geometry, w: Mapping[str, mx.array], x: mx.array, st: DecodeState, li: int, gdn: str, mv
) -> mx.array:
    """Recurrent layer ``l`` of one token, lazy: the Gated DeltaNet mixer, then the FFN; returns the new hidden.

    ``w``: the layer's weights (:class:`~workbench.decode.state.HybridWeights`); ``st``: the
    state whose ``conv[l]`` and ``ssm[l]`` it reads and replaces; ``mv``: the step's
    matvecs (``workbench.decode.matvec``), which run every weight's product. ``gdn``: one
    of :data:`GDN_PATHS`. The short convolution, the q/k L2 norms, the gates, the delta rule
    and the z gate are MLX ops around ``mx.fast.gated_delta_update`` (``"fast"``) or
    :func:`gated_delta_ops` (``"ops"``), or all in one launch of the gdn_step kernel (``"kernel"``).
    """
    g = geom
    kd, vd = g.gdn_k_heads * g.gdn_k_dim, g.gdn_v_heads * g.gdn_v_dim
    mixed, z, ba = mv.gdn_in(w, x, 2 * kd + vd)
    if gdn == "kernel":  # everything below, to the z gate, in ONE launch (workbench.kernels.gdn_step)
        o, st.conv[li], st.ssm[li] = mv.gdn_step(w, g.gdn_k_heads, mixed, z, ba, st.conv[li], st.ssm[li])
        x = mv.out_add(w, "out", o, x)
        return mv.ffn(w, x)
    o, conv, st.ssm[li] = recurrent_step(
        mixed[None],
        z[None],
        ba[None],
        st.conv[li][None],
        st.ssm[li],
        w["conv"],
        w["a_log"],
        w["dt_bias"],
        w["o_norm"],
        k_heads=g.gdn_k_heads,
        eps=g.eps,
        gdn=gdn,
    )
    st.conv[li] = conv[0]
    o = o[0]
    x = mv.out_add(w, "out", o, x)
    return mv.ffn(w, x)


def attend_np(geom: Geometry, q: np.ndarray, kc: np.ndarray, vc: np.ndarray) -> np.ndarray:
    """GQA softmax attention of one token on the host; returns the gated branch (float32).

    ``q``: the token's query row (``branch`` values, then as many of the output gate where the
    geometry has one); ``kc``, ``vc``: the cache with the token's own key and value, ``[T, n_kv, head_dim]``.
    """
    g = geom
    qq = q[: g.branch].reshape(g.n_kv, g.n_q // g.n_kv, g.head_dim)
    s = np.einsum("hgd,thd->hgt", qq, kc) / math.sqrt(g.head_dim)
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    o = np.einsum("hgt,thd->hgd", p, vc).reshape(g.branch)
    if g.attn_output_gate:
        gate = q[g.branch :]
        o = o / (1.0 + np.exp(-gate))
    return o.astype(np.float32)


def attend_mx(geom: Geometry, q: mx.array, kc: mx.array, vc: mx.array) -> mx.array:
    """The same attention as MLX ops (the device floor)."""
    g = geom
    qq = q[: g.branch].reshape(g.n_kv, g.n_q // g.n_kv, g.head_dim)
    s = mx.einsum("hgd,thd->hgt", qq, kc) / math.sqrt(g.head_dim)
    o = mx.einsum("hgt,thd->hgd", mx.softmax(s, axis=-1), vc).reshape(g.branch)
    if g.attn_output_gate:
        o = o * mx.sigmoid(q[g.branch :])
    return o
