"""Real checkpoints end to end.

``checkpoint`` reads a GGUF file, a Hugging Face folder or an mlx-lm model into a config
and per-layer ``TailWeights``; ``reference_model`` serves a checkpoint with mlx-lm's own
model classes (capture each layer's residual, branch and output; swap the fused tail in;
greedy decoding); ``end_to_end`` is the SmolLM2-135M study notebook 06 shows.
"""
