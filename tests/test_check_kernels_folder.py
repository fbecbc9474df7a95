"""The kernels-folder form: a copy of the workbench's own kernels/ run on the CPU emulator
is judged correct, in every thread order."""

import shutil

import pytest

from workbench.check import KernelsFolderSubject, check_kernel
from workbench.kernels.source import KERNEL_DIR


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_a_copy_of_the_kernels_folder_is_judged_correct(tmp_path, order, emulator):
    folder = tmp_path / "my_kernels"
    shutil.copytree(KERNEL_DIR, folder)
    rep = check_kernel(KernelsFolderSubject(folder, order=order), seeds=range(12), faults=())
    assert not rep.problems, rep.problems[:2]
    assert rep.passed, str(rep)
    assert rep.calibrated is None and "not calibrated" in rep.calibration_note  # 36 errors: too few to fit


def test_a_missing_folder_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="folder"):
        KernelsFolderSubject(tmp_path / "absent")


def test_every_schedule_gives_the_same_bits(tmp_path, emulator):
    folder = tmp_path / "my_kernels"
    shutil.copytree(KERNEL_DIR, folder)
    rep = check_kernel(KernelsFolderSubject(folder, order="every"), seeds=range(2), faults=())
    assert not rep.problems, rep.problems[:2]


def test_the_orders_are_the_emulators():
    from workbench.check.subjects import EMULATOR_ORDERS
    from workbench.kernels.metal_emulation import SCHEDULES

    assert EMULATOR_ORDERS == SCHEDULES + ("every",)
    with pytest.raises(ValueError, match="order"):
        KernelsFolderSubject(KERNEL_DIR, order="backwards")
