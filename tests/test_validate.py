"""The boundary checks' one message form: parameter, what was given, what is allowed."""

import numpy as np
import pytest

from workbench.validate import describe, flag, integer, number, one_of


def test_number_accepts_numpy_scalars_and_refuses_bools():
    assert number("eps", np.float32(0.5)) == 0.5
    assert number("eps", 3) == 3.0
    for bad in (True, np.bool_(False), "1e-6", None, [1.0]):
        with pytest.raises(ValueError, match=r"^eps: must be a finite number"):
            number("eps", bad)


def test_number_bounds_and_finiteness_are_named():
    with pytest.raises(ValueError, match=r"eps: must be a finite number > 0, got -5"):
        number("eps", -5, minimum=0, exclusive_minimum=True)
    with pytest.raises(ValueError, match="got nan"):
        number("tol", float("nan"))
    assert number("x", float("inf"), finite=False) == float("inf")
    with pytest.raises(ValueError, match="<= 1"):
        number("q", 1.5, maximum=1)


def test_integer_refuses_floats_bools_and_strings():
    assert integer("layer", np.int64(3)) == 3
    for bad in (3.0, True, "3", None):
        with pytest.raises(ValueError, match=r"^layer: must be an integer"):
            integer("layer", bad)
    with pytest.raises(ValueError, match=r"an integer >= 1 and <= 4, got 5"):
        integer("m", 5, minimum=1, maximum=4)


def test_flag_and_one_of():
    assert flag("fuse_tail", np.bool_(True)) is True
    with pytest.raises(ValueError, match="fuse_tail: must be True or False, got 'false'"):
        flag("fuse_tail", "false")
    assert one_of("backend", "graph", ("graph", "cuda")) == "graph"
    with pytest.raises(ValueError, match="backend: must be one of 'graph', 'cuda', got 'gpu'"):
        one_of("backend", "gpu", ("graph", "cuda"))
    with pytest.raises(ValueError, match="must be one of"):
        one_of("backend", ["unhashable"], ("graph",))


def test_describe_names_arrays_by_shape_and_dtype():
    assert describe(np.zeros((2, 3), np.float32)) == "a ndarray of shape (2, 3) and dtype float32"
    assert describe("x" * 100).endswith("...")
