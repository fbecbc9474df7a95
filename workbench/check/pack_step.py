"""The recurrent layer of a Hadamard pack, checked on the pack's own weights over a run of tokens.

The Gated DeltaNet step part (:mod:`workbench.check.gdn_run`) draws its own constants and
takes the projections' outputs as its inputs; a pack's recurrent layer reads its step
constants (``conv1d.weight``, ``A_log``, ``dt_bias``, ``norm.weight``) AND projects through
five packed linears, each rotating its own input (mlx-lm 0.32.2's ``GatedDeltaNet`` in
``qwen3_5.py``, its Linears made ``HadamardQuantizedLinear`` by ``prism_hadamard_qwen35``):
``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` read the normed hidden state,
``out_proj`` the gated, normed step output. :func:`check_pack_recurrent` judges an
implementation of the whole layer (input RMS norm, the four projections, the step with its
conv and recurrent state fed back token to token, ``out_proj``) over ``tokens`` tokens:

- the float64 truth: each projection's rotation and its weights decoded from the stored
  codes in float64, the step as :func:`workbench.check.gdn_faults.step_block` computes it in
  float64 (the step part's own oracle) from the pack's constants;
- the workbench's float32 reference: each projection through ``WeightMatrix.apply`` on the
  CPU (``mx.hadamard_transform`` then ``mx.quantized_matmul``), the step in float32;
- the faults: each rotated projection's rotation skipped alone (``rotation_skipped_<proj>``:
  ``out_proj``'s among them), and the float16 scales and biases read as bfloat16.

A case is a seed at an input scale; its error is the worst over every token's output, so an
error the state carries forward counts at whichever token it shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.gdn_faults import StepWeights, step_block
from workbench.check.head_cases import HEAD_SCALES
from workbench.check.head_math import rms
from workbench.check.pack_linear import faulty_linear
from workbench.check.pack_verdict import by_case, pack_arguments, pack_report, sequence_output, token_inputs
from workbench.check.report import CheckReport
from workbench.fold.weights import WeightMatrix
from workbench.models.hadamard_pack import HadamardPack, PackError

#: The layer's packed projections (mlx-lm's names), the step's inputs first.
STEP_PROJECTIONS: tuple[str, ...] = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")

#: fault name -> what it does.
PACK_STEP_FAULTS: dict[str, str] = {
    **{f"rotation_skipped_{p}": f"{p}'s input rotation not applied (the others applied)" for p in STEP_PROJECTIONS},
    "scales_bfloat16": "every projection's float16 scales and biases read as bfloat16",
}

#: Tokens a check runs by default: past the conv window (4) several times over, so the
#: state fed back carries each token's error into the next.
DEFAULT_TOKENS = 12


def pack_step_weights(pack: HadamardPack, layer: int) -> StepWeights:
    """The step constants of ``pack``'s recurrent ``layer`` as stored (float32), in the step
    part's layout: ``conv1d.weight`` [C, K, 1] (mlx's Conv1d) becomes ``conv_w`` [1, K, C]."""
    if pack.layer_type(layer) != "linear_attention":
        raise PackError(f"layer: {layer} is a {pack.layer_type(layer)} layer, the step needs a linear_attention one")
    pre = f"model.layers.{layer}.linear_attn"
    conv = pack.tensor(f"{pre}.conv1d.weight")
    if conv.ndim != 3 or conv.shape[2] != 1:
        raise PackError(f"{pre}.conv1d.weight: must be [channels, kernel, 1] (depthwise), got {conv.shape}")
    return StepWeights(
        conv[:, :, 0].T[None],
        pack.tensor(f"{pre}.A_log")[None],
        pack.tensor(f"{pre}.dt_bias")[None],
        pack.tensor(f"{pre}.norm.weight")[None],
        eps=pack.eps,
        k_heads=int(pack.text_config["linear_num_key_heads"]),
    )


def _layer(
    w: StepWeights,
    proj: Callable[[str, np.ndarray], np.ndarray],
    n: np.ndarray,
    dims: tuple[int, int, int],
) -> np.ndarray:
    """The layer over ``n`` [T, S, hidden] (normed) with ``proj(name, x)`` each projection, in ``w``'s dtype."""
    hv, dv, dk = dims
    dt = w.conv_w.dtype
    t_len, s = n.shape[:2]
    conv = np.zeros((s, w.conv_w.shape[1] - 1, w.conv_w.shape[2]), dt)
    state = np.zeros((s, hv, dv, dk), dt)
    outs = []
    for t in range(t_len):
        mixed, z, b, a = (proj(p, n[t]).astype(dt, copy=False) for p in STEP_PROJECTIONS[:4])
        o, conv, state = step_block(w, mixed, z, b, a, conv, state)
        outs.append(proj("out_proj", o))
    return np.stack(outs).astype(dt, copy=False)


