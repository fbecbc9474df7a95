"""Test-wide settings.

Hypothesis runs derandomized by default: each property test draws the same examples on
every run and every machine, so a CI run cannot fail on an example no earlier run saw,
and a failure reproduces from its test id alone. The examples are still many and varied.
To search fresh examples locally: ``HYPOTHESIS_PROFILE=explore make unit``.
"""

import os

from hypothesis import settings

settings.register_profile("workbench", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "workbench"))
