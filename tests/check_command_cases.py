"""The cases of ``python -m workbench.check`` and of the check's public calls, run once.

Two test files read them: ``tests/test_robustness_check_command.py`` (a test a case) and
``tests/test_robustness_surfaces.py`` (the tally by surface). Both import this module by
one name, so :func:`check_outcomes`' cache is one cache and the child that runs every case
runs once a test run (a test file imported under a second name would run it again).
Without clang the kernel forms' cases cannot run: :func:`tally_rows` then raises
``BackendUnavailable``, which each reader handles (a skip, or the surface left out).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROG = "python -m workbench.check: error: "
INPUTS = ["--inputs", "branch,residual,wo,ffn_norm,gate,up,down,eps"]
TEMPLATE = ["--template", "HIDDEN=hidden,BRANCH=branch,FFN=ffn,THREADS=32"]
CALLABLE = "tests.check_user_tails:correct"
#: A small, quick run of the step (one geometry, one gate regime, no fault models).
QUICK = ["--geometries", "2/6/32/32/4", "--gates", "typical", "--faults", "none"]


def check_case_files(d: Path) -> None:
    """The files the cases below are handed: a user's folder as the command meets it."""
    from tests.test_check_dump import _write
    from tests.test_check_source import TAIL_SOURCE

    (d / "a_file").write_text("not a folder\n")
    (d / "folder").mkdir()
    (d / "existing.json").write_text('{"kept": true}\n')
    (d / "garbage.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    (d / "text.safetensors").write_text("this is not a safetensors file\n")
    (d / "huge_header.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    (d / "not_a_dump.txt").write_text("x\n")
    (d / "bad_dumps").mkdir()
    (d / "bad_dumps" / "a.safetensors").write_bytes(bytes(range(256)))
    (d / "mixed_dumps").mkdir()
    _write(d / "mixed_dumps" / "good.safetensors", n=8)
    (d / "mixed_dumps" / "zz_truncated.safetensors").write_bytes(
        (d / "mixed_dumps" / "good.safetensors").read_bytes()[:300]
    )
    _write(d / "good.safetensors", n=8)
    for name, change in (("k_missing", "drop"), ("k_broken", "break"), ("k_no_prelude", "prelude")):
        k = d / name
        k.mkdir()
        for f in (ROOT / "kernels").iterdir():
            if f.suffix in (".h", ".body"):
                shutil.copy(f, k / f.name)
        if change == "drop":
            (k / "ffn_down.body").unlink()
        elif change == "prelude":
            (k / "prelude_metal.h").write_text("// no body mark\n")
        else:  # a declaration without its semicolon: clang refuses the body
            body = (k / "ffn_down.body").read_text().splitlines(keepends=True)
            i = next(j for j, line in enumerate(body) if line.rstrip().endswith(";") and "//" not in line)
            body[i] = body[i].rstrip()[:-1] + " oops;\n"
            (k / "ffn_down.body").write_text("".join(body))
    (d / "good.metal").write_text(TAIL_SOURCE)
    (d / "broken.metal").write_text(TAIL_SOURCE.replace(";", " oops;", 1))
    (d / "empty.metal").write_text("")
    (d / "binary.metal").write_bytes(b"\xff\xfe\x00\x01kernel")
    (d / "mod_ok.py").write_text("NOT_A_FUNCTION = 3\n\ndef tail(case):\n    return None\n")
    (d / "mod_raises.py").write_text("raise RuntimeError('the user module fails at import')\n")
    (d / "mod_syntax.py").write_text("def tail(case:\n")
    (d / "mod_exits.py").write_text("import sys\nsys.exit(3)\n")
    (d / "mod_missing_dep.py").write_text("import a_package_that_is_not_installed\n")
    gdn_case_files(d)


def gdn_case_files(d: Path) -> None:
    """The step's files: its dumps (written by docs/DUMP_LAYOUT.md's block), a kernels folder
    whose gdn_step.body does not compile, a step body."""
    from tests.check_user_steps import METAL_BODY, write_documented_dump

    write_documented_dump(d / "gdn_good.safetensors")
    (d / "gdn_mixed").mkdir()
    write_documented_dump(d / "gdn_mixed" / "a.safetensors")
    (d / "gdn_mixed" / "b_truncated.safetensors").write_bytes((d / "gdn_good.safetensors").read_bytes()[:400])
    (d / "gdn_broken").mkdir()
    for f in (ROOT / "kernels").iterdir():
        if f.suffix in (".h", ".body"):
            shutil.copy(f, d / "gdn_broken" / f.name)
    with (d / "gdn_broken" / "gdn_step.body").open("a") as f:
        f.write("\n this is not Metal \n")
    (d / "gdn_step.metal").write_text(METAL_BODY)


#: (argv with {d} for the case folder, what the last line of stderr must say after the
#: program's name). Every case is bad in exactly one way and must be refused before any
#: case of the check runs.
BAD_CASES: list[tuple[list[str], str]] = [
    # the implementation: module:function
    (["no_such_module_anywhere:tail"], "implementation: cannot import 'no_such_module_anywhere'"),
    (["os:path"], "implementation: os:path is module, not a function"),
    (["mod_ok:NOT_A_FUNCTION"], "implementation: mod_ok:NOT_A_FUNCTION is int, not a function"),
    (["os:no_such_function"], "implementation: module 'os' has no attribute 'no_such_function'"),
    (["os"], "implementation: must be 'module:function', got 'os'"),
    ([":tail"], "implementation: must be 'module:function'"),
    (["mod_ok:"], "implementation: must be 'module:function'"),
    (["mod_raises:tail"], "implementation: importing 'mod_raises' raised RuntimeError: the user module fails"),
    (["mod_syntax:tail"], "implementation: importing 'mod_syntax' raised SyntaxError"),
    (["mod_exits:tail"], "implementation: importing 'mod_exits' raised SystemExit: 3"),
    (
        ["mod_missing_dep:tail"],
        "implementation: importing 'mod_missing_dep' raised ModuleNotFoundError: No module "
        "named 'a_package_that_is_not_installed'",
    ),
    (["..:tail"], "implementation: the module must be named in full (mypkg.tails), got '..'"),
    ([".tails:tail"], "implementation: the module must be named in full"),
    ([CALLABLE, "--arrays", "jax"], "argument --arrays: invalid choice: 'jax'"),
    # numbers
    *[
        ([CALLABLE, "--tolerance", v], f"argument --tolerance: must be a finite number >= 0, got '{v}'")
        for v in ("nan", "inf", "-1")
    ],
    ([CALLABLE, "--tolerance=-1e-9"], "argument --tolerance: must be a finite number >= 0, got '-1e-9'"),
    ([CALLABLE, "--tolerance=-inf"], "argument --tolerance: must be a finite number >= 0, got '-inf'"),
    ([CALLABLE, "--tolerance", "-inf"], "argument --tolerance: expected one argument"),  # argparse: an option
    ([CALLABLE, "--tolerance", "tiny"], "argument --tolerance: must be a number, got 'tiny'"),
    ([CALLABLE, "--tolerance"], "argument --tolerance: expected one argument"),
    *[
        ([CALLABLE, "--time-limit", v], f"argument --time-limit: must be a finite number > 0, got '{v}'")
        for v in ("nan", "inf", "0", "-5")
    ],
    *[
        ([CALLABLE, "--seeds", v], "argument --seeds: must be an integer in 1..1000000")
        for v in ("0", "-1", "1000000000000")
    ],
    ([CALLABLE, "--seeds", "1.5"], "argument --seeds: must be an integer, got '1.5'"),
    ([CALLABLE, "--seeds", "nan"], "argument --seeds: must be an integer, got 'nan'"),
    *[
        ([CALLABLE, "--scales", v], f"argument --scales: must be a finite number > 0, got '{v.split(',')[-1]}'")
        for v in ("nan", "inf", "0", "-1", "1,-0.5")
    ],
    *[([CALLABLE, "--scales", v], "argument --scales: must be comma-separated numbers > 0") for v in ("", ",", "1,,2")],
    ([CALLABLE, "--scales", "one"], "argument --scales: must be a number, got 'one'"),
    ([CALLABLE, "--fold", "-1"], "argument --fold: must be an integer in 0..1048576, got -1"),
    ([CALLABLE, "--fold", "x"], "argument --fold: must be an integer, got 'x'"),
    ([CALLABLE, "--fold", "7"], "--fold: block: must be m * 2**k"),
    ([CALLABLE, "--fold", "1024"], "--fold"),
    # --record: checked before the check runs
    (
        [CALLABLE, "--record", "{d}/a_file/r.json"],
        "argument --record: {d}/a_file/r.json lies under {d}/a_file, which is not a folder",
    ),
    ([CALLABLE, "--record", "{d}/a_file/deeper/r.json"], "lies under {d}/a_file, which is not a folder"),
    ([CALLABLE, "--record", "{d}/folder"], "argument --record: {d}/folder is a folder; name the record's file"),
    (
        [CALLABLE, "--record", "{d}/existing.json"],
        "argument --record: {d}/existing.json exists; a record is never overwritten",
    ),
    ([CALLABLE, "--record", ""], "argument --record: an empty path"),
    ([CALLABLE, "--record", "/proc/r.json"], "argument --record: /proc/r.json: /proc cannot be written"),
    # the forms, given together, not at all, or empty
    ([], "give exactly one of: implementation (module:function), --kernels-dir, --source, --dump"),
    ([CALLABLE, "--dump", "{d}/good.safetensors"], "give exactly one of"),
    (["--kernels-dir", "{d}/k_missing", "--source", "{d}/good.metal"], "give exactly one of"),
    ([CALLABLE, "--mutants"], "--mutants: only with --kernels-dir or a --source run on the emulator"),
    (
        ["--dump", "{d}/good.safetensors", "--mutant-files", "common.h"],
        "--mutant-files: only with --mutants and --kernels-dir",
    ),
    (["--unknown-option"], "unrecognized arguments: --unknown-option"),
    # --dump
    (["--dump", ""], "argument --dump: an empty path"),
    (["--dump", "{d}/missing"], "--dump: must be a dump file or a folder of them, got '{d}/missing' (not found)"),
    (["--dump", "{d}/folder"], "--dump: the folder '{d}/folder' holds no .safetensors files"),
    (["--dump", "{d}/a_file"], "--dump: no dump file could be read: a_file: not a readable safetensors file"),
    (["--dump", "{d}/not_a_dump.txt"], "--dump: no dump file could be read: not_a_dump.txt"),
    (["--dump", "{d}/garbage.safetensors"], "--dump: no dump file could be read: garbage.safetensors"),
    (["--dump", "{d}/text.safetensors"], "--dump: no dump file could be read: text.safetensors"),
    (["--dump", "{d}/huge_header.safetensors"], "--dump: no dump file could be read: huge_header.safetensors"),
    (["--dump", "{d}/bad_dumps"], "--dump: no dump file could be read: a.safetensors"),
    (["--dump", "{d}/good.safetensors", "--tolerance", "nan"], "argument --tolerance"),
    # --kernels-dir
    (["--kernels-dir", ""], "argument --kernels-dir: an empty path"),
    (["--kernels-dir", "{d}/missing"], "--kernels-dir: must be a folder shaped like kernels/, got '{d}/missing'"),
    (["--kernels-dir", "{d}/a_file"], "--kernels-dir: must be a folder shaped like kernels/, got '{d}/a_file'"),
    (
        ["--kernels-dir", "{d}/folder"],
        "--kernels-dir: {d}/folder is not shaped like kernels/: kernel source 'prelude_metal.h' not found",
    ),
    (
        ["--kernels-dir", "{d}/k_missing"],
        "--kernels-dir: {d}/k_missing is not shaped like kernels/: kernel source 'ffn_down.body' not found",
    ),
    (["--kernels-dir", "{d}/k_no_prelude"], "--kernels-dir: {d}/k_no_prelude: prelude_metal.h must contain"),
    (
        ["--kernels-dir", "{d}/k_broken", "--seeds", "2"],
        "--kernels-dir: {d}/k_broken does not compile for the emulator: metal_source:",
    ),
    (
        ["--kernels-dir", str(ROOT / "kernels"), "--mutants", "--mutant-files", "nope.body"],
        "--mutant-files: 'nope.body' is not a file of",
    ),
    (
        ["--kernels-dir", str(ROOT / "kernels"), "--mutants", "--mutant-files", ""],
        "--mutant-files: must be comma-separated file names",
    ),
    (
        ["--kernels-dir", str(ROOT / "kernels"), "--mutants", "--mutant-files", "common.h,,ffn_down.body"],
        "--mutant-files: must be comma-separated file names",
    ),
    # --source and its launch
    (["--source", ""], "argument --source: an empty path"),
    (
        ["--source", "{d}/missing.metal", *INPUTS],
        "--source: must be a file holding the kernel body, got '{d}/missing.metal' (not a file)",
    ),
    (["--source", "{d}/folder", *INPUTS], "--source: must be a file holding the kernel body, got '{d}/folder'"),
    (["--source", "{d}/empty.metal", *INPUTS], "--source: must be the kernel body as a non-empty string"),
    (["--source", "{d}/binary.metal", *INPUTS], "--source: {d}/binary.metal is not UTF-8 text (byte 0)"),
    (
        ["--source", "{d}/broken.metal", *INPUTS, *TEMPLATE],
        "--source: {d}/broken.metal does not compile for the emulator: {d}/broken.metal:2:",
    ),
    (["--source", "{d}/good.metal"], "--inputs: a source needs its inputs' names"),
    (["--source", "{d}/good.metal", "--inputs", "branch,nope"], "--inputs: must be distinct names of"),
    (["--source", "{d}/good.metal", "--inputs", "branch,branch"], "--inputs: must be distinct names of"),
    (["--source", "{d}/good.metal", "--inputs", ""], "--inputs: a source needs its inputs' names"),
    (["--source", "{d}/good.metal", *INPUTS, "--output", ""], "--output: must be an identifier other than"),
    (["--source", "{d}/good.metal", *INPUTS, "--output", "branch"], "--output: must be an identifier other than"),
    (["--source", "{d}/good.metal", *INPUTS, "--output", "a b"], "--output: must be an identifier other than"),
    *[
        (["--source", "{d}/good.metal", *INPUTS, "--grid", v], "argument --grid: must be an integer")
        for v in ("0", "-32", "x", "4294967296")
    ],
    *[
        (["--source", "{d}/good.metal", *INPUTS, "--threadgroup", v], "argument --threadgroup: must be an integer")
        for v in ("0", "-1", "1025", "32.0")
    ],
    (["--source", "{d}/good.metal", *INPUTS, "--template", "HIDDEN"], "--template: items must be NAME=value"),
    (["--source", "{d}/good.metal", *INPUTS, "--template", "=3"], "--template: items must be NAME=value"),
    (
        ["--source", "{d}/good.metal", *INPUTS, "--template", "HIDDEN=lots"],
        "--template: HIDDEN's value must be a finite number or one of",
    ),
    (
        ["--source", "{d}/good.metal", *INPUTS, "--template", "HIDDEN=nan"],
        "--template: HIDDEN's value must be a finite number",
    ),
    (["--source", "{d}/good.metal", *INPUTS, "--template", "HIDDEN=1e999"], "--template: HIDDEN's value must be"),
    (["--source", "{d}/good.metal", *INPUTS, "--language", "cuda"], "--run-on: a CUDA source runs on the device only"),
    (["--source", "{d}/good.metal", *INPUTS, "--language", "fortran"], "argument --language: invalid choice"),
    (["--source", "{d}/good.metal", *INPUTS, "--run-on", "cloud"], "argument --run-on: invalid choice"),
    (["--source", "{d}/good.metal", *INPUTS, "--run-on", "device", "--mutants"], "--mutants: only with"),
]

#: ``--part gdn``: the same rule, each case bad in one way.
GDN = ["--part", "gdn"]
STEP = [*GDN, "tests.check_user_steps:correct"]
STEP_LAUNCH = ["--grid", "6", "--threadgroup", "6", "--template", "HK=HK,HV=HV,DK=DK,DV=DV,K=K,C=C"]
BAD_CASES += [
    (["--part", "attention"], "argument --part: invalid choice: 'attention'"),
    (["--part"], "argument --part: expected one argument"),
    (GDN, "--part gdn: give exactly one of: implementation (module:function), --kernels-dir, --source, --dump"),
    ([*STEP, "--dump", "{d}/gdn_good.safetensors"], "--part gdn: give exactly one of"),
    ([*GDN, "no_such_module_anywhere:step"], "implementation: cannot import 'no_such_module_anywhere'"),
    ([*GDN, "mod_ok:NOT_A_FUNCTION"], "implementation: mod_ok:NOT_A_FUNCTION is int, not a function (StepInputs"),
    ([*GDN, "mod_syntax:step"], "implementation: importing 'mod_syntax' raised SyntaxError"),
    ([*STEP, "--arrays", "jax"], "argument --arrays: invalid choice: 'jax'"),
    *[([*STEP, "--tokens", v], "argument --tokens: must be an integer in 1..1048576") for v in ("0", "-3", "2000000")],
    ([*STEP, "--tokens", "many"], "argument --tokens: must be an integer, got 'many'"),
    *[([*STEP, "--horizons", v], "argument --horizons: must be comma-separated integers >= 1") for v in ("", "1,,4")],
    ([*STEP, "--horizons", "0"], "argument --horizons: must be an integer in 1..1048576, got 0"),
    ([*STEP, "--horizons", "1,x"], "argument --horizons: must be an integer, got 'x'"),
    ([*STEP, "--seeds", "0"], "argument --seeds: must be an integer in 1..1000000"),
    ([*STEP, "--scales", "0"], "argument --scales: must be a finite number > 0, got '0'"),
    ([*STEP, "--scales", "1,,2"], "argument --scales: must be comma-separated numbers > 0"),
    ([*STEP, "--state-scales", "-1"], "argument --state-scales: must be a finite number >= 0, got '-1'"),
    ([*STEP, "--state-scales", "nan"], "argument --state-scales: must be a finite number >= 0, got 'nan'"),
    ([*STEP, "--gates", "slow"], "argument --gates: must be comma-separated gate regimes of typical, near_one"),
    ([*STEP, "--gates", ""], "argument --gates: must be comma-separated gate regimes of"),
    ([*STEP, "--faults", "nope"], "argument --faults: must be comma-separated fault models of state_bfloat16"),
    ([*STEP, "--geometries", "2/6/32/32"], "argument --geometries: must be comma-separated Hk/Hv/Dk/Dv/K"),
    ([*STEP, "--geometries", "2/6/0/32/4"], "argument --geometries: must be an integer in 1..65536, got 0"),
    ([*STEP, "--geometries", "3/4/32/32/4"], "--geometries: Hv must be a multiple of Hk, got Hk 3, Hv 4"),
    ([*STEP, "--geometries", "2/6/32/32/1"], "--geometries: K (the conv width) must be >= 2, got 1"),
    ([*STEP, "--tolerance", "nan"], "argument --tolerance: must be a finite number >= 0, got 'nan'"),
    ([*STEP, "--time-limit", "0"], "argument --time-limit: must be a finite number > 0, got '0'"),
    ([*STEP, "--record", "{d}/existing.json"], "argument --record: {d}/existing.json exists; a record is never"),
    ([*STEP, "--record", "{d}/a_file/r.json"], "argument --record: {d}/a_file/r.json lies under {d}/a_file"),
    ([*STEP, "--fold", "16"], "--fold: options of the tail's check, not used by --part gdn"),
    ([*STEP, "--mutants"], "--mutants: only with --kernels-dir or a Metal --source run on the emulator"),
    ([CALLABLE, "--tokens", "16"], "--tokens: options of --part gdn (the recurrent step), not of the tail's check"),
    ([CALLABLE, "--part", "tail", "--geometries", "2/6/32/32/4"], "--geometries: options of --part gdn"),
    ([*STEP, "--grid", "6"], "--grid: not used by this form of the check"),
    ([*GDN, "--dump", "{d}/gdn_good.safetensors", "--tokens", "4"], "--tokens: not used by this form of the check"),
    ([*GDN, "--dump", "{d}/gdn_good.safetensors", "--arrays", "mlx"], "--arrays: not used by this form"),
    ([*GDN, "--dump", ""], "argument --dump: an empty path"),
    ([*GDN, "--dump", "{d}/missing"], "--dump: must be a dump file or a folder of them, got '{d}/missing'"),
    ([*GDN, "--dump", "{d}/folder"], "--dump: the folder '{d}/folder' holds no .safetensors files"),
    ([*GDN, "--dump", "{d}/good.safetensors"], "--dump: no dump file could be read: good.safetensors: tensor 'conv_w'"),
    ([*GDN, "--dump", "{d}/text.safetensors"], "--dump: no dump file could be read: text.safetensors: not a readable"),
    ([*GDN, "--dump", "{d}/bad_dumps"], "--dump: no dump file could be read: a.safetensors"),
    ([*GDN, "--kernels-dir", "{d}/missing"], "--kernels-dir: must be a folder shaped like kernels/, got '{d}/missing'"),
    (
        [*GDN, "--kernels-dir", "{d}/folder"],
        "--kernels-dir: must be a folder shaped like kernels/ holding gdn_step.body",
    ),
    ([*GDN, "--kernels-dir", "{d}/gdn_broken"], "--kernels-dir: {d}/gdn_broken does not compile for the emulator"),
    ([*GDN, "--source", "{d}/missing.metal"], "--source: must be a file holding the step's kernel body, got"),
    ([*GDN, "--source", "{d}/binary.metal"], "--source: {d}/binary.metal is not UTF-8 text (byte 0)"),
    ([*GDN, "--source", "{d}/empty.metal"], "--source: must be the kernel body as a non-empty string"),
    ([*GDN, "--source", "{d}/gdn_step.metal", "--header", "{d}/missing.h"], "--header: must be a file holding"),
    ([*GDN, "--source", "{d}/gdn_step.metal", "--inputs", "mixed,nope"], "--inputs: must be distinct names of"),
    ([*GDN, "--source", "{d}/gdn_step.metal", "--template", "HV=lots"], "--template: HV's value must be a finite"),
    ([*GDN, "--source", "{d}/gdn_step.metal", "--template", "HV"], "--template: items must be NAME=value"),
    ([*GDN, "--source", "{d}/gdn_step.metal", "--language", "cuda"], "--run-on: a CUDA source runs on the device"),
    (
        [*GDN, "--source", "{d}/gdn_step.metal", *STEP_LAUNCH],
        "--source: {d}/gdn_step.metal does not compile for the emulator: {d}/gdn_step.metal:8:",
    ),
]

#: Valid checks: (argv, the exit status their verdict documents: 0 pass, 1 fail).
VERDICT_CASES: list[tuple[list[str], int]] = [
    ([CALLABLE, "--seeds", "5", "--scales", "0.01,1"], 0),
    (["tests.check_user_tails:eps_outside", "--seeds", "20", "--scales", "0.01,1"], 1),
    (["mod_ok:tail", "--seeds", "2", "--scales", "1"], 1),  # returns None: no usable result is a failing verdict
    (["--dump", "{d}/good.safetensors", "--record", "{d}/new/sub/record.json"], 0),
    (["--dump", "{d}/mixed_dumps"], 1),  # one good file judged, the truncated one named among the problems
    (["--source", "{d}/good.metal", *INPUTS, *TEMPLATE, "--seeds", "3", "--scales", "1"], 0),
    ([*STEP, *QUICK, "--seeds", "6", "--tokens", "16"], 0),
    ([*GDN, "tests.check_user_steps:bf16_state", *QUICK, "--seeds", "6", "--tokens", "16"], 1),
    ([*GDN, "--dump", "{d}/gdn_good.safetensors", "--faults", "none"], 0),
    ([*GDN, "--dump", "{d}/gdn_mixed", "--faults", "none"], 1),  # the truncated file named, the good one judged
]

#: The child: every case in this one process, each one's exit status, any exception that
#: escaped ``main`` (a leak) and stderr, one JSON line a case.
_CHILD = r"""
import contextlib, io, json, sys, traceback
cases, folder = json.loads(sys.stdin.read())
sys.path.insert(0, folder)
from workbench.check.__main__ import main
for argv in cases:
    err, out = io.StringIO(), io.StringIO()
    leak = None
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
    except BaseException as e:
        rc, leak = None, "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
    print(json.dumps({"rc": rc, "leak": leak, "stderr": err.getvalue()[-3000:], "stdout": out.getvalue()[:300]}),
          flush=True)
"""


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name -> SHA-256 of its bytes)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@functools.cache
def check_outcomes() -> tuple[str, list[dict], list[dict], list[str]]:
    """``(case folder, bad cases' outcomes, verdict cases' outcomes, files changed in the
    folder)``: every case run once in one child (bytecode writing on), the folder compared
    before and after (the verdict cases' own record is the one file allowed to appear)."""
    d = Path(tempfile.mkdtemp(prefix="check_command_cases_"))
    check_case_files(d)
    before = _snapshot(d)
    argvs = [[a.replace("{d}", str(d)) for a in argv] for argv, _ in BAD_CASES + VERDICT_CASES]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "WORKBENCH_TRACEBACK")}
    r = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps([argvs, str(d)]),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=env,
    )
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(rows) == len(argvs), (r.returncode, r.stderr[-3000:])
    after = _snapshot(d)
    # the asked-for record: its JSON and its per-case tables in Parquet beside it
    record = {"new/sub/record.json", "new/sub/record.cases.parquet", "new/sub/record.faults.parquet"}
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and k not in record)
    return str(d), rows[: len(BAD_CASES)], rows[len(BAD_CASES) :], changed


