"""The Gated DeltaNet step in numpy, a block of sequences at once: the float64 truth, and the
float32 step given one known bug (the fault models).

One function (:func:`step_block`) so the truth and every fault are the same arithmetic but
for the one thing a fault changes: a fault's error against the truth is the bug's and
float32 rounding's, nothing else. In float64 with no fault it is the oracle of
``workbench.kernels.gdn_step.recurrent_step_exact`` for many cases at once (the same
formulas; ``tests/test_check_gdn_faults.py`` holds them equal), cheap enough for thousands
of tokens. The faults are the ones recurrent kernels are known to ship (the issue cites
ollama's bfloat16 state, SGLang's bfloat16 beta, mlx-lm's eps outside the root).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.kernels.gdn_step import L2_EPS

#: fault name -> what it does (for tables and ``--help``).
GDN_FAULTS: dict[str, str] = {
    "state_bfloat16": "the recurrent state stored as bfloat16 between tokens",
    "beta_bfloat16": "beta = sigmoid(b) narrowed to bfloat16 in a float32 buffer",
    "decay_after_update": "the decay gamma applied after the delta update instead of before",
    "scale_missing": "q not multiplied by 1/sqrt(Dk)",
    "l2_eps_outside_root": "the q and k L2 norms divide by sqrt(sum x^2) + eps instead of sqrt(sum x^2 + eps)",
    "key_head_modulo": "value head h reads key head h % Hk instead of h // (Hv / Hk)",
    "conv_not_shifted": "the conv window is never shifted: the conv state comes back unchanged",
    "softplus_dropped": "gamma = exp(-exp(A_log) (a + dt_bias)), softplus dropped",
}


@dataclass(frozen=True)
class StepWeights:
    """A recurrent layer's step constants, one set a sequence: ``conv_w`` [S, K, C], ``a_log``
    and ``dt_bias`` [S, Hv], ``o_norm`` [S, Dv]; ``eps`` the RMS norm's, ``k_heads`` Hk."""

    conv_w: np.ndarray
    a_log: np.ndarray
    dt_bias: np.ndarray
    o_norm: np.ndarray
    eps: float
    k_heads: int

    def astype(self, dtype: Any) -> StepWeights:
        return StepWeights(
            *(np.asarray(a, dtype=dtype) for a in (self.conv_w, self.a_log, self.dt_bias, self.o_norm)),
            eps=self.eps,
            k_heads=self.k_heads,
        )


def bfloat16_round(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), back in float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), x, rounded.view(np.float32)).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def step_block(
    w: StepWeights,
    mixed: np.ndarray,
    z: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    conv_state: np.ndarray,
    state: np.ndarray,
    *,
    fault: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token for S sequences: ``mixed`` [S, C], ``z`` [S, Hv Dv], ``b`` and ``a`` [S, Hv],
    ``conv_state`` [S, K-1, C], ``state`` [S, Hv, Dv, Dk]; returns ``(out [S, Hv Dv],
    conv_state', state')`` in ``w``'s dtype (float64: the truth; float32: a fault model).
    ``fault``: a name of :data:`GDN_FAULTS` or None."""
    if fault is not None and fault not in GDN_FAULTS:
        raise ValueError(f"fault: must be one of {tuple(GDN_FAULTS)} or None, got {fault!r}")
    dt = w.conv_w.dtype.type
    n, hv, dv, dk = state.shape
    hk = w.k_heads
    kd = hk * dk
    window = np.concatenate([conv_state, mixed[:, None]], axis=1)
    c = (window * w.conv_w).sum(axis=1)
    c = c * _sigmoid(c)
    q = c[:, :kd].reshape(n, hk, dk)
    k = c[:, kd : 2 * kd].reshape(n, hk, dk)
    v = c[:, 2 * kd :].reshape(n, hv, dv)
    eps2 = dt(L2_EPS)
    if fault == "l2_eps_outside_root":
        q = q / (np.sqrt((q * q).sum(-1, keepdims=True)) + eps2)
        k = k / (np.sqrt((k * k).sum(-1, keepdims=True)) + eps2)
    else:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps2)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps2)
    if fault != "scale_missing":
        q = q / np.sqrt(dt(dk))
    heads = np.arange(hv) % hk if fault == "key_head_modulo" else np.arange(hv) // (hv // hk)
    q, k = q[:, heads], k[:, heads]
    beta = _sigmoid(b)
    if fault == "beta_bfloat16":
        beta = bfloat16_round(beta)
    x = a + w.dt_bias
    with np.errstate(over="ignore"):
        sp = x if fault == "softplus_dropped" else np.logaddexp(x, dt(0))
        gamma = np.exp(-np.exp(w.a_log) * sp)
    with np.errstate(over="ignore", invalid="ignore"):  # softplus dropped: gamma overflows, as the bug does
        # s is always a new array (the caller's state is never written), updated in place after
        s = state.copy() if fault == "decay_after_update" else state * gamma[:, :, None, None]
        delta = (v - (s @ k[..., None])[..., 0]) * beta[:, :, None]
        s += delta[:, :, :, None] * k[:, :, None, :]
        if fault == "decay_after_update":
            s *= gamma[:, :, None, None]
        o = (s @ q[..., None])[..., 0]
        o = o / np.sqrt((o * o).mean(-1, keepdims=True) + dt(w.eps)) * w.o_norm[:, None, :]
    zz = z.reshape(n, hv, dv)
    out = (o * zz * _sigmoid(zz)).reshape(n, hv * dv)
    if fault == "state_bfloat16":
        s = bfloat16_round(s)
    conv_out = conv_state if fault == "conv_not_shifted" else window[:, 1:]
    return out.astype(dt, copy=False), conv_out.astype(dt, copy=False), s.astype(dt, copy=False)
