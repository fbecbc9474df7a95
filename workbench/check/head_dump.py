"""An engine's attention heads, dumped, read and judged (docs/DUMP_LAYOUT.md, "The attention
head"): one safetensors file a layer, its constants once and one row a case (the hidden
state, the position, what the engine returned), or a folder of them.

The float64 truth, the float32 reference and the fault models run the dumped inputs; the
engine's tensors are judged as :func:`~workbench.check.head_run.check_head` judges a head of
your own, one condition a file (every row of it, at its own position). :func:`write_head`
is the layout's writer for a Python head (numpy and safetensors only, as an engine's would be).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.dump import DumpError
from workbench.check.head_math import HEAD_FAULTS, HeadWeights, applies, head_block
from workbench.check.head_mlx import head_reference
from workbench.check.head_report import HeadReport
from workbench.check.head_run import scaled_errors, worst
from workbench.check.head_spec import HeadSpec

#: The per-row tensors an engine returns, by the head's outputs.
RESULTS: tuple[str, ...] = ("q", "k", "v", "gate")

#: The integer metadata keys of a dump (the spec's widths).
INT_KEYS: tuple[str, ...] = ("q_heads", "kv_heads", "head_dim", "rotary_dim", "fold_block")


@dataclass(frozen=True)
class DumpedHeads:
    """One file's heads: ``spec``, float32 ``weights`` (the layer's, one set a row),
    ``hidden`` [n, hidden], ``positions`` [n], ``outputs`` (name -> [n, width], as dumped)."""

    path: Path
    spec: HeadSpec
    weights: HeadWeights
    hidden: np.ndarray
    positions: np.ndarray
    outputs: dict[str, np.ndarray]


def _meta_number(path: Path, meta: Mapping[str, str], key: str, default: Any, integer: bool) -> Any:
    if key not in meta:
        if default is None:
            raise DumpError(f"{path.name}: metadata {key!r} is missing")
        return default
    try:
        v = int(meta[key]) if integer else float(meta[key])
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise DumpError(
            f"{path.name}: metadata {key!r} must be a {'count' if integer else 'number'}, got {meta[key]!r}"
        )
    return v


def read_heads(path: str | Path) -> DumpedHeads:
    """One dump file, checked against the layout (:class:`~workbench.check.dump.DumpError`
    names the file and the tensor or metadata key)."""
    path = Path(path)
    try:
        from workbench.real_models.safetensors_header import check_safetensors_header

        check_safetensors_header(path)
        t, meta = mx.load(str(path), return_metadata=True)
        meta = dict(meta or {})
    except Exception as e:
        raise DumpError(f"{path.name}: not a readable safetensors file: {e}") from None
    num = {k: _meta_number(path, meta, k, 0 if k in ("rotary_dim", "fold_block") else None, True) for k in INT_KEYS}
    eps = _meta_number(path, meta, "eps", None, False)
    theta = _meta_number(path, meta, "rope_theta", 10000.0, False)
    gate = meta.get("gate", "false")
    if gate not in ("true", "false"):
        raise DumpError(f"{path.name}: metadata 'gate' must be 'true' or 'false', got {gate!r}")

    def get(k: str) -> np.ndarray | None:
        if k not in t:
            return None
        a = t[k]
        return np.array(a.astype(mx.float32) if a.dtype != mx.float32 else a)

    for k in ("hidden", "position", "attn_norm", "q_w", "k_w", "v_w", "q", "k", "v"):
        if k not in t:
            raise DumpError(f"{path.name}: tensor {k!r} is missing")
    qk_norm, bias = "q_norm" in t, "q_b" in t
    try:
        spec = HeadSpec(
            "model" if (qk_norm or gate == "true" or num["rotary_dim"]) else "launch",
            int(t["hidden"].shape[-1]),
            num["q_heads"],
            num["kv_heads"],
            num["head_dim"],
            rotary_dim=num["rotary_dim"],
            rope_theta=theta,
            qk_norm=qk_norm,
            gate=gate == "true",
            bias=bias,
            fold_block=num["fold_block"],
            eps=eps,
            name=f"{meta.get('model', path.stem)} layer {meta.get('layer', '?')}",
        )
    except ValueError as e:
        raise DumpError(f"{path.name}: metadata: {e}") from None
    hidden = get("hidden")
    n = hidden.shape[0] if hidden.ndim == 2 else 0
    if n < 1:
        raise DumpError(f"{path.name}: tensor 'hidden' has shape {hidden.shape}, expected [n, hidden] with n >= 1")
    want = {
        "attn_norm": (spec.hidden,),
        "q_w": (spec.q_rows, spec.hidden),
        "k_w": (spec.kv_rows, spec.hidden),
        "v_w": (spec.kv_rows, spec.hidden),
        "position": (n,),
        **({"q_b": (spec.q_rows,), "k_b": (spec.kv_rows,), "v_b": (spec.kv_rows,)} if bias else {}),
        **({"q_norm": (spec.head_dim,), "k_norm": (spec.head_dim,)} if qk_norm else {}),
        **{k: (n, spec.output_shape(k)[0]) for k in spec.outputs},
    }
    arrays = {}
    for k, shape in want.items():
        a = get(k)
        if a is None:
            raise DumpError(f"{path.name}: tensor {k!r} is missing")
        if a.shape != shape:
            raise DumpError(f"{path.name}: tensor {k!r} has shape {a.shape}, expected {shape}")
        if k not in RESULTS and not np.isfinite(a).all():
            raise DumpError(f"{path.name}: tensor {k!r} is not finite (NaN or inf): the truth cannot start from it")
        arrays[k] = a
    pos = arrays.pop("position")
    if (pos < 0).any() or (pos != np.round(pos)).any():
        raise DumpError(f"{path.name}: tensor 'position' must hold integers >= 0")
    fold = None
    if spec.fold_block:
        from workbench.fold.rotation import HadamardFold

        signs, perm = get("fold.signs"), get("fold.perm")
        try:
            fold = HadamardFold(spec.fold_block, signs, None if perm is None else perm.astype(np.int64))
            fold.check_width(spec.hidden)
        except ValueError as e:
            raise DumpError(f"{path.name}: tensors 'fold.signs' / 'fold.perm': {e}") from None
    const = {
        k: None if k not in arrays else np.broadcast_to(arrays[k], (n, *arrays[k].shape)) for k in HeadWeights.ARRAYS
    }
    w = HeadWeights(**const, rotations=(fold,) * n if fold is not None else ())
    outs = {k: arrays[k] for k in spec.outputs}
    return DumpedHeads(path, spec, w, hidden, pos.astype(np.int64), outs)


def write_head(
    path: str | Path,
    spec: HeadSpec,
    case: Mapping[str, Any],
    hidden: Any,
    positions: Any,
    outputs: Mapping[str, Any],
    **meta: str,
) -> None:
    """Write one layer's heads in the dump layout: ``case`` the layer's arrays by name (as
    :meth:`HeadWeights.case` gives them, its ``fold`` included), ``hidden`` [n, hidden],
    ``positions`` [n], ``outputs`` name -> [n, width]; ``meta``: ``model``, ``layer``."""
    from safetensors.numpy import save_file

    tensors = {k: np.asarray(case[k], np.float32) for k in HeadWeights.ARRAYS if case.get(k) is not None}
    tensors["hidden"] = np.asarray(hidden, np.float32)
    tensors["position"] = np.asarray(positions, np.int64)
    tensors |= {k: np.asarray(v, np.float32) for k, v in outputs.items()}
    fold = case.get("fold")
    if fold is not None:
        tensors["fold.signs"] = np.asarray(fold.plan(spec.hidden).signs, np.float32)
        tensors["fold.perm"] = np.asarray(fold.plan(spec.hidden).perm, np.int64)
    m = {k: str(getattr(spec, k)) for k in INT_KEYS} | {"eps": repr(spec.eps), "rope_theta": repr(spec.rope_theta)}
    m["gate"] = "true" if spec.gate else "false"
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata={**m, **meta})


def check_head_dump(
    path: str | Path, *, tolerance: float | None = None, faults: Sequence[str] = tuple(HEAD_FAULTS)
) -> HeadReport:
    """Check the heads an engine dumped (a file, or a folder of ``*.safetensors``): one
    condition a file; a file that cannot be read is a problem named in the verdict."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"path: {str(path)!r} does not exist (a dump file or a folder of them)")
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files:
        raise ValueError(f"path: {str(path)!r} holds no *.safetensors file")
    flt = validate.sequence("faults", faults, what=f"fault names of {tuple(HEAD_FAULTS)}", non_empty=False)
    for f in flt:
        validate.one_of("faults", f, tuple(HEAD_FAULTS))
    user = None if tolerance is None else validate.number("tolerance", tolerance, minimum=0)
    conds, problems = [], []
    for f in files:
        try:
            d = read_heads(f)
        except DumpError as e:
            problems.append(f"part head, {e}")
            continue
        s, w, n = d.spec, d.weights, len(d.hidden)
        truth = head_block(s, w.astype(np.float64), d.hidden, d.positions)
        ref = {k: np.empty_like(v, dtype=np.float32) for k, v in truth.items()}
        for pos in np.unique(d.positions):
            rows = np.flatnonzero(d.positions == pos)
            sub = HeadWeights(
                *(None if getattr(w, k) is None else getattr(w, k)[rows] for k in HeadWeights.ARRAYS),
                rotations=tuple(w.rotations[i] for i in rows) if w.rotations else (),
            )
            for k, v in head_reference(s, sub, d.hidden[rows], int(pos)).items():
                ref[k][rows] = v
        err = {"reference": worst(scaled_errors(ref, truth))}
        for fault in flt:
            err[f"fault {fault}"] = (
                worst(scaled_errors(head_block(s, w, d.hidden, d.positions, fault=fault), truth))
                if applies(fault, s)
                else np.full(n, np.nan)
            )
        per = scaled_errors(d.outputs, truth)
        err["subject"] = worst(per)
        err |= {f"subject {k}": v for k, v in per.items()}
        for i in np.flatnonzero(~np.isfinite(err["subject"])):
            problems.append(f"part head, {f.name} row {i}: a tensor the engine gave is not finite (NaN or inf)")
        conds.append(({"spec": f"{f.name}: {s.label}", "scale": 0.0, "position": -1}, np.arange(n), err))
    if not conds:
        raise ValueError(f"path: no file of {str(path)!r} could be read: {problems[0]}")
    return HeadReport.build(str(path), "dump", conds, problems, user)
