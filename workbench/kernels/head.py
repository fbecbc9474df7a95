"""The head launch: Q, K and V of ``rms_norm(hidden) * attn_norm`` in ONE launch.

The three projections share one input, so one launch computes the norm once, applies the
shared fold's rotation once (``q``, ``k`` and ``v`` must carry the same fold, as
frink-models' ``attn_head_launch`` asks) and streams all three matrices.
:func:`head_refusals` says, by ``workbench.models.refusals``' rules, which layers it serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import backends
from workbench.fold.rotation import FoldSite
from workbench.fold.weights import WeightMatrix
from workbench.kernels import run as kernel_run
from workbench.kernels import source as kernel_source
from workbench.kernels import tuning as kernel_tuning
from workbench.kernels.launch import params_array, rotation_template
from workbench.kernels.matrices import KernelMatrix, check_width, kernel_matrix, units_for
from workbench.kernels.tuning import KernelTuning, grid_size
from workbench.models import config as model
from workbench.models import refusals
from workbench.validate import describe


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

    return list(
        refusals.head_launch_refusals(
            cfg,
            0,
            q_fold=q.fold,
            k_fold=k.fold,
            v_fold=v.fold,
            q_kernel=served(q),
            k_kernel=served(k),
            v_kernel=served(v),
        )
    )


def check_head_inputs(hidden: Any, attn_norm: Any, q: Any, k: Any, v: Any) -> None:
    """A ValueError naming the argument whose width disagrees: ``q`` / ``k`` / ``v`` must be
    WeightMatrix objects of one in dimension, ``hidden`` one position of that width and
    ``attn_norm`` that many weights. The kernel reads the widths it is compiled for, so a
    mismatch would be read out of bounds, never refused by the kernel itself."""
    for name, m in (("q", q), ("k", k), ("v", v)):
        if not isinstance(m, WeightMatrix):
            raise ValueError(f"{name}: must be a WeightMatrix, got {describe(m)}")
    width = int(q.shape[1])
    for name, m in (("k", k), ("v", v)):
        if int(m.shape[1]) != width:
            raise ValueError(f"{name}: must have q's in dimension {width} (one input, one launch), got shape {m.shape}")
    for name, value in (("hidden", hidden), ("attn_norm", attn_norm)):
        try:
            shape = tuple(getattr(value, "shape", None) or np.shape(value))
        except Exception:  # a ragged list: not one position
            shape = None
        if shape != (width,):
            raise ValueError(
                f"{name}: must be one position of width {width} (q, k and v's in dimension), got {describe(value)}"
            )


def head_call(dialect: str, mats: list[KernelMatrix], rot: dict[str, Any], t: KernelTuning, names: str) -> dict:
    """The ``head_qkv`` launch's keyword arguments (template, grid, group, outputs) for three
    projections of one input, in one weight format (``names`` say which, in the error), with
    the rotation ``rot`` (``launch.rotation_template``): the one place the head's launch shape
    is decided, for the attention head and a decode step's projections alike."""
    if len({(m.fmt, m.sfmt, m.gs, m.qi) for m in mats}) != 1:
        raise ValueError(f"{names}: must share one weight format (one launch reads all three)")
    hid = mats[0].cols
    check_width("hidden", hid)
    nq, nk, nv = (m.rows for m in mats)
    m0 = mats[0]
    template = [
        ("NT", t.head_nt),
        ("FMT", m0.fmt),
        ("SFMT", m0.sfmt),
        ("GS", m0.gs),
        ("QI", m0.qi),
        ("HID", hid),
        ("NQ", nq),
        ("NK", nk),
        ("NV", nv),
        ("ROT", bool(rot["ROT"])),
        ("M", rot["M"]),
        ("LOGP", rot["LOGP"]),
        ("U", units_for(m0.fmt, t.u_head)),
        ("PRE", bool(t.pre_head)),
    ]
    kernel_run.check_group_memory(dialect, "head_qkv", template, f"hidden ({hid})")
    return dict(
        template=template,
        grid=(grid_size(nq + nk + nv, t.head_nt, t, t.head_groups_per_sm), 1, 1),
        threadgroup=(t.head_nt, 1, 1),
        output_shapes=[(nq,), (nk,), (nv,)],
        output_dtypes=[mx.float32] * 3,
    )


def head_launch(
    hidden: mx.array,
    attn_norm: Any,
    eps: float,
    q: WeightMatrix,
    k: WeightMatrix,
    v: WeightMatrix,
    dialect: str,
    tuning: KernelTuning | None = None,
    *,
    verbose: bool = False,
    kernel_dir: Path | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """Q, K, V of ``rms_norm(hidden) * attn_norm`` in ONE launch, lazily.

    ``q`` / ``k`` / ``v`` are WeightMatrix objects sharing one fold (the same object, as
    frink-models asks with Rust's pointer-identity test ``Arc::ptr_eq``) at the INPUT site, or all unfolded; the kernel
    rotates their common input once. ``attn_norm``: numpy or MLX, [hidden].
    ``kernel_dir``: as for ``launch.prepare_tail``. Raises ``ValueError`` listing every
    head refusal.
    """
    kernel_source.check_dialect(kernel_run.DIALECT_OF.get(dialect, dialect) if isinstance(dialect, str) else dialect)
    if kernel_run.is_emulated(dialect):
        backends.resolve_backend(dialect)  # without clang, say so before building anything
    check_head_inputs(hidden, attn_norm, q, k, v)
    found = head_refusals(q, k, v)
    if found:
        raise ValueError("the head launch refuses these projections: " + ", ".join(r.name for r in found))
    fold = q.fold
    if fold is not None and fold.site is not FoldSite.INPUT:
        raise ValueError("the Q/K/V fold must be at the INPUT site (the kernel rotates their common input)")
    mats = [kernel_matrix(n, WeightMatrix(m.launch_parts()[0])) for n, m in (("q", q), ("k", k), ("v", v))]
    hid = mats[0].cols
    rot = rotation_template(None if fold is None else fold.plan(hid), hid)
    kw = head_call(dialect, mats, rot, kernel_tuning.checked_tuning(tuning), "q, k and v")
    norm = (
        attn_norm.astype(mx.float32)
        if isinstance(attn_norm, mx.array)
        else mx.array(np.asarray(attn_norm, dtype=np.float32))
    )
    inputs = [hidden.astype(mx.float32), norm, params_array(eps, rot["scale"]), rot["sdest"], rot["table"]]
    for m in mats:
        inputs += [m.w, m.s, m.b]
    kernel = kernel_run.compiled_kernel(dialect, "head_qkv", kernel_dir)
    q_out, k_out, v_out = kernel_run.launch(dialect, kernel, inputs, kw, verbose=verbose)
    return q_out, k_out, v_out
