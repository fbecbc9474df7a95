"""Plain numpy twins of the workbench's hot paths: the same work, without checks or dispatch.

A benchmark states a workbench path as a ratio to its twin timed in the same run, so the figure says what the
workbench's own machinery costs (checks, dispatch, caches, MLX on the CPU), not how loaded the machine was.
Each twin is the work as a person would write it in numpy from the design's formulas, and gives the same bits
as its workbench path where the work is the same (``tests/test_numpy_twins.py``):

* :func:`host_tail`: the float64 oracle for one case with its fold (padded to 8 rows as ``fold.hadamard`` does);
* :func:`block_transform`: ``B x`` for a large float64 matrix as one product;
* :func:`sweep_block`: one block of a sweep's cases (float32, no fold); its float32 tail runs in numpy where the
  sweep runs MLX's graph, so that part of the ratio is MLX's CPU against numpy's.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.fold import ROW_GROUP, hadamard_matrix
from workbench.studies import CASE_BLOCK, SWEEP_SALT
from workbench.tail import case_recipe

# ROW_GROUP (imported above): rows per product in the float64 block transform (``hadamard.ROW_GROUP``:
# a row's bits do not depend on the batch when the row count is a multiple of it).


def orthonormal_t(block: int) -> np.ndarray:
    """``(H_b / sqrt(b)).T`` in float64: what ``x_block @ .`` multiplies by."""
    return (hadamard_matrix(block).astype(np.float64) / np.sqrt(block)).T.copy()


def block_transform(x: np.ndarray, h_t: np.ndarray) -> np.ndarray:
    """``B x`` along the last axis of a float64 ``x`` whose rows of blocks are a multiple of 8:
    one product (``h_t`` from :func:`orthonormal_t`)."""
    b = h_t.shape[0]
    return (x.reshape(-1, b) @ h_t).reshape(x.shape)


def host_tail(
    wo: np.ndarray,
    signs: np.ndarray,
    h_t: np.ndarray,
    norm: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    eps: float,
    branch: np.ndarray,
    residual: np.ndarray,
) -> np.ndarray:
    """The float64 tail of one case, wo folded at its input with ``signs`` and blocks ``h_t``:
    ``h = residual + wo (B D branch)``, ``out = h + down(silu(gate n) * up n)``, ``n`` the RMS norm.
    ``branch`` and ``residual`` as the caller has them (float32 in the test case): read as float64 here."""
    branch, residual = branch.astype(np.float64), residual.astype(np.float64)
    b = h_t.shape[0]
    rows = (branch * signs).reshape(-1, b)
    n = rows.shape[0]
    pad = np.zeros((n + (-n) % ROW_GROUP, b))
    pad[:n] = rows
    x = (pad @ h_t)[:n].reshape(branch.shape)
    h = residual + x @ wo.T
    normed = h * (1.0 / np.sqrt(np.add.reduce(h * h, axis=-1, keepdims=True) / h.shape[-1] + eps)) * norm
    g = normed @ gate.T
    with np.errstate(over="ignore"):
        act = g / (1.0 + np.exp(-g))
    return h + (act * (normed @ up.T)) @ down.T


def tail_batched(
    wo: np.ndarray,
    norm: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    eps: float,
    branch: np.ndarray,
    residual: np.ndarray,
) -> np.ndarray:
    """The tail over a batch of cases, each with its own weights, in the arrays' dtype."""

    def mv(w: np.ndarray, x: np.ndarray) -> np.ndarray:
        return (w @ x[..., None])[..., 0]

    h = residual + mv(wo, branch)
    dt = h.dtype.type
    normed = h * (dt(1.0) / np.sqrt(np.add.reduce(h * h, axis=-1, keepdims=True) / h.shape[-1] + dt(eps))) * norm
    g = mv(gate, normed)
    with np.errstate(over="ignore"):
        act = g / (dt(1.0) + np.exp(-g))
    return h + mv(down, act * mv(up, normed))


