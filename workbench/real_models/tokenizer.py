"""The tokenizer a GGUF file carries in its metadata, as a transformers fast tokenizer.

A GGUF file holds its own BPE vocabulary and merges, its pre-tokenizer's name and its chat
template, so the file alone is enough to encode a prompt: no Hugging Face download. The
``tokenizers`` library builds it; transformers wraps it (chat template, special tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.real_models.transformers_advice import without_transformers_advice
from workbench.validate import describe

__all__ = ["gguf_tokenizer"]


def gguf_tokenizer(metadata: Mapping[str, Any]) -> Any:
    """The tokenizer a GGUF file carries (``tokenizer.ggml.*``), as a transformers fast tokenizer.

    Only the byte-level BPE (``tokenizer.ggml.model == "gpt2"``) that SmolLM2 and the
    Llama-3 family use is built; its pre-tokenizer for ``smollm`` / ``default`` splits
    digits one by one, then GPT-2's byte-level split (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM).
    Control tokens (type 3) are special tokens; the chat template is the file's.
    """
    if not isinstance(metadata, Mapping):
        raise ValueError(
            f"metadata: must be a GGUF file's metadata (a mapping, e.g. load_checkpoint(path).metadata), "
            f"got {describe(metadata)}"
        )
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"metadata: tokenizer.ggml.model must be 'gpt2' (byte-level BPE), got {kind!r}")
    for key in ("tokens", "merges", "token_type"):
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise ValueError(f"metadata: tokenizer.ggml.{key} must be a list, got {describe(value)}")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    with without_transformers_advice():
        from transformers import PreTrainedTokenizerFast

    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    types = np.asarray(metadata["tokenizer.ggml.token_type"]).tolist()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()

    def token(key: str) -> str | None:
        v = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if v is None else tokens[int(np.asarray(v))]

    specials = [t for t, k in zip(tokens, types) if k == 3]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        additional_special_tokens=specials,
    )
    template = metadata.get("tokenizer.chat_template")
    if template is not None:
        fast.chat_template = str(template)
    return fast
