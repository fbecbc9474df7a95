"""The parts of a hybrid layer the check judges, each the same unit: its float64 oracle, the
workbench's float32 reference, its fault models, its input axes and its check.

``"tail"`` is the attention tail (``workbench.check.run``: one case a call, over input scales,
shapes, dtypes, folds and quantized formats); ``"gdn"`` is the Gated DeltaNet recurrent step
(``workbench.check.gdn_run``: runs of tokens with the conv and recurrent states fed back, over
input scale, gate regime, state magnitude and head ratio, judged at each horizon); ``"head"``
is the attention head (``workbench.check.head_run``: one case a seed, over the head's spec,
the hidden state's scale and the token's position). A part's
fields name where each piece lives, so a table, the command's ``--part`` and ``--help`` read
one registry; both parts' checks share the verdict (``workbench.check.verdict``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench import validate


@dataclass(frozen=True)
class Part:
    """One part of a layer as the check takes it: ``oracle`` (float64, from the formulas),
    ``reference`` (the workbench's float32 path), ``faults`` (name -> what it does), ``axes``
    (a check's input axes: parameter -> what it sweeps), ``check`` (subject -> report), and
    ``subject`` (what a callable is handed and returns)."""

    name: str
    what: str
    oracle: Callable[..., Any]
    reference: Callable[..., Any]
    faults: Mapping[str, str]
    axes: Mapping[str, str]
    check: Callable[..., Any]
    subject: str


def _tail() -> Part:
    from workbench.check.faults import FAULTS
    from workbench.check.run import check_kernel
    from workbench.tail.paths import fused_tail, host_tail

    return Part(
        "tail",
        "the attention tail: wo, the residual add, the FFN norm, gate/up, silu, down, the second add",
        host_tail,
        fused_tail,
        FAULTS,
        {
            "scales": "input scale of the branch and the residual",
            "shapes": "(hidden, branch, ffn)",
            "dtypes": "the weights' stored dtype",
            "folds": "a block-Hadamard fold on wo's input",
            "quantize": "wo's quantized format",
        },
        check_kernel,
        "StoredCase -> output [hidden] (a callable), or a kernels folder, a source, a dump",
    )


def _gdn() -> Part:
    from workbench.check.gdn_cases import GATES
    from workbench.check.gdn_faults import GDN_FAULTS
    from workbench.check.gdn_run import check_step
    from workbench.decode.layers import recurrent_step
    from workbench.kernels.gdn_step import recurrent_step_exact

    return Part(
        "gdn",
        "the Gated DeltaNet recurrent step: conv window, silu, q/k L2 norms, gates, the delta rule, "
        "the per-head RMS norm and the z gate; conv and recurrent state in and out",
        recurrent_step_exact,
        recurrent_step,
        GDN_FAULTS,
        {
            "scales": "input scale of the conv's inputs and conv state (the L2 norms' eps shows when small)",
            "gates": f"gate regime, one of {tuple(GATES)}",
            "state_scales": "the initial recurrent state's magnitude",
            "geometries": "(Hk, Hv, Dk, Dv, K): the head ratio Hv/Hk shows a wrong key-head mapping",
            "tokens": "tokens a run, both states fed back; horizons: where the verdict is given",
        },
        check_step,
        "StepInputs -> (out, conv_state, state) (a callable), or a kernels folder, a source",
    )


def _head() -> Part:
    from workbench.check.head_cases import DEFAULT_POSITIONS, HEAD_SCALES
    from workbench.check.head_math import HEAD_FAULTS, head_exact
    from workbench.check.head_mlx import head_reference
    from workbench.check.head_run import check_head
    from workbench.check.head_spec import HEAD_SHAPES

    return Part(
        "head",
        "the attention head: the input RMS norm, Q/K/V (one shared fold, biases), and as the model has it "
        "the per-head output gate split from q_proj, QK-norm and partial RoPE at a position",
        head_exact,
        head_reference,
        HEAD_FAULTS,
        {
            "specs": f"the head's shape and fields (HeadSpec, or one of {tuple(HEAD_SHAPES)})",
            "scales": f"the hidden state's scale (every RMS norm's eps shows when small; default {HEAD_SCALES})",
            "positions": f"the token's position, for RoPE (the identity at 0; default {DEFAULT_POSITIONS})",
        },
        check_head,
        "HeadInputs -> (q, k, v[, gate]) (a callable), or a kernels folder (head_qkv.body), a source",
    )


_MAKERS: dict[str, Callable[[], Part]] = {"tail": _tail, "gdn": _gdn, "head": _head}

#: The parts' names, the default first.
PART_NAMES: tuple[str, ...] = tuple(_MAKERS)


def part(name: str) -> Part:
    """The part called ``name`` (one of :data:`PART_NAMES`), or a ValueError naming them."""
    validate.one_of("part", name, PART_NAMES)
    return _MAKERS[name]()