def draw_cases(shape: tuple[int, int, int], block: int) -> dict[str, np.ndarray]:
    """A block's float32 master arrays: one bulk draw, split in recipe order, ``c + U(-a, a)``."""
    recipe = case_recipe(*shape)
    n = sum(math.prod(d.shape) for d in recipe)
    u = np.random.default_rng([SWEEP_SALT, *shape, block]).random((CASE_BLOCK, n), dtype=np.float32)
    out, o = {}, 0
    for d in recipe:
        k = math.prod(d.shape)
        v = u[:, o : o + k]
        o += k
        if d.signs:
            out[d.name] = np.where(v < 0.5, np.float32(-1.0), np.float32(1.0)).reshape((CASE_BLOCK,) + d.shape)
            continue
        a = np.empty(v.shape, dtype=np.float32)
        np.multiply(v, np.float32(2 * d.half_width), out=a)
        a -= np.float32(d.half_width)
        if d.centre:
            a += np.float32(d.centre)
        out[d.name] = a.reshape((CASE_BLOCK,) + d.shape)
    return out


def sweep_block(shape: tuple[int, int, int], block: int, eps: float) -> dict[str, np.ndarray]:
    """One block of cases: the float32 tail against the float64 truth, per case ``worst``
    (``max |x - y| / max(|y|, 1)``), ``max_abs``, ``nmse``, ``torch_ratio`` and the float32
    ``ulp_max`` / ``ulp_mean``; ``truth`` and ``actual`` beside them."""
    c = draw_cases(shape, block)
    names = ("wo", "ffn_norm", "gate", "up", "down")
    truth = tail_batched(
        *(c[k].astype(np.float64) for k in names), eps, c["branch"].astype(np.float64), c["residual"].astype(np.float64)
    )
    actual = tail_batched(*(c[k] for k in names), eps, c["branch"], c["residual"])
    x = actual.astype(np.float64)
    d = np.abs(x - truth)
    ax = truth.astype(np.float32).view(np.int32).astype(np.int64)
    bx = actual.view(np.int32).astype(np.int64)
    ulp = np.abs(np.where(ax < 0, -(ax & 0x7FFFFFFF), ax) - np.where(bx < 0, -(bx & 0x7FFFFFFF), bx))
    return {
        "worst": (d / np.maximum(np.abs(truth), 1.0)).max(axis=-1),
        "max_abs": d.max(axis=-1),
        "nmse": (d * d).sum(axis=-1) / (truth * truth).sum(axis=-1),
        "torch_ratio": (d / (1e-5 + 1.3e-6 * np.abs(truth))).max(axis=-1),
        "ulp_max": ulp.max(axis=-1),
        "ulp_mean": ulp.mean(axis=-1),
        "truth": truth,
        "actual": actual,
    }


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16 (to nearest, ties to even; finite values), as float32."""
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return x


def bonsai_truth(shape: tuple[int, int, int], block: int, seed: int, input_seed: int, eps: float) -> np.ndarray:
    """The float64 truth of one random bf16 tail with wo folded at its input (block ``block``),
    written plainly: the recipe's draws in its order (``TailWeights.random``: wo, gate, up, down,
    ffn_norm, then the fold's seed; ``random_inputs``: branch, residual), each matrix rounded to
    bfloat16 and held in float64, wo folded as one product and rounded again, the tail once."""
    hidden, branch_dim, ffn = shape
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int) -> np.ndarray:
        a = math.sqrt(3.0 / cols)
        return bf16_round(rng.uniform(-a, a, (rows, cols)).astype(np.float32)).astype(np.float64)

    wo, gate, up, down = weight(hidden, branch_dim), weight(ffn, hidden), weight(ffn, hidden), weight(hidden, ffn)
    norm = (1.0 + rng.uniform(-0.25, 0.25, hidden)).astype(np.float32).astype(np.float64)
    fold_rng = np.random.default_rng(int(rng.integers(2**31)))
    signs = np.where(fold_rng.random(branch_dim) < 0.5, -1.0, 1.0)
    h_t = orthonormal_t(block)
    wo = bf16_round(block_transform(wo * signs, h_t).astype(np.float32)).astype(np.float64)
    rng = np.random.default_rng(input_seed)
    x = rng.uniform(-1.0, 1.0, branch_dim).astype(np.float32)
    residual = rng.uniform(-1.0, 1.0, hidden).astype(np.float32)
    return host_tail(wo, signs, h_t, norm, gate, up, down, eps, x, residual)
