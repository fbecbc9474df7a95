"""Tails a user might write, importable by path for the command-line tests."""

from tests.test_check_run import user_tail


def correct(case):
    return user_tail(case)


def eps_outside(case):
    return user_tail(case, eps_outside=True)


def correct_mlx(case):
    """The same tail handed MLX arrays (``--arrays mlx``): converted to numpy and back."""
    import mlx.core as mx
    import numpy as np

    from workbench.check import StoredCase, StoredMatrix

    def mat(m):  # float32 numpy of what the matrix stands for (this test's weights are dense)
        return StoredMatrix(shape=m.shape, dtype=m.dtype, values=np.array(m.dense()))

    as_np = StoredCase(
        case=case.case,
        wo=mat(case.wo),
        gate=mat(case.gate),
        up=mat(case.up),
        down=mat(case.down),
        ffn_norm=np.array(case.ffn_norm),
        eps=case.eps,
        fold=case.fold,
        branch=np.array(case.branch),
        residual=np.array(case.residual),
    )
    assert isinstance(case.branch, mx.array)
    return mx.array(user_tail(as_np))


def mutates_weight_at_large_inputs(case):
    """Writes into its gate weight, only on the call of the largest input scale."""
    import numpy as np

    out = user_tail(case)
    if float(np.max(np.abs(case.branch))) > 1.0:
        case.gate.values[0, 0] += 1.0
    return out


def segfault(case):
    """Reads address 0: the process that runs it dies (SIGSEGV)."""
    import ctypes

    return ctypes.string_at(0)


def mutates_input(case):
    out = user_tail(case)
    case.residual[...] = 0  # the next reader of this buffer sees zeros
    return out


def aliases_input(case):
    out = user_tail(case)
    case.residual[...] = out  # the output written over an input, and that input returned
    return case.residual


_CALLS = [0]


def stateful(case):
    """Correct for its first 30 calls, then off by 1e-3: state kept between calls."""
    _CALLS[0] += 1
    return user_tail(case) + (1e-3 if _CALLS[0] > 30 else 0.0)


def rounding_noise(case):
    """Correct up to one ulp up or down at random a call: a float-atomics kind of nondeterminism."""
    import numpy as np

    out = np.asarray(user_tail(case), np.float32)
    return out + np.random.default_rng().choice([-1, 0, 1], size=out.shape).astype(np.float32) * np.spacing(out)


_BY_ID: dict = {}


def identity_cache(case):
    """Caches its output by the identity of the input array (an id a freed array's successor reuses)."""
    key = id(case.branch)
    if key not in _BY_ID:
        _BY_ID[key] = user_tail(case)
    return _BY_ID[key]
