"""Every failing run of the recurrent step's check replayable: written as a self-contained
reproducer (its condition and seed, its inputs, its per-token error bits), run again by
``replay_step`` / ``--part gdn --replay FILE`` to the same verdict bit for bit; a fixed step on the
same file passes; the wrong file or form, and a cap too small, are refused by name."""

import pytest

from tests.check_user_steps import QUICK, bf16_state
from tests.test_check_gdn import numpy_step
from workbench.check import check_step
from workbench.check.__main__ import main
from workbench.check.replay import replay
from workbench.check.step_replay import replay_step

FEW = {
    "geometries": [(2, 6, 32, 32, 4)],
    "seeds": range(3),
    "tokens": 6,
    "gates": ["typical"],
    "scales": [1.0],
    "state_scales": [1.0],
    "faults": (),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replays")
    rep = check_step(bf16_state, replay_dir=folder, **FEW)
    return rep, folder


def test_each_failing_run_is_written_and_replays_to_the_same_verdict_and_bits(written):
    rep, folder = written
    assert not rep.passed and len(rep.reproducers) == 3
    assert sorted(str(p) for p in folder.iterdir()) == sorted(rep.reproducers)
    got = replay_step(rep.reproducers[0], bf16_state)
    assert not got.passed and got.same_verdict and got.same_bits, str(got)
    assert "the frink-models 2e-4 tolerance (worst <= 0.0002)" in got.failures_then[0]
    assert "same verdict as written (FAIL): yes; same output bits: yes" in str(got)


def test_a_fixed_step_passes_on_the_same_file(written):
    rep, _ = written
    got = replay_step(rep.reproducers[1], numpy_step)
    assert got.passed and not got.same_verdict and not got.same_bits, str(got)


def test_a_passing_check_writes_nothing(tmp_path):
    rep = check_step(numpy_step, replay_dir=tmp_path, **FEW)
    assert rep.passed and rep.reproducers == [] and list(tmp_path.iterdir()) == []


def test_the_command_writes_and_replays(tmp_path, capsys):
    args = ["--part", "gdn", "tests.check_user_steps:bf16_state", *QUICK, "--seeds", "2", "--tokens", "4"]
    assert main([*args, "--scales", "1", "--state-scales", "1", "--replay-dir", str(tmp_path)]) == 1
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2 and f"reproducer: {files[0]}" in capsys.readouterr().out
    assert main(["--part", "gdn", "tests.check_user_steps:bf16_state", "--replay", str(files[0])]) == 1
    assert "same verdict as written (FAIL): yes; same output bits: yes" in capsys.readouterr().out
    assert main(["--part", "gdn", "tests.check_user_steps:correct", "--replay", str(files[0])]) == 0


def test_wrong_files_forms_and_caps_are_refused_by_name(written, tmp_path):
    rep, _ = written
    with pytest.raises(ValueError, match="replay: .* is a reproducer of the recurrent step .*--part gdn"):
        replay(rep.reproducers[0], lambda case: case)
    with pytest.raises(ValueError, match="subject: .* was written by a check of a callable, got a kernels folder"):
        from workbench.check import KernelsFolderStep
        from workbench.kernels.source import KERNEL_DIR

        replay_step(rep.reproducers[0], KernelsFolderStep(KERNEL_DIR))
    with pytest.raises(ValueError, match="replay_max_bytes: a reproducer of geometry 2/6/32/32/4 over 6 tokens"):
        check_step(bf16_state, replay_dir=tmp_path, replay_max_bytes=1000, **FEW)
    with pytest.raises(ValueError, match="replay: .* is not a file|replay: must be a reproducer"):
        replay_step(tmp_path / "absent.safetensors", bf16_state)
