"""The attention head's float32 reference in MLX: the operations mlx-lm runs a head with
(``mx.fast.rms_norm``, a matmul, ``mx.fast.rope`` with ``traditional=False`` and the
position as its offset, as ``Qwen3NextAttention`` calls them), a block of cases at once.

The check's yardstick: a correct float32 head's errors against the float64 truth are this
one's on the same cases (``workbench.check.verdict``); the truth itself is
:func:`workbench.check.head_math.head_exact`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from workbench.check.head_math import HeadWeights
from workbench.check.head_spec import HeadSpec


def head_reference(spec: HeadSpec, w: HeadWeights, hidden: np.ndarray, position: int) -> dict[str, np.ndarray]:
    """``spec``'s head for S cases of float32 weights ``w`` and ``hidden`` [S, hidden], all at
    ``position``: name -> [S, width] float32 (numpy), evaluated."""
    h = mx.array(np.asarray(hidden, np.float32))
    n = mx.fast.rms_norm(h, None, spec.eps) * mx.array(w.attn_norm)
    if w.rotations:
        n = mx.stack([f.rotate(n[i]) for i, f in enumerate(w.rotations)])
    col = n[:, :, None]
    q, k, v = (mx.matmul(mx.array(m), col)[:, :, 0] for m in (w.q_w, w.k_w, w.v_w))
    if spec.bias:
        q, k, v = q + mx.array(w.q_b), k + mx.array(w.k_b), v + mx.array(w.v_b)
    s, d = q.shape[0], spec.head_dim
    out = {}
    if spec.gate:
        q, gate = mx.split(q.reshape(s, spec.q_heads, 2 * d), 2, axis=-1)
        out["gate"] = gate.reshape(s, -1)
    qh, kh = q.reshape(s, spec.q_heads, 1, d), k.reshape(s, spec.kv_heads, 1, d)
    if spec.qk_norm:
        qh = mx.fast.rms_norm(qh, None, spec.eps) * mx.array(w.q_norm)[:, None, None, :]
        kh = mx.fast.rms_norm(kh, None, spec.eps) * mx.array(w.k_norm)[:, None, None, :]
    if spec.rotary_dim:
        rope = dict(traditional=False, base=spec.rope_theta, scale=1.0, offset=int(position))
        qh, kh = mx.fast.rope(qh, spec.rotary_dim, **rope), mx.fast.rope(kh, spec.rotary_dim, **rope)
    out = {"q": qh.reshape(s, -1), "k": kh.reshape(s, -1), "v": v, **out}
    mx.eval(*out.values())
    return {name: np.array(out[name]) for name in spec.outputs}