def check_pack_recurrent(
    subject: Callable[[Any], Any],
    pack: HadamardPack,
    layer: int,
    *,
    seeds: Iterable[int] = range(10),
    scales: Sequence[float] = HEAD_SCALES,
    tokens: int = DEFAULT_TOKENS,
    tolerance: float | None = None,
    flake_rate: float = 1e-4,
) -> CheckReport:
    """Check ``subject(hidden) -> out`` (``hidden`` float32 numpy [tokens, S, hidden_size], S
    sequences' inputs to the layer before its RMS norm, token by token, each sequence's
    conv and recurrent state starting at zero and fed back by the implementation; ``out``
    [tokens, S, hidden_size], ``out_proj``'s output) on ``pack``'s recurrent ``layer``.
    The S sequences are each seed's draws (uniform in [-1, 1)) times each of ``scales``,
    seed-major."""
    takes = "hidden [tokens, S, hidden] -> out"
    seed_list, scale_list, user, flake_rate = pack_arguments(pack, subject, takes, seeds, scales, tolerance, flake_rate)
    w32 = pack_step_weights(pack, layer)
    tokens = validate.integer("tokens", tokens, minimum=1, maximum=4096)
    c = pack.text_config
    hidden = int(c["hidden_size"])
    dims = (int(c["linear_num_value_heads"]), int(c["linear_value_head_dim"]), int(c["linear_key_head_dim"]))
    pre = f"model.layers.{layer}"
    mats: dict[str, WeightMatrix] = {p: pack.matrix(f"{pre}.linear_attn.{p}") for p in STEP_PROJECTIONS}
    norm = pack.tensor(f"{pre}.input_layernorm.weight")
    x = token_inputs(seed_list, scale_list, tokens, hidden, 5959)  # [T, S, hidden]
    n64 = rms(x.astype(np.float64), norm.astype(np.float64), pack.eps, False)
    with mx.stream(mx.cpu):
        n32 = np.array(mx.fast.rms_norm(mx.array(x), mx.array(norm), pack.eps))
    dense = {p: m.dense(np.float64) for p, m in mats.items()}

    def exact(p: str, v: np.ndarray) -> np.ndarray:
        f = mats[p].fold
        return (f.rotate(v) if f is not None else v) @ dense[p].T

    def reference(p: str, v: np.ndarray) -> np.ndarray:
        with mx.stream(mx.cpu):
            return np.array(mats[p].apply(mx.array(np.asarray(v, np.float32))))

    def faulty(skip: str | None, bf16: bool) -> Callable[[str, np.ndarray], np.ndarray]:
        def proj(p: str, v: np.ndarray) -> np.ndarray:
            if p == skip:
                return faulty_linear(mats[p], np.asarray(v, np.float32), None, False)
            return faulty_linear(mats[p], np.asarray(v, np.float32), mats[p].fold, True) if bf16 else reference(p, v)

        return proj

    truth = _layer(w32.astype(np.float64), exact, n64, dims)
    ref = _layer(w32, reference, n32, dims)
    fault_runs = {f"rotation_skipped_{p}": faulty(p, False) for p, m in mats.items() if m.fold is not None}
    fault_runs["scales_bfloat16"] = faulty(None, True)
    faults = {f: _layer(w32, proj, n32, dims) for f, proj in fault_runs.items()}
    problems: list[str] = []
    out = sequence_output(subject, x, truth.shape, "pack recurrent layer", problems)

    def cases(a: np.ndarray) -> np.ndarray:
        return by_case(a, len(seed_list), len(scale_list))

    base = {"hidden": hidden, "branch": mats["out_proj"].shape[1], "ffn": 0, "dtype": "affine2-g128"}
    base |= {"fold": "per projection", "quant": "affine2-g128"}
    rot = ", ".join(f"{p} block {m.fold.block if m.fold is not None else 0}" for p, m in mats.items())
    checked = [
        f"pack layer {layer}'s recurrent layer over {tokens} tokens, state fed back: each projection its own "
        f"input rotation ({rot}), 2-bit codes, the pack's conv1d, A_log, dt_bias and norm weights; truth in "
        "float64 from the codes"
    ]
    return pack_report(
        name=f"pack recurrent layer (layer {layer})",
        base=base,
        seeds=seed_list,
        scales=scale_list,
        out=cases(out),
        ref=cases(ref),
        truth=cases(truth),
        faults={f: cases(v) for f, v in faults.items()},
        problems=problems,
        user=user,
        flake_rate=flake_rate,
        checked=checked,
    )
