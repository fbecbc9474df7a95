"""Tensors dumped by a user's engine, one safetensors file a layer, read and checked.

The layout (docs/DUMP_LAYOUT.md has a writer example): tensors ``wo`` [hidden, branch]
(the STORED matrix: ``W R^T`` when folded), ``gate`` / ``up`` [ffn, hidden], ``down``
[hidden, ffn] in any float dtype, or quantized as ``<name>.codes`` (uint32, ``mx.quantize``'s
packing), ``<name>.scales`` and, for affine, ``<name>.biases``; ``ffn_norm`` [hidden] (the
effective weight); ``branch`` [n, branch], ``residual`` [n, hidden] and ``output`` [n, hidden]
(the engine's result), one row a case; optionally ``fold.signs`` [branch]. Metadata
(strings): ``eps`` (required), ``fold_block`` (with a fold), and for quantized weights
``quant_mode``, ``quant_bits``, ``quant_group_size``; ``model`` and ``layer`` are carried
into the report. The files are only read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.fold.rotation import HadamardFold
from workbench.fold.weights import QuantizedBase, WeightMatrix, check_quant_spec
from workbench.tail.weights import TailWeights

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
            raise DumpError(f"{path.name}: tensor {name!r} has dtype {a.dtype}, expected a float dtype "
                            f"(or {name}.codes/.scales for quantized weights)")
        return WeightMatrix(a, fold)
    if f"{name}.codes" not in t or f"{name}.scales" not in t:
        raise DumpError(f"{path.name}: tensor {name!r} is missing (neither {name!r} nor {name}.codes + {name}.scales)")
    try:
        spec = check_quant_spec(meta.get("quant_mode", ""), int(meta.get("quant_bits", "0")),
                                int(meta.get("quant_group_size", "0")))
    except ValueError as e:
        raise DumpError(f"{path.name}: metadata quant_mode/quant_bits/quant_group_size: {e}") from None
    qb = QuantizedBase(t[f"{name}.codes"], t[f"{name}.scales"], t.get(f"{name}.biases"), spec, shape)
    try:
        qb.dequantize()
    except Exception as e:  # noqa: BLE001 -- MLX's message, under the file's and tensor's names
        raise DumpError(f"{path.name}: tensor {name}.codes/.scales do not make a {shape} {spec} matrix: {e}") from None
    return WeightMatrix(qb, fold)


def read_layer(path: str | Path) -> DumpedLayer:
    """One dump file, checked against the layout (:class:`DumpError` names the file and tensor)."""
    from safetensors import safe_open  # noqa: PLC0415

    path = Path(path)
    try:
        with safe_open(str(path), framework="mlx") as f:
            meta = dict(f.metadata() or {})
            t = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 -- not a safetensors file: said with its name
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
        raise DumpError(f"{path.name}: tensors 'branch' [n, branch], 'residual' and 'output' [n, hidden] disagree: "
                        f"{branch.shape}, {residual.shape}, {output.shape}")
    n_hidden, n_branch = residual.shape[1], branch.shape[1]
    gate_rows = t["gate"].shape[0] if "gate" in t else int(t["gate.scales"].shape[0]) if "gate.scales" in t else None
    if gate_rows is None:
        raise DumpError(f"{path.name}: tensor 'gate' is missing")
    fold = None
    if "fold_block" in meta:
        signs = np.array(t["fold.signs"].astype(mx.float32)) if "fold.signs" in t else None
        try:
            fold = HadamardFold(int(meta["fold_block"]), signs)
        except ValueError as e:
            raise DumpError(f"{path.name}: metadata fold_block / tensor fold.signs: {e}") from None
    shapes = {"wo": (n_hidden, n_branch), "gate": (gate_rows, n_hidden), "up": (gate_rows, n_hidden),
              "down": (n_hidden, gate_rows)}
    mats = {k: _matrix(path, t, meta, k, shapes[k], fold if k == "wo" else None) for k in MATRICES}
    try:
        w = TailWeights(mats["wo"], np.array(t["ffn_norm"].astype(mx.float32)), mats["gate"], mats["up"], mats["down"],
                        eps=eps)
    except ValueError as e:
        raise DumpError(f"{path.name}: {e}") from None
    return DumpedLayer(path, w, branch, residual, output, meta)


def dump_files(path: str | Path) -> list[Path]:
    """The dump files of ``path``: the file itself, or a folder's ``*.safetensors`` sorted by name."""
    p = Path(path)
    if p.is_dir():
        out = sorted(p.glob("*.safetensors"))
        if not out:
            raise ValueError(f"path: the folder {str(p)!r} holds no .safetensors files")
        return out
    if not p.is_file():
        raise ValueError(f"path: must be a dump file or a folder of them, got {str(p)!r} (not found)")
    return [p]
