"""The check on a real Dask ``LocalCluster`` (two single-threaded worker processes, started by
spawn, as ``cluster_client`` makes them; no mock): the same bits as the serial check, the
subject's forms reaching the workers, a crash costing its case, and the threads capped."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.check_user_tails import correct, eps_outside
from workbench.check import check_kernel, cluster_client, mutation_sweep_on_cluster, sweep_on_cluster
from workbench.check.cluster import shards
from workbench.check.cluster_worker import arrive, ship
from workbench.check.subjects import CallableSubject

FEW = {"scales": (0.01, 1.0), "faults": ("eps_outside_root", "dropped_residual")}


@pytest.fixture(scope="module")
def client():
    c = cluster_client(workers=2)
    yield c
    c.close()


def same_report(a, b) -> None:
    """The same rows bit for bit, the same tolerances, calibration, tests and verdict."""
    pd.testing.assert_frame_equal(a.cases, b.cases, check_exact=True)
    pd.testing.assert_frame_equal(a.faults, b.faults, check_exact=True)
    ra, rb = a.to_record(), b.to_record()
    ra.pop("checked"), rb.pop("checked")
    assert ra == rb
    assert str(a.error_table()) == str(b.error_table())


def test_a_check_on_the_cluster_is_the_serial_check_bit_for_bit(client):
    serial = check_kernel(correct, seeds=range(13), **FEW)
    # shards of 5: not aligned with anything; two configurations, so a shard is a (configuration, seeds) task
    spread = check_kernel(correct, seeds=range(13), client=client, shard_seeds=5, **FEW)
    same_report(serial, spread)
    assert any("Dask cluster" in c and "OMP_NUM_THREADS=1" in c for c in spread.checked)
    two = {"folds": (None, 16)}
    same_report(
        check_kernel(eps_outside, seeds=[7, 3, 11], **two, **FEW),
        check_kernel(eps_outside, seeds=[7, 3, 11], client=client, shard_seeds=2, **two, **FEW),
    )


def test_a_callable_not_importable_goes_by_value_and_runs_in_a_process_of_its_own(client):
    scale = np.float32(1.0)

    def closure(case):  # a notebook's function: not importable by module:qualname in the workers
        return correct(case) * scale

    rep = check_kernel(closure, seeds=range(4), client=client, **FEW)
    same_report(check_kernel(closure, seeds=range(4), **FEW), rep)
    assert (
        rep.subject == "test_a_callable_not_importable_goes_by_value_and_runs_in_a_process_of_its_own.<locals>.closure"
    )
    assert any("worker process of its own (workbench.check.cluster_callables:by_value_" in c for c in rep.checked)


def crashes_on_seed_2(case):
    """A segfault on one case (its name ends 'seed 2'): the process running the call dies."""
    if case.case.endswith("seed 2"):
        import ctypes

        return ctypes.string_at(0)
    return correct(case)


class InProcessForm:
    """A subject form that runs in the check's own process (as the kernel forms do), so its
    segfault kills the Dask worker itself."""

    name, kind = "in-process", "test form"

    def calls(self, sc, w):
        if sc.case.endswith("seed 2"):
            import ctypes

            return [(lambda: ctypes.string_at(0), (sc.branch.shape[0], sc.shape[0]))]
        return [
            (lambda: np.stack([correct(_one(sc, i)) for i in range(len(sc.branch))]), (len(sc.branch), sc.shape[0]))
        ]


def _one(sc, i):
    from workbench.check import StoredCase

    return StoredCase(**{**sc.__dict__, "branch": sc.branch[i], "residual": sc.residual[i]})


def test_a_crash_costs_its_case_not_the_check(client):
    rep = check_kernel(crashes_on_seed_2, seeds=range(4), client=client, shard_seeds=2, faults=(), scales=(1.0,))
    assert rep.problems and all("seed 2" in p for p in rep.problems), rep.problems
    assert "process died (signal SIGSEGV)" in rep.problems[0]
    assert np.isnan(rep.cases.loc[rep.cases["seed"] == 2, "worst"]).all()
    assert np.isfinite(rep.cases.loc[rep.cases["seed"] != 2, "worst"]).all()


def test_a_dask_worker_killed_by_the_subject_costs_that_case_once(client):
    rep = check_kernel(InProcessForm(), seeds=range(4), client=client, shard_seeds=2, faults=(), scales=(1.0,))
    assert len(rep.problems) == 1 and "seed 2: the Dask worker running it died" in rep.problems[0], rep.problems
    assert sorted(rep.cases["seed"]) == [0, 1, 3]  # the other seed of the dead shard, run again alone
    assert not rep.passed


def test_bad_clients_are_refused_naming_the_parameter():
    with pytest.raises(ValueError, match=r"client: must be a dask.distributed.Client .*got 'tcp://x:1'"):
        check_kernel(correct, seeds=range(2), client="tcp://x:1")
    with pytest.raises(ValueError, match="workers: a scheduler's cluster has its own workers"):
        cluster_client(workers=2, scheduler="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="workers: must be"):
        cluster_client(workers=0)


def test_shards_cut_the_seeds_in_order():
    s = np.arange(10)
    assert [list(x) for x in shards(s, 2, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(shards(s, 2)) == 4 and np.array_equal(np.concatenate(shards(s, 3)), s)


def test_a_kernels_folder_travels_with_its_files_and_the_users_folder_is_only_read(tmp_path, emulator):
    from workbench.check import KernelsFolderSubject
    from workbench.kernels.source import KERNEL_DIR

    src = KernelsFolderSubject(KERNEL_DIR, name="mine")
    got = arrive(ship(src))
    assert got.folder != src.folder and got.name == "mine"
    for p in src.folder.rglob("*"):
        if p.is_file():
            assert (got.folder / p.relative_to(src.folder)).read_bytes() == p.read_bytes()
    again = arrive(ship(src))
    assert again.folder == got.folder  # the same content is written once


def test_an_importable_callable_goes_by_path():
    s = ship(CallableSubject(correct))
    assert (s.form, s.payload) == ("path", "tests.check_user_tails:correct")
    assert arrive(s).fn is correct


def test_the_sweeps_on_the_cluster_are_the_serial_sweeps_bit_for_bit(client):
    from workbench.studies import calibrate_by, mutation_sweep, sweep

    # three blocks of CASE_BLOCK seeds (the last one partial), two shapes, two folds
    kw = {"shapes": [(64, 96, 80), (32, 64, 48)], "seeds": range(100, 700, 2), "folds": (None, 16)}
    serial = sweep(**kw)
    spread = sweep_on_cluster(client, **kw)
    pd.testing.assert_frame_equal(serial, spread, check_exact=True)
    pd.testing.assert_frame_equal(calibrate_by(serial), calibrate_by(spread), check_exact=True)
    few = {
        "shapes": [(64, 96, 80)],
        "seeds": [3, 300, 1],
        "folds": (16,),
        "mutations": ("dropped_residual", "rotation_skipped"),
    }
    pd.testing.assert_frame_equal(mutation_sweep(**few), mutation_sweep_on_cluster(client, **few), check_exact=True)


def test_the_command_runs_on_workers_and_refuses_what_does_not_go_together(capsys):
    from workbench.check.__main__ import main

    assert main(["tests.check_user_tails:correct", "--seeds", "4", "--scales", "1", "--workers", "2"]) == 0
    assert "run on a Dask cluster" in capsys.readouterr().out
    for argv, says in (
        (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "--workers: a --scheduler's cluster"),
        (["--workers", "0"], "--workers"),
    ):
        with pytest.raises(SystemExit) as done:
            main(["tests.check_user_tails:correct", *argv])
        assert done.value.code == 2 and says in capsys.readouterr().err


def test_dasks_progress_bar_goes_to_stderr_when_asked(client, capsys):
    rep = check_kernel(correct, seeds=range(2), client=client, progress=True, faults=(), scales=(1.0,))
    out, err = capsys.readouterr()
    assert rep.passed and "Completed" in err and "Completed" not in out


def test_a_scheduler_is_taken_by_address_or_from_dasks_config(client):
    import dask

    address = client.scheduler.address
    for made in (lambda: cluster_client(scheduler=address), lambda: cluster_client()):
        with dask.config.set({"scheduler-address": address}):  # as DASK_SCHEDULER_ADDRESS sets it
            other = made()
        try:
            assert other.scheduler.address == address
        finally:
            other.close()
