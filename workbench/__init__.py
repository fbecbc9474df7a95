"""The fused-attention-tail workbench.

Python/MLX reimplementation and study of a decoder engine's fused attention tail,
``out = residual + ffn(rms_norm(residual + wo(branch)))``, with a block-Hadamard fold on
``wo``, and the rules that refuse layers the fusion cannot serve.
"""

__version__ = "0.1.0"
