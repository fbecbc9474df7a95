"""Tensors dumped by a user's engine, one safetensors file a layer, read and checked.

The layout (docs/DUMP_LAYOUT.md has a writer example): tensors ``wo`` [hidden, branch]
(the STORED matrix: ``W R^T`` when folded), ``gate`` / ``up`` [ffn, hidden], ``down``
[hidden, ffn] in any float dtype, or quantized as ``<name>.codes`` (uint32, ``mx.quantize``'s
packing), ``<name>.scales`` and, for affine, ``<name>.biases``; ``ffn_norm`` [hidden] (the
effective weight); ``branch`` [n, branch], ``residual`` [n, hidden] and ``output`` [n, hidden]
(the engine's result), one row a case; ``fold.signs`` [branch] with a fold. Metadata
(strings): ``eps`` (required), ``fold_block`` (a fold: it and ``fold.signs`` together, one
without the other refused), for quantized weights ``quant_mode``, ``quant_bits``,
``quant_group_size``; ``model`` and ``layer`` go into the report. The files are only read.

:func:`write_layer` writes one such file from the workbench's own ``TailWeights`` (an
engine written in Python, or a model run through mlx-lm, dumps its layers with it); the
reader is tested against it and against the numpy-only writer of the layout document.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import files
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import QuantizedBase, WeightMatrix, check_quant_spec
from workbench.real_models.safetensors_header import check_safetensors_header
from workbench.tail.weights import TailWeights
from workbench.validate import describe

MATRICES = ("wo", "gate", "up", "down")


class DumpError(ValueError):
    """A dump file that does not follow the layout; the message names the file and the tensor."""


@dataclass(frozen=True)
class DumpedLayer:
    """One file: its weights, activations ``branch`` / ``residual`` [n, ...], the engine's ``output``."""

    path: Path
    weights: TailWeights
    branch: np.ndarray
    residual: np.ndarray
    output: np.ndarray
    meta: dict


def _matrix(path: Path, t: dict, meta: dict, name: str, shape: tuple[int, int], fold: Any) -> WeightMatrix:
    if name in t:
        a = t[name]
        if tuple(a.shape) != shape:
            raise DumpError(f"{path.name}: tensor {name!r} has shape {tuple(a.shape)}, expected {shape}")
        if not mx.issubdtype(a.dtype, mx.floating):
            raise DumpError(
                f"{path.name}: tensor {name!r} has dtype {a.dtype}, expected a float dtype "
                f"(or {name}.codes/.scales for quantized weights)"
            )
        return WeightMatrix(a, fold)
    if f"{name}.codes" not in t or f"{name}.scales" not in t:
        raise DumpError(f"{path.name}: tensor {name!r} is missing (neither {name!r} nor {name}.codes + {name}.scales)")
    try:
        spec = check_quant_spec(
            meta.get("quant_mode", ""), int(meta.get("quant_bits", "0")), int(meta.get("quant_group_size", "0"))
        )
    except ValueError as e:
        raise DumpError(f"{path.name}: metadata quant_mode/quant_bits/quant_group_size: {e}") from None
    qb = QuantizedBase(t[f"{name}.codes"], t[f"{name}.scales"], t.get(f"{name}.biases"), spec, shape)
    try:
        qb.dequantize()
    except Exception as e:
        raise DumpError(f"{path.name}: tensor {name}.codes/.scales do not make a {shape} {spec} matrix: {e}") from None
    return WeightMatrix(qb, fold)


def _fold(path: Path, t: dict, meta: dict, n_branch: int) -> HadamardFold | None:
    """The fold on wo's input: metadata ``fold_block`` and tensor ``fold.signs`` [branch] both, or
    neither (unfolded); one without the other is refused (it would be read as another map)."""
    has_block, has_signs = "fold_block" in meta, "fold.signs" in t
    if has_signs and not has_block:
        raise DumpError(
            f"{path.name}: metadata 'fold_block' is missing while tensor 'fold.signs' is present "
            "(a fold needs both; an unfolded wo has neither)"
        )
    if has_block and not has_signs:
        raise DumpError(
            f"{path.name}: tensor 'fold.signs' is missing while metadata 'fold_block' is "
            f"{meta['fold_block']!r} (a fold needs both: write its signs, +1/-1 [branch], all +1 if it has none)"
        )
    if not has_block:
        return None
    signs = t["fold.signs"]
    if tuple(signs.shape) != (n_branch,):
        raise DumpError(f"{path.name}: tensor 'fold.signs' has shape {tuple(signs.shape)}, expected ({n_branch},)")
    try:
        return HadamardFold(int(meta["fold_block"]), np.array(signs.astype(mx.float32)))
    except ValueError as e:
        raise DumpError(f"{path.name}: metadata 'fold_block' / tensor 'fold.signs': {e}") from None


