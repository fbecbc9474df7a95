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
