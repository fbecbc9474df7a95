"""``python -m workbench.check`` and the check's public calls answer bad input clearly.

The command: every option given a missing, malformed, non-finite or negative value; paths
that are missing, empty, a file where a folder is needed and the reverse; an implementation
that does not import, raises at import or is not callable; a dump that is corrupt or not
safetensors; a kernels folder missing a body or whose text does not compile; a Metal source
that does not compile or is not text; ``--record`` under a file, at a folder or at an
existing record. Each must end in exit status 2 and ONE line on stderr naming the option
(``python -m workbench.check: error: ...``), never a traceback, with nothing written into
the user's files (the case folder is compared byte for byte before and after, with
bytecode writing left on, so an import that leaves ``__pycache__`` behind fails). A valid
check keeps its own statuses: 0 for a passing verdict, 1 for a failing one.

The cases run in one child process (a crash there fails the cases instead of the test
run), once a test run: they live in ``tests/check_command_cases.py``, whose outcomes
(:func:`check_outcomes`) also feed the robustness suite's tally by surface
(``tests/test_robustness_surfaces.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.check_command_cases import (
    API_CASES,
    BAD_CASES,
    CALLABLE,
    PROG,
    QUICK,
    ROOT,
    VERDICT_CASES,
    bad_case_verdict,
    check_outcomes,
)


@pytest.fixture(scope="module")
def outcomes():
    try:
        from workbench import backends

        backends.resolve_backend("metal-emulated")
    except Exception as e:
        pytest.skip(f"metal-emulated: {e}")
    return check_outcomes()


@pytest.mark.parametrize("i", range(len(BAD_CASES)), ids=[" ".join(a)[:80] or "(none)" for a, _ in BAD_CASES])
def test_bad_input_ends_in_one_line_naming_the_option(outcomes, i):
    folder, bad, _, _ = outcomes
    assert bad_case_verdict(bad[i], BAD_CASES[i][1], folder) == "clear", (BAD_CASES[i], bad[i])


@pytest.mark.parametrize("i", range(len(VERDICT_CASES)), ids=[" ".join(a)[:60] for a, _ in VERDICT_CASES])
def test_a_valid_check_exits_by_its_verdict(outcomes, i):
    """0 pass, 1 fail: never the usage error's 2, so CI tells "wrong" from "not judged"."""
    _, _, verdicts, _ = outcomes
    o = verdicts[i]
    assert o["leak"] is None and o["rc"] == VERDICT_CASES[i][1], o
    assert ("PASS" if o["rc"] == 0 else "FAIL") in o["stdout"], o


def test_nothing_in_the_users_folder_is_written(outcomes):
    """Dumps, kernel folders, sources, modules and an existing record all left as they were;
    no ``__pycache__`` beside an imported module; the one new record is the asked-for one (its JSON and
    its per-case tables)."""
    folder, _, _, changed = outcomes
    assert changed == [], changed
    rec = json.loads((Path(folder) / "new/sub/record.json").read_text())
    assert rec["form"] == "dump" and rec["passed"] is True
    assert all((Path(folder) / "new/sub" / name).is_file() for name in rec["tables"].values())
    assert json.loads((Path(folder) / "existing.json").read_text()) == {"kept": True}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no_such_module_anywhere:tail"], "implementation: cannot import"),
        (["tests.check_user_tails:correct", "--tolerance", "nan"], "argument --tolerance"),
        (["--dump", "{d}/a_file"], "--dump: no dump file could be read"),
    ],
)
def test_the_command_run_as_a_user_runs_it(tmp_path, argv, message):
    """The same through ``python -m``: one line, exit 2, nothing else on stderr."""
    (tmp_path / "a_file").write_text("x")
    r = subprocess.run(
        [sys.executable, "-m", "workbench.check", *[a.replace("{d}", str(tmp_path)) for a in argv]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and lines[-1].startswith(PROG + message), r.stderr
    assert len(lines) == 1 or lines[0].startswith("usage:"), r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        [CALLABLE, "--seeds", "3", "--scales", "1"],
        ["--part", "gdn", "tests.check_user_steps:correct", *QUICK, "--seeds", "2", "--tokens", "4"],
    ],
    ids=["tail", "gdn"],
)
@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), FileExistsError(17, "File exists")])
def test_a_record_that_cannot_be_written_keeps_the_verdict(tmp_path, monkeypatch, capsys, error, argv):
    """The record's folder filled up (or another run took the name) after the arguments were
    checked: the verdict is printed, the failure is one line, and the status is 2."""
    from workbench import files
    from workbench.check import __main__ as command

    def fail(*_a, **_k):
        raise error

    monkeypatch.setattr(files, "write_atomic", fail)
    with pytest.raises(SystemExit) as e:
        command.main([*argv, "--record", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out.startswith("PASS"), (out, err)
    assert err.strip().splitlines() == [
        f"{PROG}--record: {tmp_path / 'r.json'} was not written ({error.strerror}); "
        "the verdict printed above stands: PASS"
    ]


def test_the_traceback_is_kept_when_asked(tmp_path):
    """``WORKBENCH_TRACEBACK=1``: the error is raised, for a user reporting a bug in the check."""
    r = subprocess.run(
        [sys.executable, "-m", "workbench.check", "--dump", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "WORKBENCH_TRACEBACK": "1"},
    )
    assert r.returncode == 1 and "Traceback" in r.stderr and "ValueError: path:" in r.stderr, r.stderr[-2000:]


# --- The public calls: bad arguments are a ValueError naming the parameter ---


@pytest.mark.parametrize("name, call", API_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(API_CASES)])
def test_a_public_call_names_the_bad_parameter(name, call):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(f"{name}: ") and "\n" not in str(err.value), str(err.value)


def test_the_option_names_replace_the_parameters():
    from workbench.check.__main__ import as_option

    assert as_option("folds: block: must be x") == "--fold: block: must be x"
    assert as_option("template['X']: a name") == "--template['X']: a name"
    assert as_option("time_limit: must be\n  > 0") == "--time-limit: must be > 0"
    assert as_option("no parameter here") == "no parameter here"
    assert as_option("unknown_name: kept") == "unknown_name: kept"
