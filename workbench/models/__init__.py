"""Real models' configs and the rules that refuse a layer.

``config`` holds what the rules ask about a model (``ModelConfig``, one ``LayerConfig`` a
layer); ``families`` reads a Hugging Face ``config.json`` into it, one reader a family
(each says which keys it takes), over ``config_reader`` (the file in, typed keys out) and
``head_fields`` (what an attention head computes past Q/K/V, family by family: biases,
QK-norm, RoPE's width, base and scaling);
``loader`` loads the fifteen real models shipped in ``data/models/`` by name; ``hadamard_pack``
reads PrismML's Hadamard packs (Bonsai-27B as it ships) as mlx-lm reads them; ``refusals``
holds the rules frink-models applies before it fuses an attention tail, every one that
holds for a layer with its reason.

The names below are the part's API, importable from ``workbench.models`` itself; each module
is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "config": ("ModelConfig", "LayerConfig", "Mixer", "BONSAI_SHAPE", "MODELS_DIR"),
        "families": ("from_hf_config",),
        "head_fields": ("HEAD_FAMILIES", "HeadFamily"),
        "loader": ("load_model", "list_models"),
        "hadamard_pack": (
            "HadamardPack",
            "PackedModule",
            "PackError",
            "PACK_BLOCKS",
            "PACK_QUANTIZATION",
            "pack_manifest",
            "pack_refusals",
            "read_pack",
        ),
        "refusals": (
            "Refusal",
            "HeadRefusal",
            "layer_refusals",
            "eligible",
            "explain",
            "refusal_table",
            "head_launch_refusals",
            "model_summary",
            "tail_verdicts",
            "reason_counts",
            "format_reason_counts",
        ),
    },
)

__all__ = list(_HOMES)
