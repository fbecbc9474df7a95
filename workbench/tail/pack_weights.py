"""A Hadamard pack's layer as the tail's weights: :func:`pack_tail_weights`.

A pack (``workbench.models.hadamard_pack``) stores each linear as 2-bit codes with its own
input rotation; the tail's truth (``host_tail``) and graph reference (``tail_mx``) apply the
rotation of every matrix that carries one, so the pack's matrices go in as they are stored.
The layer is handed to the refusal rules as a plain layer (``config`` None): the rules are
frink-models' over a model's structure, and what the pack's storage adds is
``hadamard_pack.pack_refusals``'.
"""

from __future__ import annotations

from workbench import validate
from workbench.models.hadamard_pack import HadamardPack
from workbench.tail.weights import TailWeights


def pack_tail_weights(pack: HadamardPack, layer: int) -> TailWeights:
    """Layer ``layer``'s tail read from ``pack``: its wo (``o_proj``, or a recurrent layer's
    ``out_proj``), ``post_attention_layernorm`` and MLP, as stored, with the pack's eps."""
    if not isinstance(pack, HadamardPack):
        raise ValueError(f"pack: must be a HadamardPack (read_pack), got {validate.describe(pack)}")
    mats = pack.tail_matrices(layer)
    return TailWeights(mats["wo"], pack.ffn_norm(layer), mats["gate"], mats["up"], mats["down"], eps=pack.eps)
