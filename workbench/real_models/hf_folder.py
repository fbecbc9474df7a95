"""A Hugging Face folder (``config.json`` and ``*.safetensors``) read into a :class:`Checkpoint`.

Dense, or quantized as mlx-lm writes it (``.weight`` / ``.scales`` / ``.biases`` with the
config's ``quantization``). Every safetensors header is checked before MLX reads the file.
Hugging Face Qwen3-Next and Qwen3.5 checkpoints store their RMSNorm weights zero-centred
(the model computes ``x * (1 + w)``); mlx-lm adds the 1 when it converts such a folder and
says so only by having moved the conv1d weights to its own layout, which is what tells a
raw folder (``"zero_centred"``) from a converted one (``"plain"``) here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx

from workbench.models.families import from_hf_config
from workbench.real_models.loaded_checkpoint import Checkpoint, check_tensors_match_config, naming_the_file
from workbench.real_models.safetensors_header import check_safetensors_header
from workbench.real_models.tensor import tensor_from_parts
from workbench.validate import describe

__all__ = ["ZERO_CENTRED_FAMILIES", "read_hf_folder"]

#: The families whose Hugging Face checkpoints store RMSNorm weights zero-centred
#: (transformers' Qwen3NextRMSNorm / Qwen3_5RMSNorm compute ``x * (1 + w)``).
ZERO_CENTRED_FAMILIES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "prism_hadamard_qwen35"})


def _hf_name(key: str) -> str:
    """Multimodal Qwen3.5 nests the text model (``model.language_model.``, mlx-lm:
    ``language_model.model.``); the tail's tensors are named as in a text-only model."""
    for prefix in ("model.language_model.", "language_model.model."):
        if key.startswith(prefix):
            return "model." + key[len(prefix) :]
    if key.startswith("language_model."):
        return key[len("language_model.") :]
    return key


#: The parts of one stored matrix (``mx.quantize``'s three arrays; ``weight`` alone when dense).
_MATRIX_PARTS = ("weight", "scales", "biases")


def read_hf_folder(path: Path) -> Checkpoint:
    if not (path / "config.json").is_file():
        raise ValueError(f"source: {path.name} has no config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"source: {path.name} has no *.safetensors files")
    try:
        raw = json.loads((path / "config.json").read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"source: {path.name}/config.json is not UTF-8 text (at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"source: {path.name}/config.json is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"source: {path.name}/config.json holds a {type(raw).__name__}, not a JSON object")
    try:
        config = from_hf_config(raw, name=str(raw.get("_name_or_path") or path.name))
    except ValueError as e:
        raise ValueError(naming_the_file(e, f"{path.name}/config.json")) from None
    parts: dict[str, dict[str, mx.array]] = {}
    for f in files:
        check_safetensors_header(f)  # sizes against shapes and the file, before MLX reads it
        try:
            loaded = mx.load(str(f))
        except (RuntimeError, ValueError, OSError) as e:
            raise ValueError(f"source: safetensors file {f.name} could not be read by MLX: {e}") from None
        for key, a in loaded.items():
            key = _hf_name(key)
            stem, part = key.rsplit(".", 1) if "." in key else (key, "weight")
            if part in _MATRIX_PARTS:
                parts.setdefault(stem, {})[part] = a
            else:  # a linear bias, a recurrent layer's own parameters (A_log, dt_bias): a tensor of its own
                parts.setdefault(key, {})["weight"] = a
    quant = raw.get("quantization") or raw.get("quantization_config")
    if quant is not None and not isinstance(quant, Mapping):
        raise ValueError(f"source: {path.name}/config.json's quantization must be an object, got {describe(quant)}")
    mode = (quant or {}).get("mode", "affine")
    try:
        tensors = {name: tensor_from_parts(name, p, {}, mode=mode, quant=quant) for name, p in parts.items()}
        check_tensors_match_config(config, tensors)
    except ValueError as e:
        raise ValueError(naming_the_file(e, f"Hugging Face folder {path.name}")) from None
    convention = "plain"
    if raw.get("model_type") in ZERO_CENTRED_FAMILIES:
        # mlx-lm's own sign that it converted the folder (and added the 1): conv1d weights
        # in its [out, kernel, 1] layout. A raw Hugging Face folder has [out, 1, kernel].
        conv = [t.weight for k, t in tensors.items() if k.endswith("conv1d")]
        converted = bool(conv) and all(int(c.shape[-1]) == 1 for c in conv)
        convention = "plain" if converted else "zero_centred"
    return Checkpoint(config, tensors, convention, f"Hugging Face folder {path.name}")