def read_layer(path: str | Path) -> DumpedLayer:
    """One dump file, checked against the layout (:class:`DumpError` names the file and tensor)."""
    path = Path(path)
    # The header is checked against the file before MLX reads it (a truncated or
    # inconsistent file is refused by name, never handed to MLX's reader); MLX reads
    # every dtype of the layout, bfloat16 included, which numpy-based readers cannot.
    try:
        check_safetensors_header(path)
        t, meta = mx.load(str(path), return_metadata=True)
        meta = dict(meta or {})
    except Exception as e:
        raise DumpError(f"{path.name}: not a readable safetensors file: {e}") from None
    for k in ("ffn_norm", "branch", "residual", "output"):
        if k not in t:
            raise DumpError(f"{path.name}: tensor {k!r} is missing")
    if "eps" not in meta:
        raise DumpError(f"{path.name}: metadata 'eps' is missing")
    try:
        eps = float(meta["eps"])
    except ValueError:
        raise DumpError(f"{path.name}: metadata 'eps' must be a number, got {meta['eps']!r}") from None
    branch, residual, output = (np.array(t[k].astype(mx.float32)) for k in ("branch", "residual", "output"))
    if branch.ndim != 2 or residual.ndim != 2 or output.shape != residual.shape or len(branch) != len(residual):
        raise DumpError(
            f"{path.name}: tensors 'branch' [n, branch], 'residual' and 'output' [n, hidden] disagree: "
            f"{branch.shape}, {residual.shape}, {output.shape}"
        )
    n_hidden, n_branch = residual.shape[1], branch.shape[1]
    gate_rows = t["gate"].shape[0] if "gate" in t else int(t["gate.scales"].shape[0]) if "gate.scales" in t else None
    if gate_rows is None:
        raise DumpError(f"{path.name}: tensor 'gate' is missing")
    fold = _fold(path, t, meta, n_branch)
    shapes = {
        "wo": (n_hidden, n_branch),
        "gate": (gate_rows, n_hidden),
        "up": (gate_rows, n_hidden),
        "down": (n_hidden, gate_rows),
    }
    mats = {k: _matrix(path, t, meta, k, shapes[k], fold if k == "wo" else None) for k in MATRICES}
    try:
        w = TailWeights(
            mats["wo"], np.array(t["ffn_norm"].astype(mx.float32)), mats["gate"], mats["up"], mats["down"], eps=eps
        )
    except ValueError as e:
        raise DumpError(f"{path.name}: {e}") from None
    return DumpedLayer(path, w, branch, residual, output, meta)


def dump_files(path: str | Path) -> list[Path]:
    """The dump files of ``path``: the file itself, or a folder's ``*.safetensors`` sorted by name."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"path: must be a dump file or a folder of them (a str or Path), got {describe(path)}")
    p = Path(path)
    if p.is_dir():
        out = sorted(p.glob("*.safetensors"))
        if not out:
            raise ValueError(f"path: the folder {str(p)!r} holds no .safetensors files")
        return out
    if not p.is_file():
        raise ValueError(f"path: must be a dump file or a folder of them, got {str(p)!r} (not found)")
    return [p]


def _layout_tensors(name: str, m: WeightMatrix) -> tuple[dict[str, mx.array], Any]:
    """One matrix's tensors as the layout names them, and its quantization spec (or None)."""
    base, _ = m.launch_parts()
    if isinstance(base, QuantizedBase):
        out = {f"{name}.codes": base.w, f"{name}.scales": base.scales}
        if base.biases is not None:
            out[f"{name}.biases"] = base.biases
        return out, base.spec
    return {name: base}, None


def write_layer(
    path: str | Path,
    weights: TailWeights,
    branch: Any,
    residual: Any,
    output: Any,
    *,
    model: str | None = None,
    layer: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write one dump file in the layout: ``weights`` as STORED (dtype or quantized codes, the
    fold's signs and block), the activations ``branch`` [n, branch], ``residual`` [n, hidden]
    and the engine's ``output`` [n, hidden] (float32). Written atomically; an existing file
    is refused unless ``overwrite``. ``ValueError`` for what the layout cannot say: a fold on
    wo's output or with a permutation, or matrices quantized in different formats (the
    layout has one ``quant_*`` metadata set a file)."""
    if not isinstance(weights, TailWeights):
        raise ValueError(f"weights: must be a TailWeights, got {type(weights).__name__}")
    h, b, _ = weights.shape
    acts = {}
    for name, a, width in (("branch", branch, b), ("residual", residual, h), ("output", output, h)):
        arr = np.asarray(a, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != width:
            raise ValueError(f"{name}: must be [n, {width}] (one row a case), got shape {arr.shape}")
        acts[name] = mx.array(arr)
    if not len({int(a.shape[0]) for a in acts.values()}) == 1:
        raise ValueError(
            f"branch, residual, output: must have the same number of rows, got "
            f"{[int(a.shape[0]) for a in acts.values()]}"
        )
    tensors: dict[str, mx.array] = {**acts, "ffn_norm": mx.array(np.asarray(weights.ffn_norm, dtype=np.float32))}
    meta = {"eps": repr(float(weights.eps))}
    specs = set()
    for name in MATRICES:
        t, spec = _layout_tensors(name, getattr(weights, name))
        tensors.update(t)
        if spec is not None:
            specs.add((spec.mode, spec.bits, spec.group_size))
    if len(specs) > 1:
        raise ValueError(f"weights: the layout has one quantization a file; these matrices use {sorted(specs)}")
    if specs:
        mode, bits, gs = specs.pop()
        meta.update(quant_mode=mode, quant_bits=str(bits), quant_group_size=str(gs))
    fold = weights.wo.fold
    if fold is not None:
        if fold.site is not FoldSite.INPUT or fold.perm is not None:
            raise ValueError(
                f"weights: the layout holds a fold on wo's input without a permutation (block and signs), got {fold!r}"
            )
        meta["fold_block"] = str(fold.block)  # with its signs always (all +1 for a fold without)
        signs = np.ones(b, dtype=np.float32) if fold.signs is None else np.asarray(fold.signs, dtype=np.float32)
        tensors["fold.signs"] = mx.array(signs)
    if model is not None:
        meta["model"] = str(model)
    if layer is not None:
        meta["layer"] = str(int(layer))
    # MLX writes the bytes (bfloat16 included, which numpy cannot hold) into a scratch folder;
    # write_atomic puts them in place, so a reader never sees half a file.
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch) / "layer.safetensors"
        mx.save_safetensors(str(tmp), tensors, metadata=meta)
        data = tmp.read_bytes()
    return files.write_atomic(path, data, overwrite=overwrite)
