"""bench.common.step_profile: the ops in a step's graph, and the device profile's refusal."""

import mlx.core as mx
import pytest

from bench.common import step_profile


def test_graph_ops_counts_each_primitive_of_the_lazy_graph():
    a = mx.ones((4,))
    mx.eval(a)
    out = mx.exp(a * 2 + 1).sum()
    ops = step_profile.graph_ops(out)
    assert ops["Multiply"] == 1 and ops["Add"] == 1 and ops["Exp"] == 1 and ops["Sum"] == 1
    # most frequent first, every count a positive integer
    counts = list(ops.values())
    assert counts == sorted(counts, reverse=True) and all(isinstance(c, int) and c > 0 for c in counts)


def test_graph_ops_of_an_evaluated_array_is_empty():
    a = mx.ones((4,)) + 1
    mx.eval(a)
    assert step_profile.graph_ops(a) == {}


def test_a_compiled_function_is_one_op():
    f = mx.compile(lambda x: mx.exp(x * 2 + 1))
    x = mx.ones((4,))
    mx.eval(x)
    ops = step_profile.graph_ops(f(x))
    assert sum(ops.values()) == 1 and next(iter(ops)).startswith("Compiled")


def test_device_profile_refuses_without_torch_or_cuda():
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("PyTorch with CUDA is here: the profile can run")
    with pytest.raises(step_profile.ProfileUnavailable, match="PyTorch|CUDA"):
        step_profile.device_profile(lambda: None, 1)


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_device_profile_steps_must_be_a_positive_integer(steps):
    with pytest.raises(ValueError, match="steps: must be an integer >= 1"):
        step_profile.device_profile(lambda: None, steps)


def test_the_build_profile_names_the_functions_a_step_spends_its_host_time_in():
    import mlx.core as mx

    from bench.common import step_profile as sp

    x = mx.ones((8,))
    taken = []

    def build():
        return mx.sum(x * 2.0)

    rows = sp.build_profile(build, lambda y: taken.append(float(y.item())), steps=4, top=5)
    assert taken == [16.0] * 4  # every step was read, outside the profile
    assert 0 < len(rows) <= 5 and all(
        set(r) == {"function", "calls_per_step", "own_us_per_step", "cum_us_per_step"} for r in rows
    )
    assert any("build" in r["function"] for r in rows)
    own = [r["own_us_per_step"] for r in rows]
    assert own == sorted(own, reverse=True)  # most own time first
    assert not any(r["function"].startswith("/") for r in rows)  # no machine paths in a record
    with pytest.raises(ValueError, match="steps: must be an integer >= 1, got 0"):
        sp.build_profile(build, lambda y: None, steps=0)
