"""real_models.decoding.first_departure: where teacher forcing first leaves a reference, in at most two passes;
first_departures: the same count for several weight sets, their prompt passes side by side;
greedy_captured and greedy_beside: greedy's tokens, with each prompt pass captured."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_checkpoint import tiny_llama
from workbench.real_models.checkpoint import load_checkpoint
from workbench.real_models.decoding import (
    first_departure,
    first_departures,
    forced_choices,
    greedy,
    greedy_beside,
    greedy_captured,
)
from workbench.real_models.fused_layers import fused_tails

PROMPT = [3, 17, 42, 99, 5]


def _oracle(model, prompt, tokens) -> int:
    """The same count from ONE pass over the whole sequence (forced_choices)."""
    chosen = forced_choices(model, list(prompt) + list(tokens), len(prompt))
    differs = np.nonzero(chosen != np.asarray(tokens))[0]
    return int(differs[0]) if differs.size else len(tokens)


def test_it_counts_as_one_pass_over_the_sequence_does():
    model = tiny_llama(5)
    ref = list(greedy(model, PROMPT, 6).tokens)
    vocab = 128
    cases = [ref, [(ref[0] + 1) % vocab] + ref[1:], ref[:3] + [(ref[3] + 1) % vocab] + ref[4:], ref[:1]]
    for tokens in cases:
        assert first_departure(model, PROMPT, tokens) == _oracle(model, PROMPT, tokens)
    assert first_departure(model, PROMPT, ref) == 6 and first_departure(model, PROMPT, cases[1]) == 0
    assert first_departure(model, PROMPT, cases[2]) == 3


@pytest.mark.parametrize(
    "prompt,tokens,match",
    [
        ([], [1], "prompt: must hold at least one"),
        ([1], [], "tokens: must hold at least one"),
        ([1], [128], "tokens"),
        ([-1], [2], "prompt"),
    ],
)
def test_bad_arguments_are_named(prompt, tokens, match):
    with pytest.raises(ValueError, match=match):
        first_departure(tiny_llama(1), prompt, tokens)


def test_first_departures_count_each_set_as_first_departure_does_alone():
    """Each set's prompt pass on a stream of its own, evaluated together: every count is
    the one first_departure makes with that set swapped in on its own (the model's own
    layers, and the fused tail in every layer), whichever step it leaves at."""
    model = tiny_llama(5)
    layers = list(model.layers)
    ckpt = load_checkpoint(model)
    sets = [[None] * len(layers), [ckpt.tail_weights(i) for i in range(len(layers))]]
    ref = list(greedy(model, PROMPT, 6).tokens)
    for tokens in (ref, [(ref[0] + 1) % 128] + ref[1:], ref[:3] + [(ref[3] + 1) % 128] + ref[4:]):
        alone = []
        for ws in sets:
            with fused_tails(model, ws):
                alone.append(first_departure(model, PROMPT, tokens))
        assert first_departures(model, PROMPT, tokens, sets) == alone
    assert first_departures(model, PROMPT, ref, sets)[0] == 6
    assert all(a is b for a, b in zip(model.layers, layers))  # the model's own layers are back
    with pytest.raises(ValueError, match=r"^weight_sets: must hold at least one"):
        first_departures(model, PROMPT, ref, [])


def test_greedy_captured_is_greedy_and_captures_the_prompts_pass():
    """The tokens and margins are greedy's, and the captures those of a pass over the
    prompt alone, bit for bit (the pass through the cache is the model's own arithmetic)."""
    from workbench.real_models.capture import capture_layers

    model = tiny_llama(3)
    gen, caps = greedy_captured(model, PROMPT, 4)
    assert gen == greedy(model, PROMPT, 4)
    alone = capture_layers(model, PROMPT)
    assert [c.layer for c in caps] == [0, 1] and caps[0].residual.shape == (len(PROMPT), 64)
    for a, b in zip(caps, alone):
        assert np.array_equal(a.residual, b.residual) and np.array_equal(a.output, b.output)
        assert np.array_equal(a.branch, b.branch)
    assert not any(type(blk).__name__ == "_BlockTap" for blk in model.layers)  # the taps are gone
    with pytest.raises(ValueError, match=r"^n: must be an integer >= 1"):
        greedy_captured(model, PROMPT, 0)


def test_greedy_beside_decodes_as_greedy_does_with_each_layer_set_alone():
    """Both decodings side by side, each step of both evaluated together: the reference is
    greedy's with the model's own layers, the variant greedy's inside fused_tails, and the
    captures those greedy_captured makes for each, bit for bit."""
    model = tiny_llama(4)
    layers = list(model.layers)
    ckpt = load_checkpoint(model)
    fused = [ckpt.tail_weights(i) for i in range(len(layers))]
    ref, var, ref_caps, var_caps = greedy_beside(model, PROMPT, 5, fused, capture=True)
    alone_ref, alone_ref_caps = greedy_captured(model, PROMPT, 5)
    with fused_tails(model, fused):
        alone_var, alone_var_caps = greedy_captured(model, PROMPT, 5)
    assert ref == alone_ref and var == alone_var
    for got, want in ((ref_caps, alone_ref_caps), (var_caps, alone_var_caps)):
        assert [c.layer for c in got] == [0, 1]
        for a, b in zip(got, want):
            assert np.array_equal(a.residual, b.residual) and np.array_equal(a.output, b.output)
            assert np.array_equal(a.branch, b.branch)
    assert all(a is b for a, b in zip(model.layers, layers))  # the model's own layers are back
    assert all(getattr(blk.self_attn.o_proj, "weight", None) is not None for blk in model.layers)  # and o_proj
    no_caps = greedy_beside(model, PROMPT, 2, fused)
    assert no_caps[2] is None and no_caps[3] is None and no_caps[0].tokens == ref.tokens[:2]
    with pytest.raises(ValueError, match=r"^capture: must be True or False"):
        greedy_beside(model, PROMPT, 2, fused, capture=1)
    with pytest.raises(ValueError, match=r"^weights: need one entry for each of the 2 layers, got 1"):
        greedy_beside(model, PROMPT, 2, fused[:1])
