"""The kernel forms (a Metal source, a kernels folder) run in a worker process of their own: a
source that crashes its process (a trap: SIGILL, which the emulator does not catch as it
catches a memory fault) on some cases costs those cases only, a source that hangs is ended at
the time limit, and the check finishes with the other cases judged. A case's large arrays
travel through a shared file the worker maps, not through the pipe."""

import io
import os
import shutil

import numpy as np
import pytest

from tests.test_check_source import LAUNCH, TAIL_SOURCE
from workbench.check import KernelsFolderSubject, SourceSubject, check_kernel
from workbench.check.isolation import OUT_OF_BAND_BYTES, receive_message, send_message
from workbench.kernels.source import KERNEL_DIR

FIRST_LINE = "uint t = thread_position_in_threadgroup.x;"
# branch[0] > 0 on seeds 1 and 3 of range(4) at scale 1, not on seeds 0 and 2
TRAP = "if (branch[0] > 0.0f) { __builtin_trap(); }"
SPIN = "if (branch[0] > 0.0f) { for (;;) threadgroup_barrier(metal::mem_flags::mem_threadgroup); }"
FEW = {"seeds": range(4), "scales": (1.0,), "folds": (None,), "faults": (), "rerun": False}


def _source(extra, name):
    return SourceSubject(LAUNCH.with_source(TAIL_SOURCE.replace(FIRST_LINE, f"{FIRST_LINE}\n{extra}"), name=name))


def _died(rep):
    return [p for p in rep.problems if "its process died" in p]


def test_a_source_that_crashes_its_process_costs_only_its_cases(emulator):
    rep = check_kernel(_source(TRAP, "traps"), **FEW)
    died = _died(rep)
    assert [p.split(":")[0].rsplit(" ", 1)[-1] for p in died] == ["1", "3"], rep.problems
    assert all("(signal SIGILL)" in p and "the check went on" in p for p in died)
    assert not rep.passed and len(rep.problems) == 2
    ok = rep.cases[rep.cases.seed.isin([0, 2])]
    assert (ok.worst < 2e-4).all(), ok  # the other cases ran, in a fresh worker, and were judged
    assert "worker process of its own (the metal source's launches)" in rep.checked[0]


def test_a_source_that_hangs_is_ended_at_the_time_limit(emulator):
    rep = check_kernel(_source(SPIN, "spins"), **{**FEW, "seeds": range(3)}, time_limit=3)
    assert rep.problems == ["shape (64, 96, 80) float32 fold None quant none seed 1: no result within the 3 s limit"], (
        rep.problems
    )
    assert (rep.cases[rep.cases.seed != 1].worst < 2e-4).all()


def test_a_kernels_folder_that_crashes_costs_only_its_cases(tmp_path, emulator):
    folder = tmp_path / "my_kernels"
    shutil.copytree(KERNEL_DIR, folder)
    body = folder / "wo_residual.body"
    body.write_text("if (x[0] > 0.0f) { __builtin_trap(); }\n" + body.read_text())
    rep = check_kernel(KernelsFolderSubject(folder), **{**FEW, "folds": (16,)})
    died = _died(rep)
    assert len(died) >= 1 and len(died) < 4, rep.problems
    assert rep.cases.worst.notna().sum() == 4 - len(died)
    assert "worker process of its own (the kernels folder's launches)" in rep.checked[0]


def test_process_false_keeps_a_form_in_the_checks_process(emulator):
    rep = check_kernel(SourceSubject(LAUNCH, process=False), **FEW)
    assert rep.passed and "in the check's own process" in rep.checked[0]
    with pytest.raises(ValueError, match="process: must be True or False"):
        SourceSubject(LAUNCH, process="yes")


def test_large_arrays_travel_through_a_shared_file_the_worker_maps(tmp_path):
    big = np.arange(OUT_OF_BAND_BYTES // 4 * 3, dtype=np.float32)
    small = np.arange(5, dtype=np.float32)
    stream = io.BytesIO()
    send_message(stream, {"big": big, "small": small}, tmp_path)
    assert len(stream.getvalue()) < OUT_OF_BAND_BYTES // 4  # the big array is not in the message
    assert len(os.listdir(tmp_path)) == 1
    stream.seek(0)
    got = receive_message(stream)
    assert np.array_equal(got["big"], big) and np.array_equal(got["small"], small)
    assert not got["big"].flags.writeable  # mapped read-only: the guarded call hands the subject copies
    assert os.listdir(tmp_path) == []  # unlinked once mapped


def test_a_slot_is_written_over_in_place_and_its_mapping_kept(tmp_path):
    # a case's arrays written into a kept file (a slot) are read through one mapping, kept by
    # path while large enough: the pages are not faulted in again a case, and nothing is unlinked
    slot, mapped = tmp_path / "slot-1.case", {}
    first = np.arange(OUT_OF_BAND_BYTES // 4 * 3, dtype=np.float32)
    stream = io.BytesIO()
    send_message(stream, {"w": first}, tmp_path, slot)
    stream.seek(0)
    got = receive_message(stream, mapped)
    assert np.array_equal(got["w"], first) and list(mapped) == [str(slot)]
    kept = mapped[str(slot)]
    second = first[::-1].copy()
    stream = io.BytesIO()
    send_message(stream, {"w": second}, tmp_path, slot)
    stream.seek(0)
    again = receive_message(stream, mapped)
    assert np.array_equal(again["w"], second) and mapped[str(slot)] is kept
    larger = np.arange(first.size * 2, dtype=np.float32)
    stream = io.BytesIO()
    send_message(stream, {"w": larger}, tmp_path, slot)
    stream.seek(0)
    grown = receive_message(stream, mapped)
    assert np.array_equal(grown["w"], larger) and mapped[str(slot)] is not kept  # mapped again, larger
    assert os.listdir(tmp_path) == ["slot-1.case"]  # one file, kept


def test_a_worker_that_holds_several_cases_reads_each_from_its_own_slot():
    # cases shipped while others are held go to other slots; a slot is written over only once
    # no held case is in it (never by the message that makes its cases forgotten)
    from workbench.check.isolation import ProcessCaller

    caller = ProcessCaller(SumSubject(), seconds=60, hold=2)
    try:
        arrays = {k: np.full(OUT_OF_BAND_BYTES // 4 * 2, v, dtype=np.float32) for k, v in zip("abcd", (1, 2, 3, 4))}
        jobs = [("a", arrays["a"], 0), ("b", arrays["b"], 0), ("a", arrays["a"], 1), ("c", arrays["c"], 0)]
        jobs += [("b", arrays["b"], 0), ("d", arrays["d"], 0), ("b", arrays["b"], 2), ("c", arrays["c"], 1)]
        got = [o.value for o in caller.run_all(jobs)]
        many = [o.value for o in caller.call_many(jobs)]
        assert got == many == [float(arrays[k].sum() + arg) for k, _, arg in jobs]
        assert len(os.listdir(caller._scratch)) <= 3  # slots reused, not a file a case
    finally:
        caller.close()


class SumSubject:
    """A subject of its own kind (a ``worker_call``): a case's array summed, plus the call's argument."""

    def worker_call(self, payload):
        return lambda arg: float(payload.sum() + arg)
