"""TailWeights as a value: frozen, read-only arrays, eps checked, the norm convention recorded."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from workbench import tail as T
from workbench.fold.rotation import HadamardFold
from workbench.models.config import ModelConfig
from workbench.tail.frink_case import seed_arrays


def _weights(**kw) -> T.TailWeights:
    a = seed_arrays()
    return T.TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, **kw)


def test_fields_cannot_be_reassigned():
    w = _weights()
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.eps = -5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.ffn_norm = np.ones(64, np.float32)  # type: ignore[misc]


def test_norm_is_read_only_and_a_copy_of_the_callers():
    a = seed_arrays()
    norm = a.ffn_norm.astype(np.float32).copy()
    w = T.TailWeights.from_arrays(a.wo, norm, a.gate, a.up, a.down)
    with pytest.raises(ValueError, match="read-only"):
        w.ffn_norm[0] = 7.0
    before = w.host_arrays(np.float64)[1].copy()
    norm[0] = 7.0  # the caller's array changing later cannot reach the cached host copies
    assert np.array_equal(w.host_arrays(np.float64)[1], before)
    assert float(w.ffn_norm[0]) != 7.0


@pytest.mark.parametrize("eps", [0.0, -5, float("nan"), float("inf"), True, np.bool_(True), "1e-6"])
def test_bad_eps_is_refused_at_construction(eps):
    with pytest.raises(ValueError, match=r"^eps: must be a finite number > 0, got"):
        _weights(eps=eps)


@pytest.mark.parametrize("eps", [1e-5, np.float32(1e-5), np.float64(1e-6), 1])
def test_numpy_scalars_and_ints_are_numbers(eps):
    w = _weights(eps=eps)
    assert type(w.eps) is float and w.eps == float(eps)


def test_eps_comes_from_the_config():
    a = seed_arrays()
    cfg = ModelConfig.synthetic(64, ffn_dim=80, num_q_heads=1, num_kv_heads=1, head_dim=96, rms_norm_eps=1e-5)
    w = T.TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, config=cfg, layer=0)
    assert w.eps == 1e-5
    assert T.TailWeights.random(64, 96, 80, seed=0, config=cfg, layer=0).eps == 1e-5
    with pytest.raises(ValueError, match=r"^eps: must be the config's rms_norm_eps 1e-05"):
        T.TailWeights.from_arrays(a.wo, a.ffn_norm, a.gate, a.up, a.down, eps=1e-6, config=cfg, layer=0)


def test_zero_centred_norm_adds_the_one_and_says_so():
    a = seed_arrays()
    stored = (a.ffn_norm - 1.0).astype(np.float32)  # what a zero-centred checkpoint would store
    w = T.TailWeights.from_arrays(a.wo, stored, a.gate, a.up, a.down, norm_convention="zero_centred")
    plain = _weights()
    assert w.norm_convention == "zero_centred" and plain.norm_convention == "plain"
    np.testing.assert_array_equal(w.ffn_norm, stored + np.float32(1.0))
    c = seed_arrays()
    np.testing.assert_allclose(
        T.host_tail(w, c.branch, c.residual), T.host_tail(plain, c.branch, c.residual), rtol=0, atol=1e-6
    )
    assert "zero-centred" in repr(w) and "zero-centred" not in repr(plain)
    with pytest.raises(ValueError, match=r"^norm_convention: must be one of 'plain', 'zero_centred', got 'one_plus'"):
        _weights(norm_convention="one_plus")


def test_a_draw_in_chunks_is_one_draw(monkeypatch) -> None:
    """A tensor is drawn a chunk at a time into its float32 result: the values of one
    ``uniform`` draw in float64 cast to float32, whatever the chunk (centred or not)."""
    from workbench.tail import weights as tw

    for d in (T.Draw("w", (37, 29), 0.3), T.Draw("n", (1000,), 0.25, centre=1.0)):
        want = np.random.default_rng(4).uniform(-d.half_width, d.half_width, size=(3,) + d.shape)
        want = (d.centre + want if d.centre else want).astype(np.float32)
        for chunk in (1 << 20, 100, 7):
            monkeypatch.setattr(tw, "DRAW_CHUNK", chunk)
            np.testing.assert_array_equal(d.draw(np.random.default_rng(4), (3,)), want)


def test_random_weights_are_the_arrays_stored_in_their_dtype() -> None:
    """``TailWeights.random`` (each matrix sent to MLX as it is drawn) stores what
    ``from_arrays`` stores from the recipe's draws; an MLX array already in the stored dtype
    is kept as it is."""
    import mlx.core as mx

    for dtype in ("bfloat16", "float32"):
        w = T.TailWeights.random(24, 32, 40, seed=9, fold_block=8, dtype=dtype)
        rng = np.random.default_rng(9)
        recipe = {d.name: d for d in T.case_recipe(24, 32, 40)}
        a = {n: recipe[n].draw(rng) for n in ("wo", "gate", "up", "down", "ffn_norm")}
        fold = HadamardFold.random(32, 8, seed=int(rng.integers(2**31)))
        v = T.TailWeights.from_arrays(a["wo"], a["ffn_norm"], a["gate"], a["up"], a["down"], fold=fold, dtype=dtype)
        for x, y in zip(w.host_arrays(np.float64), v.host_arrays(np.float64)):
            np.testing.assert_array_equal(x, y)
        gate = mx.array(a["gate"]).astype(getattr(mx, dtype))
        kept = T.TailWeights.from_arrays(a["wo"], a["ffn_norm"], gate, a["up"], a["down"], dtype=dtype)
        assert kept.gate.launch_parts()[0] is gate
