"""reference_model.first_departure: where teacher forcing first leaves a reference, in at most two passes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_checkpoint import tiny_llama
from workbench.real_models.reference_model import first_departure, forced_choices, greedy

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


@pytest.mark.parametrize("prompt,tokens,match", [
    ([], [1], "prompt: must hold at least one"),
    ([1], [], "tokens: must hold at least one"),
    ([1], [128], "tokens"),
    ([-1], [2], "prompt"),
])
def test_bad_arguments_are_named(prompt, tokens, match):
    with pytest.raises(ValueError, match=match):
        first_departure(tiny_llama(1), prompt, tokens)
