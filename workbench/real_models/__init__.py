"""Real checkpoints end to end.

``gguf_header`` and ``safetensors_header`` check a file's header against its size before
any native reader sees it (a corrupt download is an error naming the file, not a crash);
``checkpoint`` reads a GGUF file, a Hugging Face folder or an mlx-lm model into a config
and per-layer ``TailWeights``; ``graph_tail`` is the fused tail as an MLX graph inside a
model's forward pass, its weights prepared once (float32 activations, or the weights' own
half-precision dtype); ``stacked_qkv`` an attention's q, k and v projections as one product,
a decode step's heads laid out with one reshape; ``reference_model`` serves a checkpoint with mlx-lm's own
model classes (capture each layer's residual, branch and output; swap the fused tail in;
greedy decoding); ``end_to_end`` is the SmolLM2-135M study notebook 06 shows.
"""
