"""Test-wide settings.

Hypothesis runs derandomized by default: each property test draws the same examples on
every run and every machine, so a CI run cannot fail on an example no earlier run saw,
and a failure reproduces from its test id alone. The examples are still many and varied.
To search fresh examples locally: ``HYPOTHESIS_PROFILE=explore make unit``.
"""

import os

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