def bad_case_verdict(outcome: dict, expected: str, folder: str) -> str:
    """``clear``: exit 2, no traceback, stderr ONE line: the program's name, then the expected
    words; ``unclear``: refused with exit 2 in other words or more lines; ``other``: anything
    else (accepted, a leak, a traceback, another status)."""
    lines = outcome["stderr"].strip().splitlines()
    if outcome["leak"] is not None or outcome["rc"] != 2 or "Traceback" in outcome["stderr"] or not lines:
        return "other"
    last = lines[-1]
    one_line = len(lines) == 1 or lines[0].startswith("usage:")  # argparse's own syntax errors show the usage
    ok = one_line and last.startswith(PROG) and expected.replace("{d}", folder) in last
    return "clear" if ok else "unclear"


def tally_rows() -> dict[str, tuple[int, int]]:
    """The command's rows for the robustness suite's tally: (tried, clear or correct);
    ``BackendUnavailable`` without the emulator's compiler (the kernel forms' cases need it)."""
    from workbench import backends

    backends.resolve_backend("metal-emulated")
    folder, bad, verdicts, _ = check_outcomes()
    clear = sum(bad_case_verdict(o, e, folder) == "clear" for o, (_, e) in zip(bad, BAD_CASES))
    right = sum(o["rc"] == want and o["leak"] is None for o, (_, want) in zip(verdicts, VERDICT_CASES))
    api = [_api_clear(call, name) for name, call in API_CASES]
    return {
        "python -m workbench.check": (len(bad) + len(verdicts), clear + right),
        "check_kernel/dump calls": (len(api), sum(api)),
    }


