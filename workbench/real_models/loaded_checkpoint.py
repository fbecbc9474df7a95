"""A checkpoint as read: its config and its tensors under Hugging Face names.

:class:`Checkpoint` is what every reader returns and what the rest of the workbench takes:
``.config`` (a ``ModelConfig``, so the refusal rules can be asked) and
``.tail_weights(layer)`` (a ``TailWeights`` carrying that layer). A reader checks its
config against its tensors (:func:`check_tensors_match_config`) before it returns: the
rules and the tail read the config, so a config that is false about the file would answer
for a model that is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.models import refusals
from workbench.models.config import Mixer, ModelConfig
from workbench.real_models.tensor import Tensor
from workbench.tail.weights import TailWeights

__all__ = ["Checkpoint", "check_tensors_match_config", "naming_the_file"]


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
        return (
            f"Checkpoint({c.name!r} from {self.source}: {c.model_type}, {c.num_layers} layers, hidden "
            f"{c.hidden_size}, {len(c.attention_layers())} attention tails, rms eps {c.rms_norm_eps:g}, "
            f"norm weights {self.norm_convention}, {len(self.tensors)} tensors)"
        )

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
            reasons = refusals.layer_refusals(self.config, layer)
            raise ValueError(
                f"layer: {layer} of {self.config.name} carries biases the fused tail does not add "
                f"({', '.join(found)}); "
                f"the rules say {[r.name for r in reasons] or 'nothing: its config does not declare them'}"
            )
        if lc.ffn_kind != "dense":
            raise ValueError(f"layer: {layer} of {self.config.name} has a {lc.ffn_kind} FFN, not three dense matrices")
        p = self.layer_prefix(layer)
        norm = np.asarray(self.tensor(f"{p}.post_attention_layernorm").dense(mx.float32))
        mats = [
            self.tensor(f"{p}.{n}").matrix()
            for n in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        ]
        if self.norm_convention == "zero_centred":
            norm = norm + np.float32(1.0)
        return TailWeights(
            mats[0],
            norm,
            mats[1],
            mats[2],
            mats[3],
            eps=float(self.config.rms_norm_eps),
            config=self.config,
            layer=layer,
            norm_convention=self.norm_convention,
        )


def check_tensors_match_config(
    config: ModelConfig, tensors: Mapping[str, Tensor], layers_key: str = "num_hidden_layers"
) -> None:
    """ValueError when the config says something the tensors contradict, naming both.

    The refusal rules and the tail read the config, so a config that is false about the
    file (an ``o_proj`` whose width is not heads x head_dim, an FFN length the matrices do
    not have, more layers than the file holds) would answer for a model that is not there.
    Checked for every attention layer whose FFN is dense: the norm (``hidden``), ``o_proj``
    (``hidden x heads*head_dim``), the FFN's three matrices (``ffn x hidden``, ``hidden x
    ffn``), where the file has them. ``layers_key``: the file's own name for its layer count
    (a GGUF's ``<arch>.block_count``, config.json's ``num_hidden_layers``), which a count the
    tensors contradict is refused by.
    """
    h = int(config.hidden_size)
    for i in config.attention_layers():
        lc = config.layer(i)
        p = f"model.layers.{i}"
        want = {f"{p}.self_attn.o_proj": (h, lc.num_q_heads * lc.head_dim), f"{p}.post_attention_layernorm": (h,)}
        if lc.ffn_kind == "dense":
            want.update(
                {
                    f"{p}.mlp.gate_proj": (lc.ffn_dim, h),
                    f"{p}.mlp.up_proj": (lc.ffn_dim, h),
                    f"{p}.mlp.down_proj": (h, lc.ffn_dim),
                }
            )
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
        raise ValueError(
            f"source: {layers_key} must be at least {max(present) + 1} (the file holds tensors for layers "
            f"0..{max(present)}), got {config.num_layers}"
        )
    missing = [i for i in config.attention_layers() if i not in present]
    if present and missing:
        raise ValueError(
            f"source: {layers_key} is {config.num_layers}, but the file holds no tensors for layer(s) {missing[:5]}"
        )


def naming_the_file(e: Exception, what: str) -> str:
    """``e``'s message with the file it is about: ``source: <what>: <the rest>``."""
    msg = str(e)
    return f"source: {what}: {msg[len('source: ') :] if msg.startswith('source: ') else msg}"
