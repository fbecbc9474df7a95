"""``python -m workbench.check --part gdn``: each form of a step (a callable handed numpy or MLX
arrays, a kernels folder, a Metal source, an engine's dump written by docs/DUMP_LAYOUT.md's
own block) exits by its verdict; bad options end in one line naming the option; the tail's
command is the same without ``--part``; the user's files are only read."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.check_user_steps import METAL_BODY, METAL_HEADER, QUICK, bf16_state, write_documented_dump
from workbench.check import check_step_dump
from workbench.check.__main__ import main
from workbench.check.dump import DumpError
from workbench.check.gdn_dump import read_run

PROG = "python -m workbench.check: error: "
STEP = "tests.check_user_steps:correct"
#: Enough runs for the sign test to reject (6 seeds x 2 scales x 2 state scales), quick to run.
SMALL = [*QUICK, "--seeds", "6", "--tokens", "16"]
TINY = [*QUICK, "--seeds", "2", "--tokens", "4", "--scales", "1", "--state-scales", "1"]


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith(PROG) and "Traceback" not in "\n".join(err), err
    return err[-1]


def test_a_correct_numpy_step_passes_and_its_record_is_never_overwritten(tmp_path, capsys):
    rec = tmp_path / "r.json"
    assert main(["--part", "gdn", STEP, *SMALL, "--horizons", "1,4", "--record", str(rec)]) == 0
    assert capsys.readouterr().out.startswith("PASS: part gdn, callable 'tests.check_user_steps:correct', 24 runs")
    r = json.loads(rec.read_text())
    assert r["part"] == "gdn" and r["passed"] and r["horizons"] == [1, 4, 16]
    assert r["command"].startswith("python -m workbench.check --part gdn") and r["mlx_version"]
    line = _refused(["--part", "gdn", STEP, *SMALL, "--record", str(rec)], capsys)
    assert "--record" in line and "exists; a record is never overwritten" in line


def test_mlx_lms_ops_step_handed_mlx_arrays_passes(capsys):
    assert main(["--part", "gdn", "tests.check_user_steps:correct_mlx", "--arrays", "mlx", *SMALL]) == 0
    assert "PASS" in capsys.readouterr().out


def test_a_bfloat16_state_fails(capsys):
    assert main(["--part", "gdn", "tests.check_user_steps:bf16_state", *SMALL]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "not those of a correct float32 step" in out


def test_the_kernels_folder_and_a_metal_source_on_the_emulator(tmp_path, capsys, emulator):
    from workbench.files import PROJECT_ROOT

    folder = tmp_path / "k"
    shutil.copytree(PROJECT_ROOT / "kernels", folder)
    assert main(["--part", "gdn", "--kernels-dir", str(folder), *TINY]) == 0, capsys.readouterr().out
    src, hdr = tmp_path / "step.metal", tmp_path / "helpers.h"
    src.write_text(METAL_BODY), hdr.write_text(METAL_HEADER)
    launch = ["--grid", "6", "--threadgroup", "6", "--template", "HK=HK,HV=HV,DK=DK,DV=DV,K=K,C=C"]
    assert main(["--part", "gdn", "--source", str(src), "--header", str(hdr), *launch, *TINY]) == 0
    assert "PASS: part gdn, metal source 'step'" in capsys.readouterr().out
    line = _refused(["--part", "gdn", "--source", str(src), *launch, *TINY], capsys)  # no header: no helpers
    assert f"--source: {src} does not compile for the emulator: {src}:8:" in line, line
    assert src.read_text() == METAL_BODY  # only read


def test_mutants_of_a_metal_step_source_are_run_and_recorded(tmp_path, capsys, emulator):
    src, hdr, rec = tmp_path / "step.metal", tmp_path / "helpers.h", tmp_path / "r.json"
    src.write_text(METAL_BODY), hdr.write_text(METAL_HEADER)
    launch = ["--grid", "6", "--threadgroup", "6", "--template", "HK=HK,HV=HV,DK=DK,DV=DV,K=K,C=C"]
    argv = ["--part", "gdn", "--source", str(src), "--header", str(hdr), *launch, *TINY, "--mutants"]
    assert main([*argv, "--record", str(rec)]) == 0
    assert "step: 18 mutants; caught 18, missed 0" in capsys.readouterr().out
    r = json.loads(rec.read_text())["mutants"]
    assert r["counts"]["caught"] == 18 and r["original_same_bits"] and len(r["orders"]) == 3
    assert src.read_text() == METAL_BODY  # only read


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--part", "gdn", STEP, "--mutants"], "--mutants: only with --kernels-dir or a Metal --source"),
        (["--part", "gdn", "--kernels-dir", ".", "--mutant-files", "a.body"], "--mutant-files: only with --mutants"),
        (["--part", "gdn", "--kernels-dir", "kernels", "--mutants", "--mutant-files", "absent.body"], "'absent.body'"),
    ],
)
def test_mutant_options_are_refused_where_they_mean_nothing(argv, words, capsys):
    assert words in _refused(argv, capsys)


def test_the_documented_dump_writer_passes_and_a_bfloat16_state_dump_fails(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    for i in range(2):
        write_documented_dump(good / f"layer{i}.safetensors", seed=10 * i)
    write_documented_dump(bad / "layer0.safetensors", bf16_state)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in good.iterdir())
    rec = tmp_path / "r.json"
    assert main(["--part", "gdn", "--dump", str(good), "--horizons", "1,4", "--record", str(rec)]) == 0
    assert "PASS: part gdn, dump" in capsys.readouterr().out
    assert json.loads(rec.read_text())["form"] == "dump"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in good.iterdir()) == before  # only read
    assert main(["--part", "gdn", "--dump", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "failing files: layer0.safetensors (4 of 4 runs)" in out


def test_every_bad_dump_is_named_by_its_file_and_key(tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    write_documented_dump(tmp_path / "a_good.safetensors")
    t = load_file(tmp_path / "a_good.safetensors")
    meta = {"eps": "1e-06"}
    cases = {
        "b_missing.safetensors": ({k: v for k, v in t.items() if k != "state_out"}, meta, "tensor 'state_out' is"),
        "c_shape.safetensors": ({**t, "z": t["z"][:, :, :-1]}, meta, "tensor 'z' has shape (4, 12, 191)"),
        "d_eps.safetensors": (t, {}, "metadata 'eps' is missing"),
        "e_heads.safetensors": (t, {**meta, "k_heads": "3"}, "metadata 'k_heads' is '3'"),
        "f_width.safetensors": ({**t, "o_norm": t["o_norm"][:-1]}, meta, "tensor 'conv_w' has 320 channels"),
        "g_length.safetensors": (
            {**t, **{k: t[k][:, :6] for k in ("mixed", "z", "b", "a", "out", "conv_state_out", "state_out")}},
            meta,
            "holds 6 tokens, the first file read 12",
        ),
    }
    for name, (tensors, md, _) in cases.items():
        save_file(tensors, str(tmp_path / name), metadata=md)
    for name, (_, _, words) in list(cases.items())[:-1]:
        with pytest.raises(DumpError) as e:
            read_run(tmp_path / name)
        assert str(e.value).startswith(f"{name}: ") and words in str(e.value), str(e.value)
    rep = check_step_dump(tmp_path, faults=())
    assert not rep.passed and len(rep.problems) == len(cases)
    for name, (_, _, words) in cases.items():
        assert any(p.startswith(name) and words in p for p in rep.problems), (name, rep.problems)
        assert f"{name} (not read)" in rep.reasons[-1]
    assert main(["--part", "gdn", "--dump", str(tmp_path), "--faults", "none"]) == 1
    out = capsys.readouterr().out
    assert all(name in out for name in cases)


def test_a_nan_in_the_engines_output_names_file_sequence_and_token(tmp_path):
    from safetensors.numpy import load_file, save_file

    write_documented_dump(tmp_path / "x.safetensors")
    t = load_file(tmp_path / "x.safetensors")
    t["out"][2, 5, 0] = float("nan")
    save_file(t, str(tmp_path / "x.safetensors"), metadata={"eps": "1e-06"})
    rep = check_step_dump(tmp_path, faults=())
    assert rep.problems == ["part gdn, file x.safetensors sequence 2, token 6: tensor out: not finite (NaN or inf)"]
    assert "failing files: x.safetensors (1 of 4 runs)" in rep.reasons


def test_the_parts_options_and_inputs_are_in_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--part", "gdn", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for words in (
        "--tokens",
        "--horizons",
        "--gates",
        "--state-scales",
        "--geometries",
        "--header",
        "StepInputs",
        "mixed [C]",
        "state_bfloat16",
        "near_one",
        "--time-limit",
        "--record",
    ):
        assert words in out, words
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--part {tail,gdn," in capsys.readouterr().out  # the parts' registry: gdn beside the tail and the others


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--part", "gdn", STEP, "--fold", "16"], "--fold: options of the tail's check, not used by --part gdn"),
        (["tests.check_user_tails:correct", "--tokens", "5"], "--tokens: options of --part gdn"),
        (["--part", "gdn", "--dump", "x", "--seeds", "3"], "--seeds: not used by this form of the check"),
        (["--part", "gdn", STEP, "--grid", "6"], "--grid: not used by this form of the check"),
    ],
)
def test_an_option_of_the_other_part_is_refused_by_name(argv, words, capsys):
    assert words in _refused(argv, capsys)


def test_a_token_past_the_time_limit_is_named_and_the_check_goes_on(capsys):
    assert main(["--part", "gdn", "tests.check_user_steps:hangs_once", *TINY, "--time-limit", "0.3"]) == 1
    out = capsys.readouterr().out
    assert "seed 0, token 2: no result within the 0.3 s limit (its process was ended)" in out, out
    assert "problems (1):" in out  # the other run went on
