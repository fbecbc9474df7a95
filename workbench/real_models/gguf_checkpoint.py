"""A GGUF file (llama.cpp's format) read into a :class:`Checkpoint`.

``mx.load`` reads the file, every Q4_0/Q4_1/Q8_0 matrix as an MLX affine-quantized array
(group 32, float16 scales and biases: exactly ``WeightMatrix``'s quantized form); the
configuration is in the file's metadata (:func:`gguf_config`). llama.cpp's converter
permutes each head's Q and K rows for its interleaved RoPE; they are put back in Hugging
Face order (:func:`unpermute_rope_rows`), so mlx-lm's Llama, whose RoPE is not
interleaved, can serve the checkpoint. The header is checked before MLX's reader, which
trusts it, sees the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.models.families import from_hf_config
from workbench.real_models.gguf_header import check_gguf_header
from workbench.real_models.loaded_checkpoint import Checkpoint, check_tensors_match_config, naming_the_file
from workbench.real_models.tensor import in_dims, tensor_from_parts
from workbench.validate import describe

__all__ = ["GGUF_ARCHITECTURES", "gguf_config", "read_gguf", "unpermute_rope_rows"]

#: llama.cpp's tensor names -> Hugging Face's (per block, then the model-level ones).
_GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_MODEL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

#: GGUF architectures read here: llama.cpp writes Llama-family models (SmolLM2, Llama 2/3,
#: Mistral) as ``llama``; their tails are plain GQA + SwiGLU.
GGUF_ARCHITECTURES = ("llama",)


def _meta_scalar(meta: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key not in meta:
        if default is None:
            raise ValueError(f"source: the GGUF metadata has no {key!r}, which the config needs")
        return default
    v = meta[key]
    if isinstance(v, mx.array):
        if v.size != 1:
            raise ValueError(f"source: the GGUF metadata's {key!r} must be one number, got {v.size} of them")
        v = v.item()
        if isinstance(v, float):
            # GGUF stores float32: 1e-5 arrives as 9.9999997e-06. Its shortest float32
            # spelling is the number the model's config.json says (and mlx-lm will use).
            v = float(np.format_float_positional(np.float32(v), unique=True, trim="-"))
    return v


def _meta_count(meta: Mapping[str, Any], key: str, default: int | None = None, *, minimum: int = 1) -> int:
    """A count from the metadata (heads, lengths): an integer >= ``minimum``, else ValueError naming the key."""
    v = _meta_scalar(meta, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"source: the GGUF metadata's {key!r} must be an integer >= {minimum}, got {describe(v)}")
    return int(v)


def _meta_positive(meta: Mapping[str, Any], key: str, default: float | None = None) -> float:
    """A positive finite number from the metadata (eps, the RoPE base), else ValueError naming the key."""
    v = _meta_scalar(meta, key, default)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float, np.integer, np.floating))
        or not (np.isfinite(v) and v > 0)
    ):
        raise ValueError(f"source: the GGUF metadata's {key!r} must be a finite number > 0, got {describe(v)}")
    return float(v)


def meta_key(meta: Mapping[str, Any], name: str) -> str:
    """The metadata's key for ``name`` under its architecture (``llama.block_count``)."""
    return f"{_meta_scalar(meta, 'general.architecture')}.{name}"


