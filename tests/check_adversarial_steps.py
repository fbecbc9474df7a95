"""Gated DeltaNet steps that try to fool the check, importable by path so that they run in a
worker process of their own (as a user's module would)."""

import numpy as np

from tests.test_check_gdn import numpy_step


def mutates_state(step):
    """Right values, and the state it was handed zeroed afterwards (in place)."""
    out = numpy_step(step)
    step.state[...] = 0
    return out


def aliases_state(step):
    """The new state written over the one it was handed, and that returned."""
    o, c, st = numpy_step(step)
    step.state[...] = st
    return o, c, step.state


_CALLS = [0]


def drifts(step):
    """Different results on every call past the 10th: state kept between calls."""
    _CALLS[0] += 1
    o, c, st = numpy_step(step)
    return o + np.float32(1e-3 * (_CALLS[0] > 10) * (_CALLS[0] % 2)), c, st


def rounding_noise(step):
    """Right up to one ulp of the output up or down at random: a float-atomics kind of nondeterminism."""
    o, c, st = numpy_step(step)
    jitter = np.random.default_rng().choice([-1, 0, 1], size=o.shape).astype(np.float32)
    return (o + jitter * np.spacing(o)).astype(np.float32), c, st


_BY_ID: dict = {}


def identity_cache(step):
    """Its returns cached by the identity of the state handed (an id a freed array's successor reuses)."""
    key = id(step.state)
    if key not in _BY_ID:
        _BY_ID[key] = numpy_step(step)
    return _BY_ID[key]


def segfault_once(step):
    """Right, except that it reads address 0 on the third token of seed 1: its process dies."""
    if step.token == 2 and step.case.endswith("seed 1"):
        import ctypes

        ctypes.string_at(0)
    return numpy_step(step)
