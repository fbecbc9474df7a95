"""``python -m workbench.check`` on each form: a dump folder, a Metal source with its launch
(and its mutants), bad arguments refused with exit status 2; the exit status follows the verdict."""

import json

import pytest

from tests.test_check_dump import _write
from tests.test_check_source import TAIL_SOURCE
from workbench import backends
from workbench.check.__main__ import main

LAUNCH_ARGS = [
    "--inputs",
    "branch,residual,wo,ffn_norm,gate,up,down,eps",
    "--grid",
    "32",
    "--threadgroup",
    "32",
    "--template",
    "HIDDEN=hidden,BRANCH=branch,FFN=ffn,THREADS=32",
]


def test_a_dump_folder_exits_by_its_verdict(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    _write(good / "layer0.safetensors")
    _write(bad / "layer0.safetensors", eps_outside=True)
    rec = tmp_path / "r.json"
    assert main(["--dump", str(good), "--record", str(rec)]) == 0
    r = json.loads(rec.read_text())
    assert r["form"] == "dump" and r["command"].startswith("python -m workbench.check --dump")
    assert r["mlx_version"] and r["date"].endswith("+00:00")
    assert main(["--dump", str(bad)]) == 1
    assert "FAIL" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--dump", str(good), "--record", str(rec)])  # a record is never overwritten
    assert e.value.code == 2 and "exists" in capsys.readouterr().err


def test_a_metal_source_and_its_mutants(tmp_path, capsys, emulator):
    src = tmp_path / "tail.metal"
    src.write_text(TAIL_SOURCE)
    rec = tmp_path / "r.json"
    code = main(
        [
            "--source",
            str(src),
            *LAUNCH_ARGS,
            "--seeds",
            "4",
            "--scales",
            "0.01,1",
            "--tolerance",
            "1e-4",
            "--mutants",
            "--record",
            str(rec),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    r = json.loads(rec.read_text())
    assert r["form"] == "metal source" and r["mutants"]["counts"]["missed"] == 0
    assert r["mutants"]["counts"]["caught"] > 10 and r["mutants"]["original_same_bits"]
    assert src.read_text() == TAIL_SOURCE  # only read


def test_a_callable_handed_mlx_arrays(capsys):
    assert main(["tests.check_user_tails:correct_mlx", "--arrays", "mlx", "--seeds", "20", "--scales", "1"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,msg",
    [
        (["tests.check_user_tails:correct", "--dump", "x"], "exactly one"),
        (["--source", "absent.metal", *LAUNCH_ARGS], "--source"),
        (["--dump", "absent_folder"], "--dump: must be a dump file"),
        (["tests.check_user_tails:correct", "--mutants"], "--mutants"),
        (["--dump", "x", "--mutant-files", "a.body"], "--mutant-files"),
    ],
)
def test_bad_arguments_exit_2_naming_them(args, msg, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_a_cuda_source_without_an_nvidia_gpu_says_why(tmp_path, capsys):
    if "cuda" in backends.available_backends():
        pytest.skip("an NVIDIA GPU is present: the CUDA form runs")
    src = tmp_path / "t.cu"
    src.write_text(TAIL_SOURCE)
    with pytest.raises(SystemExit) as e:
        main(["--source", str(src), *LAUNCH_ARGS, "--language", "cuda", "--run-on", "device"])
    assert e.value.code == 2 and "cuda" in capsys.readouterr().err.lower()


def test_a_bad_template_is_named(tmp_path, capsys):
    src = tmp_path / "t.metal"
    src.write_text(TAIL_SOURCE)
    with pytest.raises(SystemExit) as e:
        main(["--source", str(src), "--inputs", "branch", "--template", "HIDDEN=lots"])
    assert e.value.code == 2 and "--template" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,named",
    [
        (["--seeds", "5"], "--seeds"),
        (["--scales=0.01,1", "--fold", "0"], "--fold, --scales"),
        (["--grid", "64"], "--grid"),
    ],
)
def test_an_option_the_dump_form_does_not_read_is_refused(tmp_path, capsys, extra, named):
    """A dump is judged as dumped (its own cases, fold and weights): an option that would
    change the check elsewhere is refused, not ignored."""
    _write(tmp_path / "layer0.safetensors")
    with pytest.raises(SystemExit) as e:
        main(["--dump", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and named in err and "not used" in err


def test_a_launch_option_without_a_source_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["tests.check_user_tails:correct", "--threadgroup", "64"])
    assert e.value.code == 2 and "--threadgroup" in capsys.readouterr().err


def test_the_readmes_source_example_runs_as_written(tmp_path, capsys, emulator):
    """The README's `--source` line, its options as printed there (fewer seeds and one scale,
    for time), on a correct tail: it runs and passes, so the example is one a user can copy."""
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = readme.index("python -m workbench.check --source")
    line = readme[start : readme.index("\n", readme.index("\n", start) + 1)].replace("\\\n", " ")
    argv = shlex.split(line)[3:]  # after "python -m workbench.check"
    src = tmp_path / "tail.metal"
    src.write_text(TAIL_SOURCE.replace("THREADS", "32"))  # the README's template names no THREADS
    argv[argv.index("tail.metal")] = str(src)
    assert main([*argv, "--seeds", "2", "--scales", "1"]) == 0, capsys.readouterr().out