def gguf_config(meta: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """The Hugging Face ``config.json`` a GGUF file's metadata describes (Llama architecture).

    Every count is checked to be a positive integer and every rate a positive finite
    number here; whether they agree with the tensors is checked once the tensors are read.
    """
    arch = _meta_scalar(meta, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"source: GGUF architecture must be one of {GGUF_ARCHITECTURES}, got {describe(arch)}")
    k = lambda s: f"{arch}.{s}"  # noqa: E731
    hidden = _meta_count(meta, k("embedding_length"))
    heads = _meta_count(meta, k("attention.head_count"))
    if k("vocab_size") in meta:
        vocab = _meta_count(meta, k("vocab_size"))
    elif isinstance(meta.get("tokenizer.ggml.tokens"), (list, tuple)):
        vocab = len(meta["tokenizer.ggml.tokens"])
    else:
        raise ValueError(
            f"source: the GGUF metadata has neither {k('vocab_size')!r} nor a token list "
            f"('tokenizer.ggml.tokens'), so its vocabulary size is unknown"
        )
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": _meta_count(meta, k("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta_count(meta, k("attention.head_count_kv"), heads),
        "head_dim": _meta_count(meta, k("attention.key_length"), max(hidden // heads, 1)),
        "intermediate_size": _meta_count(meta, k("feed_forward_length")),
        "rms_norm_eps": _meta_positive(meta, k("attention.layer_norm_rms_epsilon")),
        "rope_theta": _meta_positive(meta, k("rope.freq_base"), 10000.0),
        "max_position_embeddings": _meta_count(meta, k("context_length"), 2048),
        "vocab_size": int(vocab),
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head" not in names,
        "attention_bias": "model.layers.0.self_attn.o_proj.bias" in names,
        "mlp_bias": "model.layers.0.mlp.gate_proj.bias" in names,
        "_name": str(_meta_scalar(meta, "general.name", arch)),
        "_source": "GGUF metadata",
    }


def _gguf_name(key: str) -> tuple[str, str]:
    """``blk.3.attn_q.scales`` -> (``model.layers.3.self_attn.q_proj``, ``scales``)."""
    if "." not in key:
        raise ValueError(f"source: GGUF tensor {key!r} is not one the Llama architecture has")
    stem, part = key.rsplit(".", 1)
    if stem.startswith("blk."):
        _, i, what = (stem.split(".", 2) + ["", ""])[:3]
        if not i.isdigit() or what not in _GGUF_BLOCK_NAMES:
            raise ValueError(f"source: GGUF tensor {key!r} is not one the Llama architecture has")
        return f"model.layers.{i}.{_GGUF_BLOCK_NAMES[what]}", part
    if stem not in _GGUF_MODEL_NAMES:
        raise ValueError(f"source: GGUF tensor {key!r} is not one the Llama architecture has")
    return _GGUF_MODEL_NAMES[stem], part


def unpermute_rope_rows(rows: int, heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's Q/K permutation for its interleaved RoPE.

    llama.cpp's converter reorders each head's rows ``[2, d/2] -> [d/2, 2]`` (HF's
    rotate-half pairs ``(j, j + d/2)`` become adjacent rows ``(2j, 2j + 1)``);
    ``stored[perm]`` is the Hugging Face order.
    """
    d = rows // heads
    return np.arange(rows).reshape(heads, d // 2, 2).swapaxes(1, 2).reshape(-1)


def read_gguf(path: Path) -> Checkpoint:
    # MLX's reader trusts the header (a bad count or length is a segfault): check it first.
    check_gguf_header(path)
    try:
        arrays, meta = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as e:
        raise ValueError(f"source: GGUF file {path.name} could not be read by MLX: {e}") from None
    try:
        return _gguf_checkpoint(path, arrays, meta)
    except ValueError as e:
        raise ValueError(naming_the_file(e, f"GGUF file {path.name}")) from None


def _gguf_checkpoint(path: Path, arrays: Mapping[str, mx.array], meta: Mapping[str, Any]) -> Checkpoint:
    parts: dict[str, dict[str, mx.array]] = {}
    for key, a in arrays.items():
        name, part = _gguf_name(key)
        # ".bias" is a linear layer's bias: its own tensor, not a quantization part.
        if part == "bias":
            parts.setdefault(f"{name}.bias", {})["weight"] = a
        else:
            parts.setdefault(name, {})[part] = a
    names = set(parts)
    raw = gguf_config(meta, names)
    config = from_hf_config(raw)
    dims = in_dims(config)
    tensors = {name: tensor_from_parts(name, p, dims, mode="affine") for name, p in parts.items()}
    check_tensors_match_config(config, tensors, f"the GGUF metadata's {meta_key(meta, 'block_count')!r}")
    q_heads, kv_heads = raw["num_attention_heads"], raw["num_key_value_heads"]
    for i in range(config.num_layers):
        for proj, heads in (("q_proj", q_heads), ("k_proj", kv_heads)):
            for name in (f"model.layers.{i}.self_attn.{proj}", f"model.layers.{i}.self_attn.{proj}.bias"):
                if name in tensors:
                    t = tensors[name]
                    if t.shape[0] % (2 * heads):
                        raise ValueError(f"source: {name} has {t.shape[0]} rows, not {heads} heads of an even width")
                    tensors[name] = t.take_rows(unpermute_rope_rows(t.shape[0], heads))
    return Checkpoint(config, tensors, "plain", f"GGUF file {path.name}", dict(meta))
