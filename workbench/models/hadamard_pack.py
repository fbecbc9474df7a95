"""PrismML's Hadamard packs (Bonsai-27B as it ships), read as mlx-lm 0.32.2 reads them.

The rules are ``mlx_lm/models/prism_hadamard_qwen35.py``'s, restated: ``ModelArgs.__post_init__``
(schema and namespace paired, grouped GDN activations, exactly 2-bit affine at group 128, a
non-empty module manifest) and ``Model.__init__`` (each manifest path once, activations
float16, a block of ``_BLOCKS``); ``HadamardQuantizedLinear`` (in width a multiple of 128 and of
the block; uint32 codes, float16 scales and biases, float32 signs of +1/-1 when the block is not
0). Each packed linear applies ``quantized_matmul(R x)`` with ``R = H_b/sqrt(b) diag(signs)``:
here a :class:`~workbench.fold.weights.WeightMatrix` with its own input fold, so the tail's
truth, reference and the check apply every linear's rotation, not only ``wo``'s.

A pack is only read: config.json and its safetensors (``mx.load``). :func:`pack_refusals` says,
matrix by matrix, what the workbench's kernels do not serve in it (their refusal names the
first; the user needs the whole list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.fold import formats
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import QuantizedBase, QuantSpec, WeightMatrix
from workbench.models.config import ModelConfig
from workbench.models.families import from_hf_config
from workbench.models.refusals import HeadRefusal, head_launch_refusals, layer_refusals

#: ``_NAMESPACES``: schema 1 is a text-only pack keyed like ``qwen3_5.TextModel``, schema 2 a
#: vision-language pack keyed like mlx-vlm's qwen3_5; the text weights are the same in both.
NAMESPACES: dict[int, str] = {1: "mlx-lm-text", 2: "mlx-vlm-qwen3_5"}
#: ``_QUANTIZATION``: the only quantization a pack may declare.
PACK_QUANTIZATION: dict[str, Any] = {"bits": 2, "group_size": 128, "mode": "affine"}
#: ``_BLOCKS``: a module's Hadamard block (0: its input is not rotated).
PACK_BLOCKS: tuple[int, ...] = (0, 512, 1024, 2048, 4096, 8192)
#: The format every packed matrix has.
PACK_SPEC = QuantSpec("affine", 2, 128)

#: The tail's four matrices, by the workbench's names, under a full-attention and a
#: recurrent (Gated DeltaNet) layer of mlx-lm's qwen3_5 model.
TAIL_PATHS: dict[str, dict[str, str]] = {
    "full_attention": {
        "wo": "self_attn.o_proj",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    },
    "linear_attention": {
        "wo": "linear_attn.out_proj",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    },
}


class PackError(ValueError):
    """A pack mlx-lm would refuse to load; the message says which rule and where."""


@dataclass(frozen=True)
class PackedModule:
    """One manifest entry: the module's ``path`` under the text model (``model.layers.3.mlp.down_proj``),
    its Hadamard ``block`` (0: none), activation ``dtype``, and whether it is the ``embedding``."""

    path: str
    block: int
    dtype: str
    embedding: bool


def pack_manifest(config: Any) -> tuple[PackedModule, ...]:
    """The packed modules a pack's ``config.json`` (a dict) lists, checked as mlx-lm checks them
    before building the model; :class:`PackError` names the rule that fails."""
    if not isinstance(config, dict):
        raise PackError(f"config: must be the pack's config.json as a dict, got {validate.describe(config)}")
    schema, namespace = config.get("schema_version", 2), config.get("tensor_namespace", "")
    if NAMESPACES.get(schema) != namespace:
        raise PackError(f"Unsupported Hadamard pack: schema {schema}, namespace {namespace!r} (allowed: {NAMESPACES})")
    if config.get("gdn_activation_layout", "grouped") != "grouped":
        raise PackError("Hadamard packs require grouped GDN activations (gdn_activation_layout 'grouped')")
    if config.get("quantization", {}) != PACK_QUANTIZATION:
        raise PackError(f"quantization: Hadamard packs require {PACK_QUANTIZATION}, got {config.get('quantization')!r}")
    records = config.get("modules") or []
    if not isinstance(records, list) or not records:
        raise PackError("modules: the Hadamard pack is missing its packed module manifest")
    out, seen = [], set()
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not {"path", "block", "dtype", "embedding"} <= set(rec):
            raise PackError(f"modules[{i}]: must hold path, block, dtype and embedding, got {validate.describe(rec)}")
        path = rec["path"]
        if path in seen:
            raise PackError(f"Duplicate packed module: {path}")
        seen.add(path)
        if rec["dtype"] != "float16":
            raise PackError(f"Unsupported packed activation dtype: {path} ({rec['dtype']!r}; mlx-lm takes 'float16')")
        if isinstance(rec["block"], bool) or rec["block"] not in PACK_BLOCKS:
            raise PackError(f"Invalid Hadamard block {rec['block']!r} for {path} (allowed: {PACK_BLOCKS})")
        out.append(PackedModule(str(path), int(rec["block"]), "float16", bool(rec["embedding"])))
    return tuple(out)


def _tensor_key(key: str) -> str:
    """A stored tensor's key under the text model, whichever schema wrote it: mlx-lm's saved
    model (``language_model.model...``), schema 1 (``model...``), schema 2 (``model.language_model...``)."""
    if key.startswith("model.language_model."):
        return "model." + key[len("model.language_model.") :]
    if key.startswith("language_model."):
        return key[len("language_model.") :]
    return key


@dataclass(frozen=True)
class HadamardPack:
    """A pack read: its ``config`` (config.json), its ``modules`` (the manifest, by path) and
    ``tensors`` (every stored array, keyed under the text model; the files are only read)."""

    folder: Path
    config: dict
    modules: dict[str, PackedModule]
    tensors: dict[str, mx.array]

    @property
    def text_config(self) -> dict:
        return self.config.get("text_config", self.config)

    def layer_type(self, layer: int) -> str:
        """``"full_attention"`` or ``"linear_attention"``: mlx-lm's rule, a full-attention layer
        every ``full_attention_interval`` (``DecoderLayer.is_linear``)."""
        n = int(self.text_config["num_hidden_layers"])
        layer = validate.integer("layer", layer, minimum=0, maximum=n - 1)
        interval = int(self.text_config.get("full_attention_interval", 4))
        return "linear_attention" if (layer + 1) % interval else "full_attention"

    def matrix(self, path: str) -> WeightMatrix:
        """The packed linear at ``path`` as stored: 2-bit codes, float16 scales and biases, and its
        input rotation (block and float32 signs, site INPUT) as a fold; :class:`PackError` where
        the tensors break mlx-lm's ``HadamardQuantizedLinear`` layout."""
        rec = self.modules.get(path)
        if rec is None:
            raise PackError(f"path: {path!r} is not in the pack's manifest")
        parts = {}
        for part in ("weight", "scales", "biases") + (("signs",) if rec.block else ()):
            key = f"{path}.{part}"
            if key not in self.tensors:
                raise PackError(f"{self.folder.name}: missing tensor {key}")
            parts[part] = self.tensors[key]
        w, s, b = parts["weight"], parts["scales"], parts["biases"]
        rows, width = int(w.shape[0]), int(w.shape[-1]) * 16
        if w.dtype != mx.uint32 or w.ndim != 2:
            raise PackError(f"{path}.weight: must be uint32 [out, in/16] (2-bit codes), got {w.dtype} {tuple(w.shape)}")
        if width % 128:
            raise PackError(f"{path}: packed input width {width} must be divisible by 128")
        if rec.block and width % rec.block:
            raise PackError(f"{path}: invalid Hadamard block {rec.block} for width {width}")
        for name, a in (("scales", s), ("biases", b)):
            if a.dtype != mx.float16 or tuple(a.shape) != (rows, width // 128):
                raise PackError(
                    f"{path}.{name}: must be float16 [{rows}, {width // 128}], got {a.dtype} {tuple(a.shape)}"
                )
        fold = None
        if rec.block:
            signs = parts["signs"]
            if signs.dtype != mx.float32 or tuple(signs.shape) != (width,):
                raise PackError(f"{path}.signs: must be float32 [{width}], got {signs.dtype} {tuple(signs.shape)}")
            try:
                fold = HadamardFold(rec.block, signs=signs, site=FoldSite.INPUT)
            except ValueError as e:
                raise PackError(f"{path}.signs: Hadamard signs must contain only -1 and +1 ({e})") from None
        return WeightMatrix(QuantizedBase(w, s, b, PACK_SPEC, (rows, width)), fold)

    def tail_paths(self, layer: int) -> dict[str, str]:
        """The manifest paths of layer ``layer``'s tail matrices (``wo``, ``gate``, ``up``, ``down``)."""
        return {k: f"model.layers.{layer}.{v}" for k, v in TAIL_PATHS[self.layer_type(layer)].items()}

    def tail_matrices(self, layer: int) -> dict[str, WeightMatrix]:
        """Layer ``layer``'s tail matrices (``wo``: the attention's ``o_proj``, or a recurrent
        layer's ``out_proj``; ``gate``, ``up``, ``down``: the MLP's), each with its own input rotation."""
        return {k: self.matrix(p) for k, p in self.tail_paths(layer).items()}

    def ffn_norm(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s ``post_attention_layernorm`` weight, float32: mlx-lm's ``nn.RMSNorm``
        multiplies by it as stored (the effective weight; ``TextModel.sanitize`` adds 1 only to a
        Hugging Face checkpoint's zero-centred norms, never to a saved mlx-lm model's)."""
        layer = validate.integer("layer", layer, minimum=0)
        return self.tensor(f"model.layers.{layer}.post_attention_layernorm.weight")

    def tensor(self, key: str) -> np.ndarray:
        """The stored tensor ``key`` as float32 numpy (norm weights, conv weights, ``A_log``, ...);
        :class:`PackError` naming the pack and the key where it is missing."""
        if key not in self.tensors:
            raise PackError(f"{self.folder.name}: missing tensor {key}")
        return np.array(self.tensors[key].astype(mx.float32))

    @property
    def eps(self) -> float:
        return float(self.text_config.get("rms_norm_eps", 1e-6))

    def model_config(self) -> ModelConfig:
        """The pack's model as the refusal rules and the wait table read it (its ``model_type``
        is read as the unchanged qwen3_5 it is built on: ``workbench.models.families``)."""
        return from_hf_config(self.config, name=self.folder.name)

    def head_refusals(self, layer: int) -> list[HeadRefusal]:
        """frink-models' head-launch rules on the pack's Q, K and V: each projection carries its
        own signs (:data:`HeadRefusal.FOLDS_DIFFER`: the launch rotates their common input once)
        and a format with no matvec kernel (2-bit)."""
        paths = {k: f"model.layers.{layer}.self_attn.{k}_proj" for k in "qkv"}
        if self.layer_type(layer) != "full_attention":
            return head_launch_refusals(self.model_config(), layer)
        mats = {k: self.matrix(p) for k, p in paths.items()}
        served = formats.by_mode(PACK_SPEC.mode, PACK_SPEC.bits).served
        return head_launch_refusals(
            self.model_config(),
            layer,
            q_fold=mats["q"].fold,
            k_fold=mats["k"].fold,
            v_fold=mats["v"].fold,
            q_kernel=served,
            k_kernel=served,
            v_kernel=served,
        )

    def fusable_layers(self) -> tuple[int, ...]:
        """The attention layers whose tail the workbench's kernels fuse for this pack: those the
        model's rules pass AND whose stored matrices :func:`pack_refusals` passes. The wait
        table's ``eligible`` (``waits.submissions(cfg, stage, eligible=...)``)."""
        cfg = self.model_config()
        return tuple(li for li in cfg.attention_layers() if not layer_refusals(cfg, li) and not pack_refusals(self, li))


def read_pack(folder: str | Path) -> HadamardPack:
    """The pack in ``folder`` (its ``config.json`` and ``*.safetensors``), manifest checked."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise PackError(f"folder: {folder} has no config.json")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise PackError(f"{cfg_path}: not readable JSON ({e})") from None
    mods = pack_manifest(config)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise PackError(f"folder: {folder} holds no .safetensors file")
    tensors: dict[str, mx.array] = {}
    for f in files:
        for k, v in mx.load(str(f)).items():
            tensors[_tensor_key(k)] = v
    for m in mods:
        if m.block and f"{m.path}.signs" not in tensors:
            raise PackError(f"Missing Hadamard sign vector: {m.path}.signs")
    return HadamardPack(folder, config, {m.path: m for m in mods}, tensors)


def pack_refusals(pack: HadamardPack, layer: int) -> list[str]:
    """What the workbench's kernels do not serve in layer ``layer``'s tail, matrix by matrix
    (empty: nothing): the 2-bit format (the kernels read :data:`~workbench.fold.formats.KERNEL_FORMATS`)
    and a rotation on any input but wo's (the kernels rotate wo's input only). float16 scales
    are served: the kernels widen them to float32, exactly."""
    served = ", ".join(f.name for f in formats.KERNEL_FORMATS)
    out = []
    for name, path in pack.tail_paths(layer).items():
        m = pack.matrix(path)
        if not formats.by_mode(PACK_SPEC.mode, PACK_SPEC.bits).served:
            out.append(f"{name} ({path}): format {m.dtype} is not one the kernels read ({served})")
        if name != "wo" and m.fold is not None:
            out.append(
                f"{name} ({path}): its input is rotated (Hadamard block {m.fold.block}); "
                "the kernels rotate wo's input only"
            )
    return out
