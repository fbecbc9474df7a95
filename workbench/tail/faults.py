"""The tail's fault vocabulary: one registry of deliberately wrong tails, named once.

Three users once kept three lists (the check's fault models, the sweeps' mutations, the
three-way comparison's faulty fused variants), with two names for one bug (``skip_fold`` and
``rotation_skipped``) and two implementations of another. Here each fault is named once, said
once (:data:`TAIL_FAULTS`) and implemented once, as what it changes in a :class:`TailVariant`:
the tail's arguments plus the switches of its arithmetic (how often the fold is applied, the
mean square's length, eps inside or outside the root, the normed vector's rounding, the
accumulation's dtype). A tail engine (the check's numpy float32 tail, the sweeps' and the
three-way's MLX graph) runs a variant; each names the faults it can run (``allowed`` of
:func:`apply_fault`) and refuses the others, so no engine silently drops a fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench import validate


@dataclass(frozen=True)
class TailVariant:
    """The float32 tail's inputs and the switches of its arithmetic, as one fault leaves them.

    The arrays are whatever the engine holds (numpy, MLX; ``None`` for weights an engine keeps
    elsewhere, which the faults that change weights refuse). ``norm_length``: the count the mean
    square divides by (``None``: the vector's own length); ``rotations``: how often wo's fold is
    applied (1 is correct); ``normed_dtype``: the dtype the normed vector is rounded to before the
    FFN (``None``: kept float32); ``accumulate``: the dtype every matrix-vector product sums in.
    """

    wo: Any
    gate: Any
    up: Any
    down: Any
    ffn_norm: Any
    eps: float
    branch: Any
    residual: Any
    rotations: int = 1
    norm_length: int | None = None
    eps_outside_root: bool = False
    normed_dtype: str | None = None
    accumulate: str = "float32"
    #: ``(group_size, bias of row 0 group 0)`` of a quantized wo (dequantized in ``wo``), else None
    wo_group: tuple[int, float] | None = None


@dataclass(frozen=True)
class TailFault:
    """One known bug: its ``name``, what it does (``doc``), which cases it exists for
    (``needs``: ``None``, ``"fold"`` or ``"quantized wo"``), what it changes (``changes``: the
    :class:`TailVariant` fields it sets) and how (``apply``)."""

    name: str
    doc: str
    needs: str | None
    changes: frozenset[str]
    apply: Callable[[TailVariant], TailVariant]


def _replace(**fields: Any) -> Callable[[TailVariant], TailVariant]:
    return lambda v: dataclasses.replace(v, **fields)


def _sign_flipped(v: TailVariant) -> TailVariant:
    # The branch's first element negated; with a per-case fold (D applied first) that is exactly
    # one sign of D flipped.
    branch = v.branch.copy() if isinstance(v.branch, np.ndarray) else v.branch
    if isinstance(branch, np.ndarray):
        branch[..., 0] = -branch[..., 0]
    else:  # an MLX array: no in-place write
        branch = branch.at[..., 0].multiply(-1)
    return dataclasses.replace(v, branch=branch)


def _norm_wrong_length(v: TailVariant) -> TailVariant:
    h, b = v.residual.shape[-1], v.branch.shape[-1]
    return dataclasses.replace(v, norm_length=b if b != h else h + 1)


def _dropped_residual(v: TailVariant) -> TailVariant:
    return dataclasses.replace(v, residual=np.zeros_like(v.residual))  # zeros, even where it was NaN


def _wrong_eps(v: TailVariant) -> TailVariant:
    return dataclasses.replace(v, eps=10.0 * v.eps)


def _gate_up_swapped(v: TailVariant) -> TailVariant:
    return dataclasses.replace(v, gate=v.up, up=v.gate)


def _transposed_weight(v: TailVariant) -> TailVariant:
    d = v.down  # down's [hidden, ffn] bytes read as [ffn, hidden], i.e. that array transposed
    return dataclasses.replace(v, down=np.swapaxes(d.reshape(*d.shape[:-2], d.shape[-1], d.shape[-2]), -1, -2))


def _group_scale_wrong(v: TailVariant) -> TailVariant:
    # The dequantized value of group 0, row 0 at twice its scale: 2 s q + b = 2 v - b.
    if v.wo_group is None:
        raise ValueError("group_scale_wrong: needs a quantized wo's group size and bias (TailVariant.wo_group)")
    g, bias = v.wo_group
    wo = np.array(v.wo, dtype=np.float32)
    bias = np.asarray(bias, dtype=np.float32)
    wo[..., 0, :g] = 2 * wo[..., 0, :g] - (bias[..., None] if bias.ndim else bias)
    return dataclasses.replace(v, wo=wo)


def _fault(name: str, doc: str, changes: Iterable[str], apply: Callable, needs: str | None = None) -> TailFault:
    return TailFault(name, doc, needs, frozenset(changes), apply)


#: fault name -> the fault (its doc for tables and ``--help``); the order tables list them in.
TAIL_FAULTS: dict[str, TailFault] = {
    f.name: f
    for f in (
        _fault(
            "eps_outside_root",
            "the norm divides by sqrt(mean x^2) + eps instead of sqrt(mean x^2 + eps)",
            ("eps_outside_root",),
            _replace(eps_outside_root=True),
        ),
        _fault(
            "wrong_eps", "eps ten times too large (1e-5 for 1e-6: Llama's default for Qwen's)", ("eps",), _wrong_eps
        ),
        _fault(
            "norm_wrong_length",
            "RMS norm's mean over the branch length instead of hidden",
            ("norm_length",),
            _norm_wrong_length,
        ),
        _fault(
            "dropped_residual",
            "the residual is never read (zero): both adds lose it",
            ("residual",),
            _dropped_residual,
        ),
        _fault("gate_up_swapped", "silu applied to up x instead of gate x", ("gate", "up"), _gate_up_swapped),
        _fault(
            "transposed_weight",
            "down read with the wrong stride (its [hidden, ffn] bytes as [ffn, hidden], transposed)",
            ("down",),
            _transposed_weight,
        ),
        _fault(
            "sign_flipped",
            "one sign of the branch flipped (with a fold: one sign of D)",
            ("branch",),
            _sign_flipped,
        ),
        _fault(
            "rotation_skipped",
            "wo's fold rotation not applied to the branch (only folded cases)",
            ("rotations",),
            _replace(rotations=0),
            "fold",
        ),
        _fault(
            "rotation_twice",
            "wo's fold rotation applied twice (folded cases only)",
            ("rotations",),
            _replace(rotations=2),
            "fold",
        ),
        _fault(
            "group_scale_wrong",
            "one group's scale doubled (wo, row 0, group 0; quantized cases only)",
            ("wo",),
            _group_scale_wrong,
            "quantized wo",
        ),
        _fault(
            "float16_accumulation",
            "every matrix-vector product summed in float16",
            ("accumulate",),
            _replace(accumulate="float16"),
        ),
        _fault(
            "bf16_normed",
            "the normed vector rounded to bfloat16 before the FFN (seen 1.5e-2 off the truth)",
            ("normed_dtype",),
            _replace(normed_dtype="bfloat16"),
        ),
    )
}


def fault_docs(names: Iterable[str]) -> dict[str, str]:
    """name -> what it does, for the faults ``names`` (a selection's table)."""
    return {n: TAIL_FAULTS[n].doc for n in names}


def apply_fault(fault: str | None, variant: TailVariant, *, allowed: Iterable[str] | None = None) -> TailVariant:
    """``variant`` with ``fault`` (a name of :data:`TAIL_FAULTS`, or ``None``: unchanged).

    ``allowed``: the names the calling engine can run (a ``ValueError`` names the others)."""
    if fault is None:
        return variant
    names = tuple(TAIL_FAULTS) if allowed is None else tuple(allowed)
    validate.one_of("fault", fault, names)
    return TAIL_FAULTS[fault].apply(variant)
