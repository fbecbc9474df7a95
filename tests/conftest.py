"""Test-wide settings.

Hypothesis runs derandomized by default: each property test draws the same examples on
every run and every machine, so a CI run cannot fail on an example no earlier run saw,
and a failure reproduces from its test id alone. The examples are still many and varied.
To search fresh examples locally: ``HYPOTHESIS_PROFILE=explore make unit``.

MLX's float32 matrix products run in full float32 (``MLX_ENABLE_TF32=0`` unless the run set
it): see below and ``workbench.backends.reduced_float32_products``.
"""

import os

# Full float32 matrix products in MLX on every device, as MLX's own test suite runs: on a GPU
# MLX would otherwise run float32 products of more than one row at TF32-class precision
# (~1e-3 off), and the tests hold MLX's float32 paths to float32 tolerances. MLX reads the
# variable at its first float32 product, so it is set before anything imports MLX's ops.
# A run can still ask for the reduced mode: ``MLX_ENABLE_TF32=1 make unit``.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import pytest
from hypothesis import settings

from workbench import backends

settings.register_profile("workbench", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "workbench"))


@pytest.fixture(scope="module")
def emulator() -> None:
    """Skip, saying why, where the Metal emulator cannot run (no clang): the tests that run
    Metal sources on the CPU ask for this fixture."""
    try:
        backends.resolve_backend("metal-emulated")
    except backends.BackendUnavailable as e:
        pytest.skip(f"metal-emulated: {e}")
