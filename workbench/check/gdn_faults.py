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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.kernels.gdn_step import L2_EPS

#: Elements of the state one chunk of a step covers (value heads at a time, at least one):
#: 128k elements (1 MiB in float64): large enough that the calls a chunk makes cost little beside
#: their work, small enough that the chunk stays in cache through every pass of the delta rule.
CHUNK = 1 << 17

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


def _bfloat16_round_into(x: np.ndarray, scratch: np.ndarray) -> None:
    """:func:`bfloat16_round` of float32 ``x`` written over ``x`` (the same values), with
    ``scratch`` (4-byte items, ``x``'s size) as its one temporary: no new array of x's size."""
    bits = x.view(np.uint32)
    r = scratch.view(np.uint32).reshape(x.shape)
    np.right_shift(bits, np.uint32(16), out=r)
    r &= np.uint32(1)
    r += np.uint32(0x7FFF)
    r += bits  # wraps modulo 2^32 as bfloat16_round's sum does
    r &= np.uint32(0xFFFF0000)
    with np.errstate(invalid="ignore"):
        has_nan = np.isnan(x.sum())
    if has_nan:  # a NaN keeps its bits (a sum is NaN where any element is, and where inf - inf)
        np.copyto(r.view(np.float32), x, where=np.isnan(x))
    np.copyto(bits, r)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def chunk_rows(rows: int, row_size: int) -> int:
    """How many rows of ``row_size`` elements make one chunk (:data:`CHUNK`), at least 1, at most ``rows``."""
    return max(1, min(rows, CHUNK // row_size))


class BlockStep:
    """One token of the step for S sequences (:func:`step_block`'s arguments), made in parts:
    the constructor does everything before the state (conv, q, k, v, beta, gamma), :meth:`chunks`
    updates the state a chunk of value heads at a time (:func:`chunk_rows` of the S Hv heads),
    every operation of the delta rule on the chunk before the next so that it stays in the
    core's cache, yielding each chunk's heads ``(h0, h1)`` once they are final; :meth:`result`
    normalizes the output. A run steps the truth and every fault model chunk by chunk together
    and compares each chunk while it is in cache (``workbench.check.gdn_run``).

    ``out``: where state' is written (a C-contiguous array of ``state``'s shape in ``w``'s
    dtype; it may be ``state`` itself, then updated in place), else a new array: a run over
    thousands of tokens passes it, so no array of the state's size is made a token. The
    values are the same either way, and the same as one pass over the whole state (each
    element is the same operations in the same order)."""

    def __init__(
        self,
        w: StepWeights,
        mixed: np.ndarray,
        z: np.ndarray,
        b: np.ndarray,
        a: np.ndarray,
        conv_state: np.ndarray,
        state: np.ndarray,
        *,
        fault: str | None = None,
        out: np.ndarray | None = None,
    ):
        if fault is not None and fault not in GDN_FAULTS:
            raise ValueError(f"fault: must be one of {tuple(GDN_FAULTS)} or None, got {fault!r}")
        self.w, self.z, self.fault, self.state = w, z, fault, state
        self.dt = dt = w.conv_w.dtype.type
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
        s = np.empty(state.shape, dt) if out is None else out
        if s.shape != state.shape or s.dtype != dt or not s.flags.c_contiguous:
            raise ValueError(
                f"out: must be a C-contiguous {np.dtype(dt)} array of shape {state.shape}, got {s.dtype} {s.shape}"
            )
        self.s = s
        self.conv_out = conv_state if fault == "conv_not_shifted" else window[:, 1:]
        # S Hv heads, each a [Dv, Dk] matrix (the caller's state is never written unless it is out)
        self.rows, self.per = n * hv, chunk_rows(n * hv, dv * dk)
        self.g2, self.b2 = gamma.reshape(self.rows, 1, 1), beta.reshape(self.rows, 1)
        self.k2, self.q2, self.v2 = k.reshape(self.rows, dk, 1), q.reshape(self.rows, dk, 1), v.reshape(self.rows, dv)
        self.o = np.empty((self.rows, dv), dt)

    def chunks(self) -> Iterator[tuple[int, int]]:
        """Update the state a chunk at a time; yields each chunk's heads ``(h0, h1)`` once final."""
        s, fault, rows, per = self.s, self.fault, self.rows, self.per
        dv, dk = s.shape[2:]
        s2, st2 = s.reshape(rows, dv, dk), self.state.reshape(rows, dv, dk)
        g2, b2, k2, q2, v2 = self.g2, self.b2, self.k2, self.q2, self.v2
        upd = np.empty((per, dv, dk), self.dt)
        for h0 in range(0, rows, per):
            h = slice(h0, h0 + per)
            sc = s2[h]
            m = len(sc)
            with np.errstate(over="ignore", invalid="ignore"):  # softplus dropped: gamma overflows, as the bug does
                if fault != "decay_after_update":
                    np.multiply(st2[h], g2[h], out=sc)
                elif s is not self.state:
                    np.copyto(sc, st2[h])
                delta = (v2[h] - (sc @ k2[h])[..., 0]) * b2[h]
                sc += np.einsum("hi,hj->hij", delta, k2[h][..., 0], out=upd[:m])  # each element one product
                if fault == "decay_after_update":
                    sc *= g2[h]
                self.o[h] = (sc @ q2[h])[..., 0]
            if fault == "state_bfloat16":
                _bfloat16_round_into(sc, upd[:m])
            yield h0, h0 + m

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(out, conv_state', state')`` once :meth:`chunks` has run through."""
        dt, s = self.dt, self.s
        n, hv, dv, _ = s.shape
        with np.errstate(over="ignore", invalid="ignore"):
            o = self.o.reshape(n, hv, dv)
            o = o / np.sqrt((o * o).mean(-1, keepdims=True) + dt(self.w.eps)) * self.w.o_norm[:, None, :]
        zz = self.z.reshape(n, hv, dv)
        out = (o * zz * _sigmoid(zz)).reshape(n, hv * dv)
        return out.astype(dt, copy=False), self.conv_out.astype(dt, copy=False), s


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
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token for S sequences: ``mixed`` [S, C], ``z`` [S, Hv Dv], ``b`` and ``a`` [S, Hv],
    ``conv_state`` [S, K-1, C], ``state`` [S, Hv, Dv, Dk]; returns ``(out [S, Hv Dv],
    conv_state', state')`` in ``w``'s dtype (float64: the truth; float32: a fault model).
    ``fault``: a name of :data:`GDN_FAULTS` or None; ``out``: where state' is written
    (:class:`BlockStep`, which this runs whole)."""
    step = BlockStep(w, mixed, z, b, a, conv_state, state, fault=fault, out=out)
    for _ in step.chunks():
        pass
    return step.result()
