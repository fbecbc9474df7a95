"""A PrismML Hadamard pack written through mlx-lm 0.32.2's own classes, with random weights.

What the tests and ``bench.check_bonsai_pack`` check a pack's layer on: the model is
``mlx_lm.models.prism_hadamard_qwen35.Model`` at a given qwen3_5 text config, every Linear
and the Embedding packed as the pack's manifest lists them. Each module's dense weight ``W``
(Gaussian, scaled by ``1/sqrt(in)``) is stored as ``W R^T``: mlx-lm's own ``hadamard_rotate``
applied to its rows (``R = H_b/sqrt(b) diag(signs)``, random signs), then ``mx.quantize`` at
2 bits, group 128, from float16, so the scales and biases are float16 as the packs store
them. It is saved with ``mlx_lm.utils.save_model`` / ``save_config`` and read back with
``mlx_lm.utils.load_model`` (:func:`load_hadamard_pack`): the loading code a pack's user runs.
The unpacked constants (norm weights, a recurrent layer's step constants) are drawn from the
same seed, so a pack is the same for a seed and no weight is left at a value (one) that hides
its misuse.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate

#: A tiny qwen3_5 text model: one recurrent layer, one full-attention layer, hidden 512, FFN
#: 1024 (widths the packs' blocks of 512 and 1024 fit).
TINY_TEXT_CONFIG: dict[str, Any] = {
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
    "layer_types": ["linear_attention", "full_attention"],
    "vocab_size": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "attn_output_gate": True,
    "rope_parameters": {"type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
}


def tiny_blocks(path: str, width: int) -> int:
    """The tiny pack's blocks, different by module so that one module's rotation applied with
    another's shows: 1024 on ``down_proj`` (its input is the FFN's 1024), none on ``in_proj_a``,
    512 elsewhere."""
    if path.endswith("in_proj_a"):
        return 0
    return 1024 if path.endswith("down_proj") else 512


def block_1024(path: str, width: int) -> int:
    """Block 1024 on every module, as Bonsai-27B's port notes describe its pack."""
    return 1024


def pack_config(text_config: dict, modules: list[dict]) -> dict:
    """A schema-1 (text) pack's config.json over ``text_config`` and the manifest ``modules``."""
    return {
        "model_type": "prism_hadamard_qwen35",
        "base_model_type": "qwen3_5",
        "schema_version": 1,
        "tensor_namespace": "mlx-lm-text",
        "gdn_activation_layout": "grouped",
        "quantization": {"bits": 2, "group_size": 128, "mode": "affine"},
        "modules": modules,
        "text_config": dict(text_config),
    }


def _manifest(text_config: dict, blocks: Callable[[str, int], int]) -> list[dict]:
    """Every Linear and the Embedding of the plain qwen3_5 model of ``text_config``, as a pack lists them."""
    import mlx.nn as nn
    from mlx_lm.models import qwen3_5

    plain = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({"model_type": "qwen3_5", "text_config": text_config}))
    out = []
    for path, m in plain.language_model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            emb = isinstance(m, nn.Embedding)
            out.append({"path": path, "block": blocks(path, m.weight.shape[1]), "dtype": "float16", "embedding": emb})
    return sorted(out, key=lambda r: r["path"])


def _layer_constants(text_config: dict, rng: np.random.Generator) -> list[tuple[str, mx.array]]:
    """The layers' unpacked constants drawn from the seed (mlx-lm's init draws ``A_log`` and
    ``conv1d`` from MLX's unseeded generator, and sets every other to ones, where a weight
    applied to the wrong axis would not show): QK-norm weights ~ 1 + N(0, 1/100); a recurrent
    layer's ``conv1d`` ~ N(0, 1/K), ``A_log`` = log U(1, 16) (mlx-lm's range), ``dt_bias`` ~
    N(0, 1/4), ``norm`` ~ 1 + N(0, 1/100)."""
    c, out = text_config, []
    interval = int(c.get("full_attention_interval", 4))
    for i in range(int(c["num_hidden_layers"])):
        pre = f"model.layers.{i}"
        if (i + 1) % interval == 0:
            for n in ("q_norm", "k_norm"):
                out.append((f"{pre}.self_attn.{n}.weight", 1 + 0.1 * rng.standard_normal(int(c["head_dim"]))))
            continue
        hv, k = int(c["linear_num_value_heads"]), int(c["linear_conv_kernel_dim"])
        ch = 2 * int(c["linear_num_key_heads"]) * int(c["linear_key_head_dim"]) + hv * int(c["linear_value_head_dim"])
        out += [
            (f"{pre}.linear_attn.conv1d.weight", rng.standard_normal((ch, k, 1)) / np.sqrt(k)),
            (f"{pre}.linear_attn.A_log", np.log(rng.uniform(1, 16, hv))),
            (f"{pre}.linear_attn.dt_bias", 0.5 * rng.standard_normal(hv)),
            (f"{pre}.linear_attn.norm.weight", 1 + 0.1 * rng.standard_normal(int(c["linear_value_head_dim"]))),
        ]
    return [(key, mx.array(np.asarray(v, np.float32))) for key, v in out]


def write_hadamard_pack(
    folder: str | Path,
    text_config: dict | None = None,
    *,
    blocks: Callable[[str, int], int] = tiny_blocks,
    seed: int = 0,
) -> Path:
    """A pack of random weights for ``text_config`` (default :data:`TINY_TEXT_CONFIG`) written
    in ``folder`` (created); ``blocks(path, width)``: each module's Hadamard block. Returns the folder."""
    from mlx.utils import tree_unflatten
    from mlx_lm.models import prism_hadamard_qwen35 as prism
    from mlx_lm.utils import save_config, save_model

    text_config = dict(TINY_TEXT_CONFIG if text_config is None else text_config)
    rng = np.random.default_rng(validate.seed("seed", seed))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = pack_config(text_config, _manifest(text_config, blocks))
    model = prism.Model(prism.ModelArgs.from_dict(config))
    modules = dict(model.language_model.named_modules())
    updates = []
    for rec in config["modules"]:
        m = modules[rec["path"]]
        rows, width = m.scales.shape[0], m.scales.shape[1] * 128
        w = mx.array(rng.standard_normal((rows, width), dtype=np.float32) / np.float32(np.sqrt(width)))
        if rec["block"]:
            signs = mx.array(np.where(rng.random(width) < 0.5, -1.0, 1.0).astype(np.float32))
            w = prism.hadamard_rotate(w, rec["block"], signs)  # each row R w_i: the stored W R^T
            updates.append((f"{rec['path']}.signs", signs))
        q, s, b = mx.quantize(w.astype(mx.float16), group_size=128, bits=2)
        mx.eval(q, s, b)
        updates += [(f"{rec['path']}.weight", q), (f"{rec['path']}.scales", s), (f"{rec['path']}.biases", b)]
    for i in range(int(text_config["num_hidden_layers"])):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            v = 1.0 + 0.1 * rng.standard_normal(int(text_config["hidden_size"]))
            updates.append((f"model.layers.{i}.{norm}.weight", mx.array(v.astype(np.float32))))
    updates += _layer_constants(text_config, rng)
    model.language_model.update(tree_unflatten(updates))
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return folder


def load_hadamard_pack(folder: str | Path) -> tuple[Any, dict]:
    """The pack in ``folder`` loaded by mlx-lm itself (``mlx_lm.utils.load_model``): ``(model, config)``."""
    from mlx_lm.utils import load_model

    return load_model(Path(folder))
