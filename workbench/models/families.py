"""Reading a Hugging Face ``config.json``, family by family, into a `ModelConfig`.

:func:`from_hf_config` reads a config (a path, a folder holding one, or a dict) and hands it to
its family's reader in :data:`FAMILIES` (keyed by ``model_type``), which answers for every layer
what the refusal rules ask (``workbench.models.config``); a missing or ill-typed key is a
ValueError naming the key and the family. Layer indices are 0-based. Where a config could be
misread: **multi-head attention is GQA** with groups of 1 (OLMo 2 is `Mixer.ATTENTION`; only a
mixer that is not softmax attention fails frink-models' ``!AttnShape::Gqa``);
**``post_attention_layernorm`` is the norm BEFORE the FFN** in Llama/Qwen/Mistral/Granite/Jamba/
gpt-oss code, and ``post_attn_norm`` (a norm on the attention output: Gemma 2/3, beside a
``pre_feedforward_layernorm``, and OLMo 2) is set from the family, never from a weight name;
**the attention output gate is not a refusal** (Qwen3.5/3.6, Qwen3-Next gate before ``wo``, and
the tail starts at ``wo`` of the gated branch); **a residual multiplier of exactly 1 is no
residual scale**; activations are named for the GLU they form (``"swiglu"``, ``"geglu"``,
Nemotron-H's ungated ``"relu2"``, gpt-oss's clamped ``"swiglu_oai"``, which is not the
``silu(gate) * up`` the fused kernel computes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.models.config import LayerConfig, Mixer, ModelConfig
from workbench.models.config_reader import ConfigReader, common_geometry, glu_act, read_config, residual_scale, rms_eps
from workbench.models.head_fields import head_fields

__all__ = ["FAMILIES", "from_hf_config"]


def from_hf_config(path_or_dict: str | Path | Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
    """Read a Hugging Face ``config.json`` (a path, a folder holding one, or a dict).

    Raises ValueError for an unknown ``model_type`` (naming the known families) and
    for a missing or ill-typed key the family needs (naming the key and the family).
    Keys starting with ``_`` are ours, not the model's: ``_source`` becomes
    `ModelConfig.source`. The family is read by ``FAMILIES[model_type]``.
    """
    raw = read_config(path_or_dict)
    if isinstance(path_or_dict, Mapping):
        return _from_raw(raw, name)
    try:
        return _from_raw(raw, name)
    except ValueError as err:  # what is wrong inside a file is said with the file's name
        where = Path(path_or_dict)
        raise ValueError(f"{err} (in {where / 'config.json' if where.is_dir() else where})") from None


def _from_raw(raw: dict[str, Any], name: str | None) -> ModelConfig:
    """``from_hf_config`` of a config already read: the family's reader, named."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(
            f"model_type: missing or not a string ({model_type!r}); known families: {', '.join(sorted(FAMILIES))}"
        )
    family = FAMILIES.get(model_type)
    if family is None:
        raise ValueError(f"model_type: unknown family {model_type!r}; known: {', '.join(sorted(FAMILIES))}")
    source = raw.get("_source", "")
    if not isinstance(source, str):
        source = json.dumps(source)
    if name is None:
        name = raw.get("_name") or raw.get("_name_or_path") or model_type
    elif not isinstance(name, str):
        raise ValueError(f"name: must be a string, got {validate.describe(name)}")
    return family(ConfigReader(raw, model_type), name=str(name), source=source)


# -- families --------------------------------------------------------------------------


