"""Real checkpoints end to end.

Checkpoints in: ``gguf_header`` and ``safetensors_header`` check a file's header against
its size before any native reader sees it (a corrupt download is an error naming the file,
not a crash); ``checkpoint`` (``load_checkpoint``) reads a GGUF file (``gguf_checkpoint``),
a Hugging Face folder (``hf_folder``) or an mlx-lm model (``mlx_lm_checkpoint``) into a
``loaded_checkpoint.Checkpoint``: a config and per-layer ``TailWeights`` over ``tensor``'s
stored tensors. mlx-lm's model carrying them: ``mlx_lm_model`` (the reference forward
pass), ``tokenizer`` (a GGUF file's own), ``model_parts`` (the layers, head and vocabulary
every module here reaches into), ``capture`` (each layer's residual, branch and output),
``decoding`` (greedy decoding, first departures), ``transformers_advice`` (mlx-lm imported
quietly). The fused tail inside it: ``fused_layers`` swaps it in (``fused_tails``);
``graph_tail`` is the tail as an MLX graph, its weights prepared once; ``stacked_attention``
an attention's q, k and v projections as one product. ``hadamard_pack_writer`` writes a
PrismML Hadamard pack of random weights through mlx-lm's own classes. ``end_to_end`` is the SmolLM2-135M
study notebook 06 shows. The names below are the part's API, importable from
``workbench.real_models``; each module is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "checkpoint": ("load_checkpoint", "smollm2_gguf_path"),
        "loaded_checkpoint": ("Checkpoint",),
        "mlx_lm_model": ("reference_model",),
        "hadamard_pack_writer": (
            "write_hadamard_pack",
            "load_hadamard_pack",
            "TINY_TEXT_CONFIG",
            "tiny_blocks",
            "block_1024",
        ),
        "tokenizer": ("gguf_tokenizer",),
        "model_parts": ("vocab_size",),
        "capture": ("LayerCapture", "capture_layers"),
        "decoding": (
            "Generation",
            "first_departure",
            "first_departures",
            "forced_choices",
            "greedy",
            "greedy_beside",
            "greedy_captured",
        ),
        "fused_layers": ("LAZY_BACKENDS", "MODEL_BACKENDS", "fused_tails", "stacked_qkv", "vector_tail"),
        "graph_tail": ("model_graph_tail", "prepared_graph_tail", "stored_dtype"),
        "end_to_end": (
            "PROMPT",
            "FOLD_FORMATS",
            "RealModel",
            "smollm2",
            "layer_errors",
            "kernel_errors",
            "TokenComparison",
            "same_tokens",
            "layer_match",
            "fold_errors",
            "fold_tokens",
            "requantized_wo",
        ),
    },
)

__all__ = list(_HOMES)
