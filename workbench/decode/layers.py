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

    Shapes as that op takes them with T = 1: q, k [1, 1, Hk, Dk], v [1, 1, Hv, Dv], gamma,
    beta [1, 1, Hv], state [1, Hv, Dv, Dk]; value head h reads key head h // (Hv / Hk).
    ``S = gamma S; S += beta (v - S k) k^T; o = S q``. For a device where the fast op is
    missing; the schedule says which one it ran.
    """
    hk, hv = k.shape[2], v.shape[2]
    qq = mx.repeat(q[0, 0], hv // hk, axis=0)
    kk = mx.repeat(k[0, 0], hv // hk, axis=0)
    s = state[0] * gamma[0, 0][:, None, None]
    delta = (v[0, 0] - (s * kk[:, None, :]).sum(-1)) * beta[0, 0][:, None]
    s = s + delta[:, :, None] * kk[:, None, :]
    o = (s * qq[:, None, :]).sum(-1)
    return o[None, None], s[None]


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
    window = mx.concatenate([st.conv[li], mixed[None]], axis=0)  # [K, C]: the short convolution
    st.conv[li] = window[1:]
    c = (window * w["conv"]).sum(axis=0)
    c = c * mx.sigmoid(c)
    q = c[:kd].reshape(1, 1, g.gdn_k_heads, g.gdn_k_dim)
    k = c[kd : 2 * kd].reshape(1, 1, g.gdn_k_heads, g.gdn_k_dim)
    v = c[2 * kd :].reshape(1, 1, g.gdn_v_heads, g.gdn_v_dim)
    q = q * mx.rsqrt((q * q).sum(-1, keepdims=True) + 1e-6) / math.sqrt(g.gdn_k_dim)
    k = k * mx.rsqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    b, a = ba[: g.gdn_v_heads], ba[g.gdn_v_heads :]
    beta = mx.sigmoid(b).reshape(1, 1, -1)
    gamma = mx.exp(-mx.exp(w["a_log"]) * mx.logaddexp(a + w["dt_bias"], 0.0)).reshape(1, 1, -1)
    if gdn == "fast":
        o, st.ssm[li] = mx.fast.gated_delta_update(q, k, v, gamma, beta, initial_state=st.ssm[li])
    else:
        o, st.ssm[li] = gated_delta_ops(q, k, v, gamma, beta, st.ssm[li])
    o = matvec.rms(o.reshape(g.gdn_v_heads, g.gdn_v_dim), w["o_norm"], g.eps)
    zz = z.reshape(g.gdn_v_heads, g.gdn_v_dim)
    o = (o * (zz * mx.sigmoid(zz))).reshape(vd)
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
