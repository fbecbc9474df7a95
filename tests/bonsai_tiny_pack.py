"""A tiny PrismML Hadamard pack written through mlx-lm 0.32.2's own classes, for the tests.

The model is ``mlx_lm.models.prism_hadamard_qwen35.Model`` at a tiny qwen3_5 shape (one
recurrent layer, one full-attention layer, hidden 512, FFN 1024), every linear and the
embedding packed as the real Bonsai-27B pack packs them: each module's dense weight ``W``
stored as ``W R^T`` (``R = H_b/sqrt(b) diag(signs)``, mlx-lm's ``hadamard_rotate`` on its rows),
quantized 2-bit affine at group 128 from float16 (so scales and biases are float16). Blocks
differ by module (512; 1024 on ``down_proj``, whose input is the FFN's 1024; 0 on
``in_proj_a``), so a kernel that applies one module's rotation with another's is seen. It is
saved with ``mlx_lm.utils.save_model`` / ``save_config`` and read back with
``mlx_lm.utils.load_model``: the loading code a user of the pack runs.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten
from mlx_lm.models import prism_hadamard_qwen35 as prism
from mlx_lm.utils import load_model, save_config, save_model

TEXT_CONFIG = {
    "model_type": "qwen3_5_text",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "vocab_size": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "attn_output_gate": True,
    "layer_types": ["linear_attention", "full_attention"],
    "rope_parameters": {"type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
}


def _block(path: str, width: int) -> int:
    if path.endswith("in_proj_a"):
        return 0
    return 1024 if path.endswith("down_proj") else 512


def pack_config(modules: list[dict]) -> dict:
    return {
        "model_type": "prism_hadamard_qwen35",
        "base_model_type": "qwen3_5",
        "schema_version": 1,
        "tensor_namespace": "mlx-lm-text",
        "gdn_activation_layout": "grouped",
        "quantization": {"bits": 2, "group_size": 128, "mode": "affine"},
        "modules": modules,
        "text_config": dict(TEXT_CONFIG),
    }


def _manifest() -> list[dict]:
    """Every Linear and the Embedding of the tiny qwen3_5 model, as the pack lists them."""
    from mlx_lm.models import qwen3_5

    plain = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({"model_type": "qwen3_5", "text_config": TEXT_CONFIG}))
    out = []
    for path, m in plain.language_model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            emb = isinstance(m, nn.Embedding)
            out.append({"path": path, "block": _block(path, m.weight.shape[1]), "dtype": "float16", "embedding": emb})
    return sorted(out, key=lambda r: r["path"])


def write_pack(folder: Path, *, seed: int = 0) -> Path:
    """The tiny pack written in ``folder`` (created); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = pack_config(_manifest())
    model = prism.Model(prism.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    modules = dict(model.language_model.named_modules())
    updates = []
    for rec in config["modules"]:
        m = modules[rec["path"]]
        rows, width = m.scales.shape[0], m.scales.shape[1] * 128
        w = mx.array((rng.standard_normal((rows, width)) / np.sqrt(width)).astype(np.float32))
        if rec["block"]:
            signs = mx.array(np.where(rng.random(width) < 0.5, -1.0, 1.0).astype(np.float32))
            w = prism.hadamard_rotate(w, rec["block"], signs)  # each row R w_i: the stored W R^T
            updates.append((f"{rec['path']}.signs", signs))
        q, s, b = mx.quantize(w.astype(mx.float16), group_size=128, bits=2)
        updates += [(f"{rec['path']}.weight", q), (f"{rec['path']}.scales", s), (f"{rec['path']}.biases", b)]
    for i in range(TEXT_CONFIG["num_hidden_layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            v = 1.0 + 0.1 * rng.standard_normal(TEXT_CONFIG["hidden_size"])
            updates.append((f"model.layers.{i}.{norm}.weight", mx.array(v.astype(np.float32))))
    model.language_model.update(tree_unflatten(updates))
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return folder


def load_pack(folder: Path):
    """The pack loaded by mlx-lm itself: ``(model, config)``."""
    return load_model(Path(folder))
