"""Each loader against mlx-lm's own layers: tiny models written by the tests in each format.

The criterion is frink-models' (``|x - y| <= 2e-4 * max(|y|, 1)``, ``workbench.compare``):
the workbench's host tail (float64) and fused graph tail, given a layer's captured
residual and branch, against the output of mlx-lm's layer; and mlx-lm's model built from
the loaded checkpoint against the original model's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from workbench.real_models.capture import capture_layers
from workbench.real_models.checkpoint import load_checkpoint
from workbench.real_models.fused_layers import fused_tails
from workbench.real_models.gguf_checkpoint import unpermute_rope_rows
from workbench.real_models.loaded_checkpoint import Checkpoint
from workbench.real_models.mlx_lm_model import reference_model
from workbench.tail import fused_tail, host_tail
from workbench.tail.comparison import compare

llama = pytest.importorskip("mlx_lm.models.llama")

TOL = 2e-4
TOKENS = [3, 17, 42, 99, 5, 64, 7, 120, 31, 8]
LLAMA = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=128,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
)


def _randomize_norms(model: nn.Module, seed: int, centre: float = 1.0) -> None:
    """Norm weights that are not all ones (a norm of ones hides a missing or doubled weight)."""
    rng = np.random.default_rng(seed)
    updates = [
        (k, mx.array(centre + rng.uniform(-0.5, 0.5, v.shape).astype(np.float32)))
        for k, v in tree_flatten(model.parameters())
        if k.endswith("layernorm.weight") or k == "model.norm.weight"
    ]
    model.load_weights(updates, strict=False)
    mx.eval(model.parameters())


def tiny_llama(seed: int = 0, *, quantized: bool = False) -> nn.Module:
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(LLAMA))
    _randomize_norms(model, seed)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def _check_tails_against_layers(ckpt: Checkpoint, model: nn.Module) -> None:
    caps = capture_layers(model, TOKENS)
    for cap in caps:
        if cap.branch is None:
            continue
        w = ckpt.tail_weights(cap.layer)
        assert w.eps == model.args.rms_norm_eps if hasattr(model.args, "rms_norm_eps") else True
        host = compare(host_tail(w, cap.branch, cap.residual), cap.output, tol=TOL)
        graph = compare(fused_tail(w, cap.branch, cap.residual, backend="graph"), cap.output, tol=TOL)
        assert host.passed, f"layer {cap.layer}: {host}"
        assert graph.passed, f"layer {cap.layer}: {graph}"


def _logits(model: nn.Module) -> np.ndarray:
    return np.asarray(model(mx.array([TOKENS]))[0].astype(mx.float32))


# -- (c) an mlx-lm model object --------------------------------------------------------


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "affine4"])
def test_mlx_lm_model_object(quantized):
    model = tiny_llama(1, quantized=quantized)
    ckpt = load_checkpoint(model)
    assert ckpt.config.num_layers == 2 and ckpt.config.rms_norm_eps == 1e-5 and ckpt.norm_convention == "plain"
    if quantized:
        assert ckpt.tail_weights(0).wo.dtype == "affine4-g32"
    _check_tails_against_layers(ckpt, model)


def test_fused_tails_swapped_into_every_layer_give_the_models_logits():
    model = tiny_llama(2)
    ckpt = load_checkpoint(model)
    ref = _logits(model)
    with fused_tails(model, [ckpt.tail_weights(i) for i in range(2)]):
        fused = _logits(model)
    assert compare(fused, ref, tol=TOL).passed
    assert np.array_equal(_logits(model), ref)  # the model's own layers are back


# -- (b) a Hugging Face folder ------------------------------------------------------------


def write_hf_folder(model: nn.Module, folder: Path, config: dict, transform=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    if transform is not None:
        weights = transform(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "affine4"])
def test_hf_folder(tmp_path, quantized):
    model = tiny_llama(3, quantized=quantized)
    cfg = dict(LLAMA, **({"quantization": {"group_size": 32, "bits": 4}} if quantized else {}))
    ckpt = load_checkpoint(write_hf_folder(model, tmp_path / "llama", cfg))
    assert ckpt.norm_convention == "plain"
    _check_tails_against_layers(ckpt, model)
    np.testing.assert_array_equal(_logits(reference_model(ckpt)), _logits(model))


# -- (a) a GGUF file -----------------------------------------------------------------------

_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def permute_like_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute), written from its
    definition: each head's rows [2, d/2] -> [d/2, 2], for its interleaved RoPE."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: nn.Module, path: Path) -> Path:
    a = model.args
    arrays = {}
    for k, v in tree_flatten(model.parameters()):
        name = k[: -len(".weight")]
        if name == "model.embed_tokens":
            g = "token_embd"
        elif name == "model.norm":
            g = "output_norm"
        else:
            _, _, i, rest = name.split(".", 3)
            g = f"blk.{i}.{_TO_GGUF[rest]}"
        w = np.asarray(v)
        if g.endswith("attn_q"):
            w = permute_like_llama_cpp(w, a.num_attention_heads)
        elif g.endswith("attn_k"):
            w = permute_like_llama_cpp(w, a.num_key_value_heads)
        arrays[f"{g}.weight"] = mx.array(w)
    meta = {
        "general.architecture": "llama",
        "general.name": "tiny llama",
        "llama.block_count": mx.array(a.num_hidden_layers, dtype=mx.uint32),
        "llama.embedding_length": mx.array(a.hidden_size, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(a.intermediate_size, dtype=mx.uint32),
        "llama.attention.head_count": mx.array(a.num_attention_heads, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(a.num_key_value_heads, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(a.rms_norm_eps, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(a.rope_theta, dtype=mx.float32),
        "llama.vocab_size": mx.array(a.vocab_size, dtype=mx.uint32),
    }
    mx.save_gguf(str(path), arrays, meta)
    return path


def test_gguf_file(tmp_path):
    model = tiny_llama(4)
    ckpt = load_checkpoint(write_gguf(model, tmp_path / "tiny.gguf"))
    assert ckpt.config.rms_norm_eps == 1e-5  # float32 in the file, the config's number here
    _check_tails_against_layers(ckpt, model)
    # The Q/K rows are back in Hugging Face order: mlx-lm's (non-interleaved) RoPE model
    # built from the file gives the original logits.
    got = _logits(reference_model(ckpt))
    assert compare(got, _logits(model), tol=TOL).passed


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(12 * 3).reshape(12, 3)
    for heads in (1, 2, 3):
        stored = permute_like_llama_cpp(w, heads)
        np.testing.assert_array_equal(stored[unpermute_rope_rows(12, heads)], w)


# -- bad sources ---------------------------------------------------------------------------


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"^source: must be"):
        load_checkpoint(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=r"^source: must be"):
        load_checkpoint(42)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_checkpoint(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"^norm_convention: must be one of"):
        load_checkpoint(tiny_llama(5), norm_convention="centred")


def test_biases_are_refused_never_dropped():
    cfg = dict(LLAMA, mlp_bias=True)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    ckpt = load_checkpoint(model)
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.bias.*FFN_BIAS"):
        ckpt.tail_weights(0)
    model = llama.Model(llama.ModelArgs.from_dict(dict(LLAMA, attention_bias=True)))
    with pytest.raises(ValueError, match=r"o_proj\.bias.*O_BIAS"):
        load_checkpoint(model).tail_weights(1)


# -- a zero-centred Qwen3.5 folder, as Hugging Face ships it -----------------------------------

QWEN35_TEXT = dict(
    model_type="qwen3_5_text",
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    full_attention_interval=2,
    vocab_size=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    hidden_act="silu",
    attn_output_gate=True,
    rope_parameters={
        "type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
    },
)
_ZERO_CENTRED_KEYS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def _as_hf_qwen35(weights: dict) -> dict:
    """mlx-lm's parameters back into a Hugging Face Qwen3.5 checkpoint: multimodal names,
    conv1d as [out, 1, kernel], norm weights zero-centred (mlx-lm's sanitize undoes all three)."""
    out = {}
    for k, v in weights.items():
        if "conv1d.weight" in k:
            v = v.moveaxis(2, 1)
        if any(k.endswith(s) for s in _ZERO_CENTRED_KEYS):
            v = v - 1.0
        out[k.replace("language_model.model.", "model.language_model.")] = v
    return out


@pytest.fixture(scope="module")
def qwen35_folder(tmp_path_factory):
    qwen35 = pytest.importorskip("mlx_lm.models.qwen3_5")
    config = {"model_type": "qwen3_5", "text_config": QWEN35_TEXT, "tie_word_embeddings": False}
    mx.random.seed(6)
    model = qwen35.Model(qwen35.ModelArgs.from_dict(config))
    _randomize_norms(model, 6)
    return write_hf_folder(model, tmp_path_factory.mktemp("qwen35") / "hf", config, _as_hf_qwen35)


def test_zero_centred_qwen35_folder_against_mlx_lms_conversion(qwen35_folder):
    from mlx_lm.utils import load_model

    model, _ = load_model(qwen35_folder)  # mlx-lm's own reading, which adds the 1
    ckpt = load_checkpoint(qwen35_folder)
    assert ckpt.norm_convention == "zero_centred"
    assert ckpt.config.attention_layers() == [1, 3]
    w = ckpt.tail_weights(1)
    assert w.norm_convention == "zero_centred" and w.eps == 1e-6 and "zero-centred" in repr(w)
    _check_tails_against_layers(ckpt, model)
    # Read as plain weights, the same folder is far off: the convention is what makes it right.
    plain = load_checkpoint(qwen35_folder, norm_convention="plain")
    cap = capture_layers(model, TOKENS)[1]
    assert not compare(host_tail(plain.tail_weights(1), cap.branch, cap.residual), cap.output, tol=TOL).passed
    with pytest.raises(
        ValueError, match=r"^layer: 0 of .* is linear_attention, not attention; its attention layers are \[1, 3\]"
    ):
        ckpt.tail_weights(0)


def test_mlx_lm_converted_qwen35_reads_plain(qwen35_folder):
    from mlx_lm.utils import load_model

    model, _ = load_model(qwen35_folder)
    ckpt = load_checkpoint(model)
    assert ckpt.norm_convention == "plain"
    _check_tails_against_layers(ckpt, model)
    with fused_tails(model, [ckpt.tail_weights(i) if i in (1, 3) else None for i in range(4)]):
        fused = _logits(model)
    assert compare(fused, _logits(model), tol=TOL).passed
