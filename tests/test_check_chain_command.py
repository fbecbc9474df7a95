"""``python -m workbench.check --chain``: a chain written outside the workbench exits by its
verdict, the first failing link named; bad options end in one line naming the option."""

from __future__ import annotations

import json

import pytest

from workbench.check.__main__ import main

PROG = "python -m workbench.check: error: "
CHAIN = ["--chain", "tail,gdn_in,gdn"]
FEW = ["--seeds", "12"]


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith(PROG) and "Traceback" not in "\n".join(err), err
    return err[-1]


def test_too_few_cases_are_flagged_as_judging_little(capsys):
    assert main([*CHAIN, "tests.check_user_chains:qwen35_chain", "--seeds", "3"]) == 0
    assert "note: the sign test's power is below 0.5 on 3 link(s)" in capsys.readouterr().out


def test_mlx_lms_qwen35_layers_pass_and_the_record_says_so(tmp_path, capsys):
    rec = tmp_path / "chain.json"
    assert main([*CHAIN, "tests.check_user_chains:qwen35_chain", *FEW, "--record", str(rec)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("chain tail -> gdn_in -> gdn: PASS; tests.check_user_chains:qwen35_chain")
    r = json.loads(rec.read_text())
    assert r["passed"] and r["chain"] == ["tail", "gdn_in", "gdn"] and r["cases"] == 24
    assert [x["verdict"] for x in r["links"]] == ["pass"] * 3
    assert r["command"].startswith("python -m workbench.check --chain") and r["mlx_version"]


def test_a_faulty_link_fails_and_is_named(capsys):
    assert main([*CHAIN, "tests.check_user_chains:qwen35_chain_bf16_state", *FEW]) == 1
    assert "FAIL (first failing link: gdn)" in capsys.readouterr().out


def test_a_callable_a_link_the_others_the_reference(tmp_path, capsys):
    rec = tmp_path / "r.json"
    argv = [*CHAIN, "--link", "tail=tests.check_user_chains:tail_without_second_add", *FEW, "--record", str(rec)]
    assert main(argv) == 1
    assert "FAIL (first failing link: tail)" in capsys.readouterr().out
    r = json.loads(rec.read_text())
    assert r["run_by"] == ["tail_without_second_add", "reference", "reference"] and r["first_failing"] == "tail"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([*CHAIN, "--link", "tial=tests.check_user_chains:numpy_link"], "--link: 'tial' is not a link of the chain"),
        (["--chain", "tail,gdn", "tests.check_user_chains:qwen35_chain"], "--chain: link 2 gdn reads nothing"),
        (["--chain", "tail,nope", "tests.check_user_chains:qwen35_chain"], "--chain: must be one of"),
        ([*CHAIN, "no_such_module:f"], "implementation: cannot import 'no_such_module'"),
        ([*CHAIN, "tests.check_user_chains:qwen35_chain", "--gates", "sticky"], "--gates: must be one of"),
        ([*CHAIN, "tests.check_user_chains:qwen35_chain", "--dims", "v_heads=5"], "dims: v_heads must be a multiple"),
        ([*CHAIN, "tests.check_user_chains:qwen35_chain", "--fold", "16"], "--fold: options of the tail's"),
        ([*CHAIN], "give exactly one of"),
        ([*CHAIN, "--dims", "width=3", "x:y"], "--dims: must be name=value"),
    ],
)
def test_bad_options_end_in_one_line_naming_the_option(argv, says, capsys):
    assert says in _refused(argv, capsys)


def test_a_kernels_folder_as_a_link_on_the_emulator(emulator, capsys):
    argv = [*CHAIN, "--link", "tail=kernels", "--link", "gdn=kernels", "--seeds", "3", "--scales", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and out.count(" kernels ") == 2
    assert "a kernels folder runs the tail and gdn links only" in _refused([*CHAIN, "--link", "gdn_in=kernels"], capsys)
