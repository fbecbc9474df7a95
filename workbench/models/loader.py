"""The model configs shipped with the workbench, by name: ``data/models/<name>.json``;
or any ``config.json`` by its path.

Each file is a real model's Hugging Face ``config.json`` (with ``_source`` saying where it
came from), read by ``workbench.models.families.from_hf_config``. Names are the files'
stems, so adding a model is adding its config file.
"""

from __future__ import annotations

from pathlib import Path

from workbench import validate
from workbench.models.config import MODELS_DIR, ModelConfig
from workbench.models.families import from_hf_config

__all__ = ["list_models", "load_model"]


def list_models() -> list[str]:
    """Names of the shipped configs (``data/models/<name>.json``), sorted."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def _is_path(name: object) -> bool:
    """A ``Path``, or a string that names a file (``.json``, a separator): never a shipped name."""
    return isinstance(name, Path) or (isinstance(name, str) and (name.endswith(".json") or "/" in name or "\\" in name))


def load_model(name: str | Path) -> ModelConfig:
    """The shipped config ``name`` (see `list_models`), or the ``config.json`` at a path
    (a file, or a folder holding one), as a `ModelConfig`.

    A path goes to ``workbench.models.families.from_hf_config``, which reads any Hugging
    Face ``config.json`` of a known family; a checkpoint's tensors are read by
    ``workbench.real_models.checkpoint.load_checkpoint``.
    """
    if _is_path(name):
        try:
            return from_hf_config(name)
        except ValueError as err:  # said as load_model's own parameter, which the caller passed
            raise ValueError(f"name: {str(err).removeprefix('path_or_dict: ')}") from None
    names = list_models()
    if not isinstance(name, str) or name not in names:
        raise ValueError(
            f"name: unknown model {validate.describe(name)}; shipped: {', '.join(names)}; or a config.json's "
            f"path (load_model reads it; a checkpoint's own tensors: load_checkpoint)"
        )
    return from_hf_config(MODELS_DIR / f"{name}.json", name=name)
