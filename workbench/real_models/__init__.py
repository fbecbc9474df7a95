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
quietly). The fused tail inside it: ``reference_model`` swaps it in (``fused_tails``);
``graph_tail`` is the tail as an MLX graph, its weights prepared once; ``stacked_qkv`` an
attention's q, k and v projections as one product. ``end_to_end`` is the SmolLM2-135M study
notebook 06 shows. The names a user reaches for first are re-exported here, all but the
function ``reference_model`` (``mlx_lm_model.reference_model``): its name is the module's.
"""

from workbench.real_models.capture import LayerCapture, capture_layers
from workbench.real_models.checkpoint import load_checkpoint, smollm2_gguf_path
from workbench.real_models.decoding import (
    Generation,
    first_departure,
    first_departures,
    forced_choices,
    greedy,
    greedy_beside,
    greedy_captured,
)
from workbench.real_models.loaded_checkpoint import Checkpoint
from workbench.real_models.model_parts import vocab_size
from workbench.real_models.reference_model import fused_tails, stacked_qkv
from workbench.real_models.tokenizer import gguf_tokenizer

__all__ = [
    "Checkpoint",
    "Generation",
    "LayerCapture",
    "capture_layers",
    "first_departure",
    "first_departures",
    "forced_choices",
    "fused_tails",
    "gguf_tokenizer",
    "greedy",
    "greedy_beside",
    "greedy_captured",
    "load_checkpoint",
    "smollm2_gguf_path",
    "stacked_qkv",
    "vocab_size",
]
