"""An output element a launch never wrote is named, not read as a value: the outputs filled with
NaN before the launch, then with a sentinel where a NaN is left, an element NaN in one and the
sentinel in the other never written; a NaN the kernel wrote is its own. The logic on the CPU
(numpy launches, the emulator); MLX's CUDA back-end and PyTorch CUDA tensors under ``-m cuda``."""

import shutil

import numpy as np
import pytest

from tests.test_check_source import LAUNCH, TAIL_SOURCE
from workbench import backends
from workbench.check import KernelsFolderSubject, SourceLaunch, SourceSubject, check_kernel
from workbench.kernels import UncoveredOutput, covered_launch, never_written, torch_launch
from workbench.kernels.output_coverage import SENTINEL
from workbench.kernels.source import KERNEL_DIR

FEW = {"seeds": range(3), "scales": (1.0,), "folds": (None,), "faults": (), "rerun": False}


def _numpy_launch(write, n=10, launches=None):
    """A 'kernel' writing ``write(out)`` into an output filled with the fill value first."""

    def launch(fill):
        if launches is not None:
            launches.append(fill)
        out = np.full(n, fill, np.float32)
        write(out)
        return [out]

    return launch


def test_a_fully_written_output_takes_one_launch():
    launches = []
    (out,) = covered_launch(_numpy_launch(lambda o: o.__setitem__(slice(None), 1.0), launches=launches), ["out"])
    assert (out == 1).all() and len(launches) == 1 and np.isnan(launches[0])


def test_elements_never_written_are_named_by_index():
    with pytest.raises(UncoveredOutput, match=r"output 'out': 2 of 10 elements never written .*index 8, 9\)") as e:
        covered_launch(_numpy_launch(lambda o: o.__setitem__(slice(0, 8), 1.0)), ["out"])
    assert list(e.value.indices) == [8, 9] and e.value.size == 10


def test_a_nan_the_kernel_wrote_is_its_own_result():
    launches = []
    (out,) = covered_launch(_numpy_launch(lambda o: o.__setitem__(slice(None), np.nan), launches=launches), ["out"])
    assert np.isnan(out).all() and launches[1] == SENTINEL  # looked at again, found written


def test_never_written_on_arrays_and_indices_of_a_matrix():
    a = np.array([1.0, np.nan, np.nan], np.float32)
    b = np.array([1.0, SENTINEL, 2.0], np.float32)
    assert list(never_written(a, b)) == [1]
    with pytest.raises(UncoveredOutput, match=r"1 of 6 elements .*index \(1, 2\)"):
        covered_launch(lambda f: [np.where(np.arange(6).reshape(2, 3) == 5, f, 0.0).astype(np.float32)], ["m"])
    with pytest.raises(ValueError, match="sentinel_filled: must have the shape"):
        never_written(a, b[:2])
    with pytest.raises(ValueError, match="names: must name each"):
        covered_launch(lambda f: [a, b], ["one"])


def test_a_source_whose_loop_misses_the_last_element_is_named_by_the_check(emulator):
    short = TAIL_SOURCE.replace(
        "for (uint i = t; i < HIDDEN; i += THREADS) {\n  float s = 0.0f;\n  for (uint f",
        "for (uint i = t; i < HIDDEN - 1; i += THREADS) {\n  float s = 0.0f;\n  for (uint f",
    )
    assert short != TAIL_SOURCE
    rep = check_kernel(SourceSubject(LAUNCH.with_source(short, name="short")), **FEW)
    assert len(rep.problems) == 3 and all(
        "output 'out': 1 of 64 elements never written by the launch (index 63)" in p for p in rep.problems
    ), rep.problems


def test_torch_tensors_are_filled_before_the_launch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here: its fill is tested where it is")
    out = torch.empty(4)
    with pytest.raises(UncoveredOutput, match="index 3"):
        covered_launch(torch_launch(lambda: out[:3].copy_(torch.ones(3)), [out]), ["out"])


def _cuda():
    try:
        backends.resolve_backend("cuda")
    except backends.BackendUnavailable as e:
        pytest.skip(f"cuda: {e}")


CUDA_SOURCE = """
unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
if (i < LIMIT) out[i] = residual[i];
"""


@pytest.mark.cuda
def test_a_cuda_source_launch_that_misses_elements_is_named():
    _cuda()
    import mlx.core as mx

    from workbench.check.source_launch import run_on_device

    launch = SourceLaunch(CUDA_SOURCE, ("residual",), grid=(64, 1, 1), threadgroup=(32, 1, 1), template={"LIMIT": 60})
    with pytest.raises(UncoveredOutput, match=r"4 of 64 elements never written .*index 60, 61, 62, 63\)"):
        run_on_device(launch, "cuda", [mx.arange(64, dtype=mx.float32)], (64, 96, 80))
    full = SourceLaunch(CUDA_SOURCE, ("residual",), grid=(64, 1, 1), threadgroup=(32, 1, 1), template={"LIMIT": 64})
    assert (run_on_device(full, "cuda", [mx.arange(64, dtype=mx.float32)], (64, 96, 80)) == np.arange(64)).all()


@pytest.mark.cuda
def test_a_kernels_folder_on_cuda_is_judged_with_its_outputs_covered(tmp_path):
    _cuda()
    folder = tmp_path / "my_kernels"
    shutil.copytree(KERNEL_DIR, folder)
    rep = check_kernel(KernelsFolderSubject(folder, backend="cuda"), **{**FEW, "folds": (16,)})
    assert rep.passed and not rep.problems, str(rep)
    body = folder / "ffn_down.body"
    body.write_text(body.read_text().replace("out[r0 + lid] =", "if (r0 + lid != 0) out[r0 + lid] ="))
    rep = check_kernel(KernelsFolderSubject(folder, backend="cuda"), **{**FEW, "folds": (16,)})
    assert rep.problems and all("launch ffn_down: output 'out': 1 of 64" in p for p in rep.problems), rep.problems


@pytest.mark.cuda
def test_torch_cuda_tensors_are_filled_and_checked():
    _cuda()
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    if not torch.cuda.is_available():
        pytest.skip("torch: no CUDA device visible to PyTorch")
    out = torch.empty(1000, device="cuda")
    with pytest.raises(UncoveredOutput, match="1 of 1000 elements .*index 999"):
        covered_launch(torch_launch(lambda: out[:999].copy_(torch.ones(999, device="cuda")), [out]), ["out"])
