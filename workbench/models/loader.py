"""The model configs shipped with the workbench, by name: ``data/models/<name>.json``.

Each file is a real model's Hugging Face ``config.json`` (with ``_source`` saying where it
came from), read by ``workbench.models.families.from_hf_config``. Names are the files'
stems, so adding a model is adding its config file.
"""

from __future__ import annotations

from workbench.models.config import MODELS_DIR, ModelConfig
from workbench.models.families import from_hf_config

__all__ = ["list_models", "load_model"]


def list_models() -> list[str]:
    """Names of the shipped configs (``data/models/<name>.json``), sorted."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_model(name: str) -> ModelConfig:
    """The shipped config ``name`` (see `list_models`) as a `ModelConfig`."""
    names = list_models()
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"name: unknown model {name!r}; shipped: {', '.join(names)}")
    return from_hf_config(MODELS_DIR / f"{name}.json", name=name)
