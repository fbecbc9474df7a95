"""``python -m workbench.check --part head``: each form of a head (a callable handed numpy or MLX
arrays, a model's layer, a kernels folder, a Metal source, an engine's dump written by
docs/DUMP_LAYOUT.md's own block) exits by its verdict; bad options end in one line naming the
option; a dump's bad file is named by file and tensor."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.check_user_heads import METAL_BODY, rope_interleaved, write_documented_dump
from workbench.check import check_head_dump
from workbench.check.__main__ import main

PROG = "python -m workbench.check: error: "
HEAD = "tests.check_user_heads:correct"
QUICK = ["--seeds", "6", "--positions", "0,100", "--faults", "none"]


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith(PROG) and "Traceback" not in "\n".join(err), err
    return err[-1]


def test_a_correct_numpy_head_passes_with_its_record(tmp_path, capsys):
    rec = tmp_path / "r.json"
    assert main(["--part", "head", HEAD, "--shape", "launch,model", "--seeds", "6", "--record", str(rec)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS: part head, callable 'tests.check_user_heads:correct', 60 cases in 10 conditions")
    r = json.loads(rec.read_text())
    assert r["part"] == "head" and r["passed"] and r["command"].startswith("python -m workbench.check --part head")
    assert r["caught_where"]["rope_interleaved"] and not r["caught_where"]["fold_q_only"] == []


def test_mlx_lms_qwen35_attention_handed_mlx_arrays_passes(capsys):
    assert main(["--part", "head", "tests.check_user_heads:mlx_lm_qwen35", "--arrays", "mlx", *QUICK]) == 0
    assert "PASS" in capsys.readouterr().out


def test_a_models_layer_is_the_spec_and_interleaved_rope_fails(capsys):
    argv = ["--part", "head", "tests.check_user_heads:rope_interleaved", "--model", "qwen3.5-9b", "--layer", "3"]
    assert main([*argv, *QUICK]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL: part head") and "qwen3.5-9b layer 3" in out and "position 100" in out


def test_the_kernels_folder_and_a_metal_source_with_mutants(tmp_path, capsys, emulator):
    from workbench.files import PROJECT_ROOT

    folder = tmp_path / "k"
    shutil.copytree(PROJECT_ROOT / "kernels", folder)
    assert main(["--part", "head", "--kernels-dir", str(folder), "--seeds", "6", "--faults", "none"]) == 0
    assert "kernels folder 'k'" in capsys.readouterr().out
    src = tmp_path / "head.metal"
    src.write_text(METAL_BODY)
    launch = ["--inputs", "hidden,attn_norm,q_w,k_w,v_w,q_norm,k_norm,eps,position,rope_theta", "--grid", "6"]
    launch += ["--threadgroup", "6", "--template", "HID=HID,HQ=HQ,HKV=HKV,D=D,ROT=ROT"]
    assert main(["--part", "head", "--source", str(src), *launch, *QUICK, "--seeds", "4", "--mutants"]) == 0
    out = capsys.readouterr().out
    assert "metal source 'head'" in out and "missed 0" in out
    broken = tmp_path / "broken.metal"
    broken.write_text(METAL_BODY.replace("float s = 0.0f;", "float s = 0.0f"))
    line = _refused(["--part", "head", "--source", str(broken), *launch, *QUICK], capsys)
    assert "--source" in line or "broken" in line


def test_the_documented_dump_passes_and_an_interleaved_engine_fails(tmp_path, capsys):
    good = write_documented_dump(tmp_path / "good.safetensors")
    assert main(["--part", "head", "--dump", str(good)]) == 0
    assert "PASS: part head, dump" in capsys.readouterr().out
    bad = write_documented_dump(tmp_path / "bad.safetensors", rope_interleaved)
    rep = check_head_dump(bad, faults=())
    assert not rep.passed and "not those of a correct float32 head" in rep.reasons[0]


def test_a_dump_missing_a_tensor_is_named_by_file_and_tensor(tmp_path):
    good = write_documented_dump(tmp_path / "a.safetensors")
    t = load_file(str(good))
    del t["k_norm"]
    save_file(
        t,
        str(tmp_path / "b.safetensors"),
        metadata={"q_heads": "4", "kv_heads": "1", "head_dim": "32", "eps": "1e-06", "gate": "true", "rotary_dim": "8"},
    )
    rep = check_head_dump(tmp_path, faults=())
    assert not rep.passed and rep.problems[0].startswith("part head, b.safetensors: tensor 'k_norm' is missing")
    assert np.isfinite(rep.errors["subject"]).all()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--part", "head", HEAD, "--positions", "-1"], "--positions"),
        (["--part", "head", HEAD, "--shape", "sideways"], "--shape"),
        (["--part", "head", HEAD, "--tokens", "4"], "--tokens"),
        (["--part", "head", HEAD, "--grid", "4"], "--grid"),
        (["--part", "head", HEAD, "--model", "no-such-model"], "--model"),
        (["--part", "head", HEAD, "--model", "llama-3.1-8b"], "--model"),
        (["--part", "head"], "--part head: give exactly one of"),
        ([HEAD, "--positions", "0"], "--positions"),
    ],
)
def test_bad_options_end_in_one_line_naming_the_option(argv, named, capsys):
    assert named in _refused(argv, capsys)


def test_help_lists_the_heads_inputs_shapes_and_faults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--part", "head", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for word in (
        "HeadInputs",
        "q_norm and k_norm",
        "--positions",
        "  model: the config",
        "rope_interleaved:",
        "gate_out",
    ):
        assert word in out, word
