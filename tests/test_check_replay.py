"""Replay: each failing case of a check written as a reproducer (atomically, never over a file,
under a size cap), run again by ``replay`` and by ``python -m workbench.check --replay`` to the
same verdict and the same output bits."""

import numpy as np
import pytest

from workbench.check import check_kernel
from workbench.check.replay import read_reproducer, replay
from workbench.check.stored import stored_case
from workbench.check.subjects import CallableSubject
from workbench.studies.cases import case_weights


def eps_outside_tail(case):
    """A numpy tail with eps outside the square root (fails at small input scales); unfolded weights only."""
    x = case.residual + case.branch @ case.wo.dense().T
    ms = (x * x).mean(-1, keepdims=True)
    nx = x / (np.sqrt(ms) + np.float32(case.eps)) * case.ffn_norm
    g, u = nx @ case.gate.dense().T, nx @ case.up.dense().T
    return (x + (g / (1 + np.exp(-g)) * u) @ case.down.dense().T).astype(np.float32)


def eps_outside_batched(case):
    return eps_outside_tail(case)


KW = {"seeds": range(3), "folds": (None,), "faults": (), "rerun": False}


def test_a_failing_callable_replays_to_the_same_verdict_and_bits(tmp_path):
    fn = CallableSubject(eps_outside_tail, process=False)
    before = set(tmp_path.iterdir())
    rep = check_kernel(fn, replay_dir=tmp_path / "cases", **KW)
    assert not rep.passed and set(tmp_path.iterdir()) - before == {tmp_path / "cases"}
    files = sorted((tmp_path / "cases").iterdir())
    assert len(files) == 3 and [str(f) for f in files] == sorted(rep.reproducers) and "reproducers: 3" in str(rep)
    case, arrays = read_reproducer(files[0])
    assert case["seed"] == 0 and case["failures"] and arrays["output"].shape == (3, 64)
    got = replay(files[0], fn)
    assert got.same_bits and got.same_verdict and not got.passed, str(got)
    assert "same verdict as written (FAIL): yes; same output bits: yes" in str(got)
    # a correct tail given on the same reproducer: another verdict, other bits, said so
    fixed = replay(files[0], CallableSubject(lambda c: stored_case_tail(c), process=False))
    assert fixed.passed and not fixed.same_verdict and not fixed.same_bits
    # never over a file: a second check into the same folder writes beside the first
    again = check_kernel(fn, replay_dir=tmp_path / "cases", **KW)
    assert len(set(again.reproducers) & set(map(str, files))) == 0 and len(list((tmp_path / "cases").iterdir())) == 6


def stored_case_tail(case):
    from workbench.tail import fused_tail

    w, _, _ = case_weights((64, 96, 80), int(case.case.rsplit(" ", 1)[1]), fold=None)
    return np.asarray(fused_tail(w, case.branch, case.residual, backend="graph"), dtype=np.float32)


def test_a_passing_check_writes_nothing(tmp_path):
    w, b, r = case_weights((64, 96, 80), 0, fold=None)
    assert stored_case(w, b, r, "x").fold is None
    rep = check_kernel(CallableSubject(stored_case_tail, process=False), replay_dir=tmp_path, **KW)
    assert rep.passed and rep.reproducers == [] and list(tmp_path.iterdir()) == []


def test_the_size_cap_refuses_before_any_case_runs(tmp_path):
    calls = []

    def fn(case):
        calls.append(1)
        return eps_outside_tail(case)

    with pytest.raises(
        ValueError, match=r"^replay_max_bytes: a reproducer of shape \(64, 96, 80\) .* over the cap of 100"
    ):
        check_kernel(fn, replay_dir=tmp_path, replay_max_bytes=100, **KW)
    assert calls == [] and list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="^replay_dir: must be a folder"):
        check_kernel(fn, replay_dir=tmp_path / "f", **KW)
    with pytest.raises(ValueError, match="^replay: .*not a reproducer"):
        (tmp_path / "f").unlink()
        from workbench.check.dump import write_layer

        w, b, r = case_weights((64, 96, 80), 0, fold=None)
        replay(write_layer(tmp_path / "d.safetensors", w, b[None], r[None], r[None]), fn)


def test_the_command_writes_and_replays_a_failing_callable(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "user_tails.py").write_text(
        "import numpy as np\n\n\ndef tail(case):\n"
        "    x = case.residual + case.branch @ case.wo.dense().T\n"
        "    nx = x / (np.sqrt((x * x).mean(-1, keepdims=True)) + np.float32(case.eps)) * case.ffn_norm\n"
        "    g, u = nx @ case.gate.dense().T, nx @ case.up.dense().T\n"
        "    return (x + (g / (1 + np.exp(-g)) * u) @ case.down.dense().T).astype(np.float32)\n"
    )
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), repo]), "PYTHONDONTWRITEBYTECODE": "1"}
    base = [sys.executable, "-m", "workbench.check", "user_tails:tail"]

    def run(*extra):
        return subprocess.run([*base, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    first = run("--seeds", "2", "--scales", "0.01", "--fold", "0", "--replay-dir", "cases")
    assert first.returncode == 1 and "reproducers: 2 written" in first.stdout, first.stdout + first.stderr
    file = sorted((tmp_path / "cases").iterdir())[0]
    again = run("--replay", str(file))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "same verdict as written (FAIL): yes; same output bits: yes" in again.stdout, again.stdout
    bad = run("--replay", str(file), "--seeds", "3")
    assert bad.returncode == 2 and "--seeds: not used by this form" in bad.stderr, bad.stderr
    missing = run("--replay", str(tmp_path / "nope.safetensors"))
    assert (
        missing.returncode == 2
        and missing.stderr.count("\n") == 1
        and "--replay: must be a reproducer" in missing.stderr
    )