def _tail(case):
    from tests.check_user_tails import correct

    return correct(case)


def _api_cases():
    from workbench import check_kernel
    from workbench.check import (
        CallableSubject,
        KernelsFolderSubject,
        SourceLaunch,
        SourceSubject,
        check_dump,
        check_step_dump,
    )

    few = {"seeds": range(2), "scales": (1.0,)}
    return [
        ("subject", lambda: check_kernel(3, **few)),
        ("subject", lambda: check_kernel(None, **few)),
        ("subject", lambda: check_kernel("tests.check_user_tails:correct", **few)),
        ("shapes", lambda: check_kernel(_tail, shapes=5, **few)),
        ("shapes", lambda: check_kernel(_tail, shapes=[(1, 2)], **few)),
        ("seeds", lambda: check_kernel(_tail, seeds=[], scales=(1.0,))),
        ("seeds", lambda: check_kernel(_tail, seeds=[-1], scales=(1.0,))),
        ("seeds", lambda: check_kernel(_tail, seeds=range(10**15), scales=(1.0,))),
        ("scales", lambda: check_kernel(_tail, seeds=range(2), scales=(float("nan"),))),
        ("scales", lambda: check_kernel(_tail, seeds=range(2), scales=1.0)),
        ("scales", lambda: check_kernel(_tail, seeds=range(2), scales=[])),
        ("dtypes", lambda: check_kernel(_tail, dtypes="float32", **few)),
        ("folds", lambda: check_kernel(_tail, folds=[7], **few)),
        ("quantize", lambda: check_kernel(_tail, quantize=["nope"], **few)),
        ("tolerance", lambda: check_kernel(_tail, tolerance=float("nan"), **few)),
        ("tolerance", lambda: check_kernel(_tail, tolerance="1e-4", **few)),
        ("tolerance metric", lambda: check_kernel(_tail, tolerance=("x", 1), **few)),
        ("flake_rate", lambda: check_kernel(_tail, flake_rate=float("nan"), **few)),
        ("flake_rate", lambda: check_kernel(_tail, flake_rate=0, **few)),
        ("flake_rate", lambda: check_kernel(_tail, flake_rate=2, **few)),
        ("faults", lambda: check_kernel(_tail, faults="eps_outside_root", **few)),
        ("faults", lambda: check_kernel(_tail, faults=5, **few)),
        ("faults", lambda: check_kernel(_tail, faults=["nope"], **few)),
        ("time_limit", lambda: check_kernel(_tail, time_limit=0, **few)),
        ("eps", lambda: check_kernel(_tail, eps=float("nan"), **few)),
        ("path", lambda: check_dump(3)),
        ("path", lambda: check_dump(None)),
        ("path", lambda: check_dump("")),
        ("flake_rate", lambda: check_dump(ROOT / "README.md", flake_rate=5)),
        ("faults", lambda: check_dump(ROOT / "README.md", faults=5)),
        ("arrays", lambda: CallableSubject(_tail, arrays="jax")),
        ("batched", lambda: CallableSubject(_tail, batched="yes")),
        ("fn", lambda: CallableSubject(3)),
        ("folder", lambda: KernelsFolderSubject(3)),
        ("folder", lambda: KernelsFolderSubject(None)),
        ("folder", lambda: KernelsFolderSubject(ROOT / "README.md")),
        ("order", lambda: KernelsFolderSubject(ROOT / "kernels", order="sideways")),
        ("launch", lambda: SourceSubject(3)),
        ("template", lambda: SourceLaunch("x", ("branch",), template=5)),
        ("output", lambda: SourceLaunch("x", ("branch",), output=3)),
        ("output", lambda: SourceLaunch("x", ("branch",), output="branch")),
        ("grid", lambda: SourceLaunch("x", ("branch",), grid=5)),
        ("inputs", lambda: SourceLaunch("x", "branch")),
        ("path", lambda: check_step_dump(3)),
        ("path", lambda: check_step_dump(None)),
        ("path", lambda: check_step_dump(ROOT / "README.md")),
        ("horizons", lambda: check_step_dump(ROOT / "README.md", horizons=[0])),
        ("horizons", lambda: check_step_dump(ROOT / "README.md", horizons=4)),
        ("faults", lambda: check_step_dump(ROOT / "README.md", faults=["nope"])),
        ("tolerance", lambda: check_step_dump(ROOT / "README.md", tolerance=float("nan"))),
        ("flake_rate", lambda: check_step_dump(ROOT / "README.md", flake_rate=0)),
    ]


API_CASES = _api_cases()


def _api_clear(call, name: str) -> bool:
    """``call()`` raises a ValueError whose message starts with ``name:`` and is one line."""
    try:
        call()
    except ValueError as e:
        return str(e).startswith(f"{name}: ") and "\n" not in str(e)
    except Exception:
        return False
    return False