def _dense_transformer(
    post_attn_norm: bool,
    pre_norm: str = "rms",
    act_keys=("hidden_act",),
    o_bias_key: str | None = None,
    ffn_bias_key: str | None = None,
):
    """Llama-shaped families: every layer GQA attention + a dense GLU FFN.

    ``ffn_bias_key``: the key that puts biases on gate/up/down (Llama's and Granite's
    ``mlp_bias``), read so that the FFN_BIAS rule sees them.
    """

    def build(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
        r = r.nested("text_config")
        hidden, n, q, kv, hd, eps = common_geometry(r)
        ffn = r.positive("intermediate_size")
        act = glu_act(r, act_keys)
        o_bias = r.opt(o_bias_key, bool, False) if o_bias_key else False
        ffn_bias = r.opt(ffn_bias_key, bool, False) if ffn_bias_key else False
        layers = tuple(
            LayerConfig(
                index=i,
                mixer=Mixer.ATTENTION,
                num_q_heads=q,
                num_kv_heads=kv,
                head_dim=hd,
                ffn_dim=ffn,
                ffn_kind="dense",
                ffn_act=act,
                o_bias=o_bias,
                ffn_bias=ffn_bias,
                post_attn_norm=post_attn_norm,
                pre_norm=pre_norm,
                **head_fields(r, r.family, hd, i),
            )
            for i in range(n)
        )
        return ModelConfig(
            name=name,
            model_type=r.family,
            hidden_size=hidden,
            num_layers=n,
            rms_norm_eps=eps,
            layers=layers,
            residual_scale=residual_scale(r),
            source=source,
            raw=r.raw,
        )

    return build


def _qwen_hybrid(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
    """Qwen3.5 / Qwen3.6 (Bonsai) / Qwen3-Next: Gated DeltaNet layers between full attention.

    The layer pattern is ``layer_types`` when given, else every
    ``full_attention_interval``-th layer (``(i + 1) % interval == 0``), which is how
    transformers fills ``layer_types`` for these families. The attention output is
    gated before wo (``attn_output_gate``; Qwen3-Next always gates): recorded, not a
    refusal. FFN: dense SwiGLU, or routed experts where the config has them.
    """
    r = r.nested("text_config")
    hidden, n, q, kv, hd, eps = common_geometry(r)
    if r.has("layer_types"):
        types = r.str_list("layer_types", n, ("full_attention", "linear_attention"))
    else:
        interval = r.positive("full_attention_interval")
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    act = glu_act(r)
    gate = r.opt("attn_output_gate", bool, True)
    # attention_bias puts a bias on q/k/v AND o_proj in these families (transformers'
    # Qwen3Next/Qwen3_5 attention, mlx-lm's too): the o_proj bias is O_BIAS.
    o_bias = r.opt("attention_bias", bool, False)
    num_experts = r.count("num_experts", 0)
    mlp_only = set(r.int_list("mlp_only_layers", n))
    step = r.opt("decoder_sparse_step", int, 1)
    if step < 0:
        raise ValueError(f"decoder_sparse_step: must be >= 0 in a {r.family} config (0: no expert layers), got {step}")
    layers = []
    for i, t in enumerate(types):
        moe = num_experts > 0 and i not in mlp_only and step > 0 and (i + 1) % step == 0
        ffn = r.positive("moe_intermediate_size") if moe else r.positive("intermediate_size")
        attn = t == "full_attention"
        layers.append(
            LayerConfig(
                index=i,
                mixer=Mixer.ATTENTION if attn else Mixer.LINEAR_ATTENTION,
                num_q_heads=q if attn else 0,
                num_kv_heads=kv if attn else 0,
                head_dim=hd if attn else 0,
                ffn_dim=ffn,
                ffn_kind="experts" if moe else "dense",
                ffn_act=act,
                attn_output_gate=gate and attn,
                num_experts=num_experts if moe else 0,
                o_bias=o_bias and attn,
                **(head_fields(r, r.family, hd, i) if attn else {}),
            )
        )
    return ModelConfig(
        name=name,
        model_type=r.raw["model_type"],
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        layers=tuple(layers),
        source=source,
        raw=r.raw,
    )


def _granite_hybrid(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
    """Granite-4.0-H (``granitemoehybrid``): Mamba-2 layers with a few attention layers.

    Every layer has the dense SwiGLU ``shared_mlp`` (``shared_intermediate_size``); with
    ``num_local_experts > 0`` routed experts sit beside it (then no dense-only FFN).
    The pattern is ``layer_types`` (or ``layers_block_type``), entries "attention" or
    "mamba". ``residual_multiplier`` scales both residual branches: RESIDUAL_SCALE.
    """
    hidden, n, q, kv, hd, eps = common_geometry(r)
    key = "layers_block_type" if r.has("layers_block_type") and not r.has("layer_types") else "layer_types"
    if not r.has(key):
        raise ValueError(f"layer_types: missing (also looked for layers_block_type), and a {r.family} config needs it")
    types = r.str_list(key, n, ("attention", "mamba"))
    ffn = r.positive("shared_intermediate_size")
    experts = r.count("num_local_experts", 0)
    act = glu_act(r)
    layers = tuple(
        LayerConfig(
            index=i,
            mixer=Mixer.ATTENTION if t == "attention" else Mixer.MAMBA2,
            num_q_heads=q if t == "attention" else 0,
            num_kv_heads=kv if t == "attention" else 0,
            head_dim=hd if t == "attention" else 0,
            ffn_dim=ffn,
            ffn_kind="experts" if experts > 0 else "dense",
            ffn_act=act,
            num_experts=experts,
            o_bias=t == "attention" and r.opt("attention_bias", bool, False),
            **(head_fields(r, r.family, hd, i) if t == "attention" else {}),
        )
        for i, t in enumerate(types)
    )
    return ModelConfig(
        name=name,
        model_type=r.family,
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        layers=layers,
        residual_scale=residual_scale(r),
        source=source,
        raw=r.raw,
    )


def _falcon_h1(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
    """Falcon-H1: every layer runs attention AND a Mamba-2 mixer on the same normed input,
    summed into the residual: PARALLEL_SSM on every layer. An ``attention_out_multiplier``
    other than 1 scales wo's output (O_SCALE)."""
    hidden, n, q, kv, hd, eps = common_geometry(r)
    ffn = r.positive("intermediate_size")
    act = glu_act(r, default="silu")  # FalconH1Config's default hidden_act
    out_mult = r.opt("attention_out_multiplier", float, 1.0)
    layers = tuple(
        LayerConfig(
            index=i,
            mixer=Mixer.ATTENTION,
            num_q_heads=q,
            num_kv_heads=kv,
            head_dim=hd,
            ffn_dim=ffn,
            ffn_kind="dense",
            ffn_act=act,
            parallel_ssm=True,
            o_scale=out_mult != 1.0,
            o_bias=r.opt("attention_bias", bool, False),
            **head_fields(r, r.family, hd, i),
        )
        for i in range(n)
    )
    return ModelConfig(
        name=name,
        model_type=r.family,
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        layers=layers,
        source=source,
        raw=r.raw,
    )


def _nemotron_h(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
    """Nemotron-H: ``hybrid_override_pattern`` gives one mixer per block.

    ``M`` Mamba-2, ``*`` attention, ``-`` MLP (squared ReLU, ``intermediate_size``),
    ``E`` routed-expert MLP. An attention block holds attention and nothing else, so its
    tail has no FFN to fuse: NO_FFN.
    """
    hidden = r.positive("hidden_size")
    n = r.num_layers()
    q = r.positive("num_attention_heads")
    kv = r.opt("num_key_value_heads", int, q)
    eps = rms_eps(r)
    hd = r.head_dim(q, hidden, ("head_dim", "attention_head_dim"))
    pattern = r.req("hybrid_override_pattern", str)
    if len(pattern) != n:
        raise ValueError(
            f"hybrid_override_pattern: must have num_hidden_layers={n} characters in a "
            f"{r.family} config, got {len(pattern)}"
        )
    act = glu_act(r, ("mlp_hidden_act", "hidden_act"), default="relu2")
    layers = []
    for i, c in enumerate(pattern):
        if c == "*":
            layers.append(
                LayerConfig(
                    index=i,
                    mixer=Mixer.ATTENTION,
                    num_q_heads=q,
                    num_kv_heads=kv,
                    head_dim=hd,
                    o_bias=r.opt("attention_bias", bool, False),
                    **head_fields(r, r.family, hd, i),
                )
            )
        elif c == "M":
            layers.append(LayerConfig(index=i, mixer=Mixer.MAMBA2))
        elif c == "-":
            layers.append(
                LayerConfig(
                    index=i,
                    mixer=Mixer.MLP_ONLY,
                    ffn_dim=r.positive("intermediate_size"),
                    ffn_kind="dense",
                    ffn_act=act,
                )
            )
        elif c == "E":
            layers.append(
                LayerConfig(
                    index=i,
                    mixer=Mixer.MLP_ONLY,
                    ffn_dim=r.positive("moe_intermediate_size"),
                    ffn_kind="experts",
                    ffn_act=act,
                    num_experts=r.positive("n_routed_experts"),
                )
            )
        else:
            raise ValueError(
                f"hybrid_override_pattern[{i}]: must be one of 'M', '*', '-', 'E' in a {r.family} config, got {c!r}"
            )
    return ModelConfig(
        name=name,
        model_type=r.family,
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        layers=tuple(layers),
        source=source,
        raw=r.raw,
    )


def _jamba(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
    """Jamba: attention where ``i % attn_layer_period == attn_layer_offset`` (else Mamba),
    routed experts where ``i % expert_layer_period == expert_layer_offset`` (else a dense
    SwiGLU MLP). In Jamba-v0.1 (period 8 offset 4; experts period 2 offset 1) the
    attention layers 4, 12, 20, 28 are even, so they carry dense FFNs."""
    hidden, n, q, kv, hd, eps = common_geometry(r)
    if r.has("layers_block_type"):
        kinds = r.str_list("layers_block_type", n, ("attention", "mamba"))
    else:
        period = r.positive("attn_layer_period")
        offset = r.offset("attn_layer_offset", period, "attn_layer_period")
        kinds = ["attention" if i % period == offset else "mamba" for i in range(n)]
    experts = r.count("num_experts", 1)
    e_period = r.positive("expert_layer_period")
    e_offset = r.offset("expert_layer_offset", e_period, "expert_layer_period")
    ffn = r.positive("intermediate_size")
    act = glu_act(r)
    layers = []
    for i, k in enumerate(kinds):
        moe = experts > 1 and i % e_period == e_offset
        attn = k == "attention"
        layers.append(
            LayerConfig(
                index=i,
                mixer=Mixer.ATTENTION if attn else Mixer.MAMBA2,
                num_q_heads=q if attn else 0,
                num_kv_heads=kv if attn else 0,
                head_dim=hd if attn else 0,
                ffn_dim=ffn,
                ffn_kind="experts" if moe else "dense",
                ffn_act=act,
                num_experts=experts if moe else 0,
                **(head_fields(r, r.family, hd, i) if attn else {}),
            )
        )
    return ModelConfig(
        name=name,
        model_type=r.family,
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        layers=tuple(layers),
        source=source,
        raw=r.raw,
    )


def _gpt_oss(r: ConfigReader, *, name: str, source: str) -> ModelConfig:
    """gpt-oss: every layer attention (sliding and full alternate; both are GQA), a bias on
    every projection including wo (``attention_bias``), routed experts with the clamped
    ``swiglu_oai`` activation, and frink-models' own gpt-oss flag."""
    hidden, n, q, kv, hd, eps = common_geometry(r)
    ffn = r.positive("intermediate_size")
    experts = r.positive("num_local_experts")
    o_bias = r.opt("attention_bias", bool, True)
    layers = tuple(
        LayerConfig(
            index=i,
            mixer=Mixer.ATTENTION,
            num_q_heads=q,
            num_kv_heads=kv,
            head_dim=hd,
            ffn_dim=ffn,
            ffn_kind="experts",
            ffn_act="swiglu_oai",
            o_bias=o_bias,
            num_experts=experts,
            **head_fields(r, r.family, hd, i),
        )
        for i in range(n)
    )
    return ModelConfig(
        name=name,
        model_type=r.family,
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        layers=layers,
        gpt_oss=True,
        source=source,
        raw=r.raw,
    )


# model_type -> builder. Qwen2/3 and Llama put attention_bias on q/k/v (Qwen2: only
# those); Llama's and Qwen3's attention_bias also biases o_proj, so it is read there.
FAMILIES = {
    "llama": _dense_transformer(False, o_bias_key="attention_bias", ffn_bias_key="mlp_bias"),
    "mistral": _dense_transformer(False),
    "qwen2": _dense_transformer(False),
    "qwen3": _dense_transformer(False, o_bias_key="attention_bias"),
    "granite": _dense_transformer(False, o_bias_key="attention_bias", ffn_bias_key="mlp_bias"),
    "gemma2": _dense_transformer(True, act_keys=("hidden_activation", "hidden_act")),
    "gemma3_text": _dense_transformer(True, act_keys=("hidden_activation", "hidden_act")),
    "gemma3": _dense_transformer(True, act_keys=("hidden_activation", "hidden_act")),
    # OLMo 2 normalises the attention OUTPUT and has no norm before Q/K/V.
    "olmo2": _dense_transformer(True, pre_norm="none", o_bias_key="attention_bias"),
    "qwen3_5": _qwen_hybrid,
    "qwen3_5_text": _qwen_hybrid,
    "qwen3_5_moe": _qwen_hybrid,
    "qwen3_next": _qwen_hybrid,
    # PrismML's Bonsai packs declare their own model_type over the unchanged qwen3_5
    # architecture (base_model_type qwen3_5, text model under text_config).
    "prism_hadamard_qwen35": _qwen_hybrid,
    "granitemoehybrid": _granite_hybrid,
    "falcon_h1": _falcon_h1,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "gpt_oss": _gpt_oss,
}
