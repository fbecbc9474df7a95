"""The tail's one fault vocabulary: every user draws its names, words and implementations from it."""

import numpy as np
import pytest

from workbench.check import FAULTS as CHECK_FAULTS
from workbench.studies import FAULTS as THREE_WAY_FAULTS
from workbench.studies import MUTATION_DOC, MUTATIONS
from workbench.tail import TAIL_FAULTS, TailVariant, apply_fault


def _variant(rng: np.random.Generator, h: int = 8, b: int = 4, f: int = 6) -> TailVariant:
    def a(*s):
        return rng.standard_normal(s).astype(np.float32)

    return TailVariant(a(h, b), a(f, h), a(f, h), a(h, f), a(h), 1e-6, a(2, b), a(2, h), wo_group=(2, 0.25))


def test_every_users_names_are_the_registrys_and_say_the_same():
    for names in (CHECK_FAULTS, MUTATIONS, THREE_WAY_FAULTS):
        assert set(names) <= set(TAIL_FAULTS)
    for n, doc in {**CHECK_FAULTS, **MUTATION_DOC}.items():
        assert doc == TAIL_FAULTS[n].doc
    # one name a bug: the three-way's forgotten fold is the check's and the sweeps' rotation_skipped
    assert "rotation_skipped" in set(CHECK_FAULTS) & set(MUTATIONS) & set(THREE_WAY_FAULTS)
    assert set(TAIL_FAULTS) == set(CHECK_FAULTS) | set(MUTATIONS) | set(THREE_WAY_FAULTS)


@pytest.mark.parametrize("fault", TAIL_FAULTS)
def test_each_fault_changes_only_what_it_says_and_not_its_input(fault):
    v = _variant(np.random.default_rng(0))
    before = {k: np.copy(x) if isinstance(x, np.ndarray) else x for k, x in v.__dict__.items()}
    w = apply_fault(fault, v)
    for k, x in before.items():  # the variant given is never written
        assert np.array_equal(getattr(v, k), x) if isinstance(x, np.ndarray) else getattr(v, k) == x
    changed = {k for k in v.__dict__ if _differs(getattr(v, k), getattr(w, k))}
    assert changed == set(TAIL_FAULTS[fault].changes)


def _differs(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b))
    return a != b


def test_fault_values():
    v = _variant(np.random.default_rng(1))
    assert apply_fault("wrong_eps", v).eps == pytest.approx(1e-5)
    assert apply_fault("norm_wrong_length", v).norm_length == 4  # the branch length, != hidden
    assert not apply_fault("dropped_residual", v).residual.any()
    flipped = apply_fault("sign_flipped", v).branch
    assert np.array_equal(flipped[:, 0], -v.branch[:, 0]) and np.array_equal(flipped[:, 1:], v.branch[:, 1:])
    g = apply_fault("group_scale_wrong", v).wo
    np.testing.assert_array_equal(g[0, :2], 2 * v.wo[0, :2] - np.float32(0.25))
    np.testing.assert_array_equal(g[1:], v.wo[1:])
    assert apply_fault("transposed_weight", v).down.shape == v.down.shape
    assert apply_fault(None, v) is v


def test_an_engine_refuses_a_fault_it_cannot_run():
    v = _variant(np.random.default_rng(2))
    with pytest.raises(ValueError, match="^fault: must be one of 'rotation_skipped', 'bf16_normed', got 'wrong_eps'"):
        apply_fault("wrong_eps", v, allowed=THREE_WAY_FAULTS)
    with pytest.raises(ValueError, match="^fault: must be one of"):
        apply_fault("typo", v)
    with pytest.raises(ValueError, match="group_scale_wrong: needs a quantized wo"):
        apply_fault("group_scale_wrong", TailVariant(*list(v.__dict__.values())[:8]))
