"""The bench commands alike: ``--help`` names ``python -m bench.X``, shows defaults and what
it writes; records go to the project's ``data/bench/`` as ``<bench>-<device>-<UTC time>.json``
and never replace a file or a ledger entry without ``--force``.

Commands run in-process (``main(argv)``) at tiny sizes, with ``--out-dir`` a temporary
folder, so nothing lands in the project.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import cli, record
from workbench.reports import records
from workbench.reports import schedule_run as schedule_report
from workbench.waits import ledger as wait_ledger

ROOT = Path(__file__).resolve().parent.parent
BENCHES = (
    "check_bonsai_pack",
    "check_cluster",
    "check_gdn_rate",
    "check_rate",
    "check_shapes",
    "emulator_cost",
    "gpu_check",
    "kernel_bench",
    "kernel_bodies",
    "kernel_plot",
    "launch_profile",
    "one_launch",
    "real_model",
    "sanitize",
    "sass_counts",
    "schedule_run",
    "split_price",
    "sweep_rate",
    "tail_bench",
    "wait_price",
)
#: Commands that write no JSON record of their own: kernel_bench prints tables for
#: gpu_check, which writes its record; kernel_plot draws a record's figure beside it.
NO_RECORD_OPTIONS = ("kernel_bench", "kernel_plot")
STAMP = r"\d{8}T\d{6}Z"


def test_every_bench_module_is_listed() -> None:
    found = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in ("__init__", "record", "bounded_run"))
    assert found == sorted(BENCHES)


@pytest.mark.parametrize("bench", BENCHES)
def test_help_names_the_command_its_defaults_and_what_it_writes(bench: str, capsys) -> None:
    main = importlib.import_module(f"bench.{bench}").main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m bench.{bench} ")
    assert "writes" in out
    if bench != "kernel_plot":  # its only option is --force
        assert "(default: " in out
    if bench not in NO_RECORD_OPTIONS:
        assert "--out-dir" in out and "--force" in out and "--no-record" in out
        assert f"{bench}-<device>-<UTC time>.json" in out


def test_record_names_and_folder() -> None:
    assert record.device_slug("NVIDIA H200") == "nvidia-h200"
    assert record.device_slug("Intel(R) Xeon(R) Processor @ 2.00GHz") == "intel-xeon"
    assert record.device_slug("Apple M3 Max") == "apple-m3-max"
    assert re.fullmatch(rf"tail_bench-[a-z0-9-]+-{STAMP}", record.record_stem("tail_bench"))
    assert re.fullmatch(
        rf"sweep_rate-nvidia-h200-{STAMP}-my-tag", record.record_stem("sweep_rate", "NVIDIA H200", tag="My tag")
    )
    assert record.RECORD_DIR == ROOT / "data" / "bench"
    assert cli.parser("x", "doc").parse_args([]).out_dir == ROOT / "data" / "bench"


def test_the_record_folder_is_the_projects_wherever_the_command_starts(tmp_path: Path) -> None:
    code = "from bench.common import cli; print(cli.parser('x', '').parse_args([]).out_dir)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.strip() == str(ROOT / "data" / "bench"), done.stderr


def _made_up(kind: str, **fields) -> dict:
    """A record of ``kind`` with every key its kind promises (None but the bench and ``fields``)."""
    return {key: None for key in records.KINDS[kind].keys} | {"bench": kind} | fields


def test_write_never_replaces_a_record_unasked(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("OUT", raising=False)

    def rec(a: int) -> dict:
        return _made_up("split_price", a=a)

    def a_of(path: Path) -> int:
        return json.loads(path.read_text())["a"]

    first = record.write(rec(1), tmp_path, "r")
    second = record.write(rec(2), tmp_path, "r")
    assert (first.name, second.name) == ("r.json", "r-2.json")
    assert json.loads(first.read_text()) == rec(1) | {"schema": 1} and a_of(second) == 2
    assert "r.json exists (not replaced" in capsys.readouterr().out
    assert record.write(rec(3), tmp_path, "r", force=True) == first and a_of(first) == 3
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    record.write(rec(4), tmp_path, "s")
    assert a_of(out / "s.json") == 4
    # Regression: runs of one device call, each with its own out_dir, ending in the same
    # second: their copies in $OUT replaced one another (three sanitizer records lost).
    record.write(rec(5), tmp_path / "other", "s")
    assert a_of(out / "s.json") == 4
    assert a_of(out / "s-2.json") == 5
    record.write(rec(6), tmp_path, "s", force=True)  # --force replaces, in $OUT too
    assert a_of(out / "s.json") == 6
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_sweep_rate_leaves_a_record_of_the_same_name_alone(tmp_path: Path, monkeypatch) -> None:
    """Regression: ``--seeds 8`` with the default output replaced the committed 600,000-case record."""
    from bench import sweep_rate

    monkeypatch.delenv("OUT", raising=False)
    committed = ROOT / "data" / "bench" / "sweep_rate-cpu.json"
    shutil.copy(committed, tmp_path / committed.name)
    rec = sweep_rate.main(["--seeds", "8", "--out-dir", str(tmp_path), "--no-progress"])
    assert (tmp_path / committed.name).read_bytes() == committed.read_bytes()
    (new,) = [p for p in tmp_path.glob("sweep_rate-*.json") if p.name != committed.name]
    assert re.fullmatch(rf"sweep_rate-[a-z0-9-]+-{STAMP}\.json", new.name)
    assert json.loads(new.read_text())["results"][0]["cases"] == 8 == rec["results"][0]["cases"]


def test_wait_price_writes_a_record_by_default_and_refuses_to_overwrite(tmp_path: Path, monkeypatch, capsys) -> None:
    from bench import wait_price

    monkeypatch.delenv("OUT", raising=False)
    tiny = ["--n", "10", "--warmup", "0", "--device", "cpu"]
    rec = wait_price.main([*tiny, "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("wait_price-*.json")
    assert re.fullmatch(rf"wait_price-[a-z0-9-]+-{STAMP}\.json", path.name)
    assert json.loads(path.read_text())["ms"] == rec["ms"]

    out = tmp_path / "named.json"
    wait_price.main([*tiny, "--out", str(out)])
    before = out.read_bytes()
    with pytest.raises(SystemExit) as done:
        wait_price.main([*tiny, "--out", str(out)])
    assert done.value.code == 2 and "exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == before
    wait_price.main([*tiny, "--out", str(out), "--force"])
    assert out.read_bytes() != before


def test_wait_price_add_reports_or_refuses_a_replaced_entry(tmp_path: Path, capsys) -> None:
    from bench import wait_price

    ledger = tmp_path / "ledger.json"
    shutil.copy(wait_ledger.LEDGER_PATH, ledger)
    rec = {
        "ms": 0.05,
        "p10_ms": 0.04,
        "p90_ms": 0.07,
        "n": 100,
        "warmup": 10,
        "device": "Test GPU",
        "backend": "cuda",
        "date": "2026-11-30",
        "mlx_version": "0.32.4",
        "method": "m",
        "command": "python -m bench.wait_price",
    }
    (tmp_path / "r.json").write_text(json.dumps(rec))
    wait_price.main(["--add", str(tmp_path / "r.json"), "--ledger", str(ledger)])
    assert wait_ledger.ledger_price("measured-cuda-test-gpu", ledger) == 0.05
    capsys.readouterr()

    (tmp_path / "r2.json").write_text(json.dumps({**rec, "ms": 0.06}))
    with pytest.raises(SystemExit) as done:
        wait_price.main(["--add", str(tmp_path / "r2.json"), "--ledger", str(ledger)])
    assert done.value.code == 2
    assert "'measured-cuda-test-gpu' is already in" in capsys.readouterr().err
    assert wait_ledger.ledger_price("measured-cuda-test-gpu", ledger) == 0.05
    wait_price.main(["--add", str(tmp_path / "r2.json"), "--ledger", str(ledger), "--force"])
    assert "replaced measured-cuda-test-gpu: 0.0500 ms" in capsys.readouterr().out
    assert wait_ledger.ledger_price("measured-cuda-test-gpu", ledger) == 0.06

    before = ledger.read_bytes()
    for content, says in [
        (json.dumps({**rec, "ms": "abc"}), "ms: must be a finite number > 0"),
        (json.dumps({**rec, "ms": float("nan")}), "ms: must be a finite number > 0"),
        ("", "cannot read the record"),
        ("[1]", "not a wait_price record"),
    ]:
        (tmp_path / "bad.json").write_text(content)
        with pytest.raises(SystemExit):
            wait_price.main(["--add", str(tmp_path / "bad.json"), "--ledger", str(ledger)])
        assert says in capsys.readouterr().err
    assert ledger.read_bytes() == before


@pytest.mark.parametrize(
    "bench, argv, says",
    [
        ("wait_price", ["--n", "1"], "--n must be >= 10"),
        ("schedule_run", ["--tokens", "0"], "--tokens must be >= 1"),
        ("schedule_run", ["--stages", "1,x", "--no-record"], "--stages must be comma-separated stage numbers"),
        (
            "schedule_run",
            ["--gdn", "kernel", "--no-record"],
            "--gdn kernel: the gdn_step kernel runs with the project's "
            "kernels only (--matvec kernels); got --matvec mlx",
        ),
        ("sweep_rate", ["--seeds", "0"], "--seeds must be >= 1"),
        ("sweep_rate", ["--configs", "f64"], "--configs must be a comma-separated list"),
        ("split_price", ["--n", "2"], "--n must be >= 5"),
        ("tail_bench", ["--repeats", "0"], "--repeats must be >= 1"),
        ("one_launch", ["--repeats", "0"], "--repeats must be >= 1"),
        (
            "real_model",
            ["--backends", "graph", "--variants", "fused-graph,fused-metal"],
            "--variants must be a comma-separated list of ['fused-graph', ",
        ),
    ],
)
def test_bad_arguments_are_usage_errors(bench: str, argv: list[str], says: str, capsys) -> None:
    main = importlib.import_module(f"bench.{bench}").main
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and says in capsys.readouterr().err


def test_schedule_run_refuses_an_existing_out_before_any_work(tmp_path: Path, capsys) -> None:
    from bench import schedule_run

    out = tmp_path / "taken.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as done:
        schedule_run.main(["--out", str(out)])
    assert done.value.code == 2 and "exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_the_committed_records_stay_loadable() -> None:
    for path in sorted((ROOT / "data" / "bench").glob("*.json")):
        assert isinstance(json.loads(path.read_text()), dict), path.name
    names = [r["file"] for r in schedule_report.load_records()]
    assert "schedule-cpu.json" in names and "schedule-h200.json" in names


def test_schedule_records_of_both_names_are_read(tmp_path: Path) -> None:
    (tmp_path / "schedule-old.json").write_text(json.dumps(_made_up("schedule_run", a=1)))
    (tmp_path / "schedule_run-cpu-20261130T000000Z.json").write_text(json.dumps(_made_up("schedule_run", a=2)))
    (tmp_path / "tail_bench-cpu.json").write_text(json.dumps(_made_up("tail_bench", a=3)))
    assert [r["a"] for r in schedule_report.load_records(tmp_path)] == [1, 2]
    with pytest.raises(ValueError, match="folder: .*nowhere is not a folder"):
        schedule_report.load_records(tmp_path / "nowhere")
    (tmp_path / "schedule-broken.json").write_text("")
    with pytest.raises(ValueError, match="schedule-broken.json is not valid JSON"):
        schedule_report.load_records(tmp_path)


def test_quant_sweep_takes_the_fastest_tuning_and_records_one_that_fails(monkeypatch, capsys):
    """kernel_tail.quant_sweep times every QUANT_TUNINGS entry (as changes to the bf16
    choice), keeps going past a tuning that cannot be built, and names the fastest."""
    import mlx.core as mx

    from bench.common import kernel_tail as kb
    from workbench import tail
    from workbench.kernels import tuning as kernel_tuning

    built = []

    def fake_prepared(launch, dialect, t):
        built.append(t)
        if t.rows_nt == 512:
            raise RuntimeError("too many registers")
        return lambda b, r: t

    # device time falls with the units a 4-bit lane loads, and the early batch costs a little
    monkeypatch.setattr(kb, "prepared", fake_prepared)
    monkeypatch.setattr(
        kb, "batched_ms", lambda make: 1.0 / make().u_gate_up + 0.01 * make().pre_gate_up + 0.001 * make().u_down
    )
    w = tail.TailWeights.random(64, 128, 128, seed=1, fold_block=64, dtype="bfloat16", quantize=kb.Q4)
    base = kernel_tuning.KernelTuning(wo_nt=256)
    best, times = kb.quant_sweep(w, "cuda", base, mx.zeros(128), mx.zeros(64))
    assert best == "u4" and set(times) == set(kb.QUANT_TUNINGS) - {"u2_gu512"}
    assert all(t.wo_nt == 256 for t in built)  # changes to the base, not to the defaults
    assert "u2_gu512 failed: RuntimeError: too many registers" in capsys.readouterr().out


def test_sanitize_device_written_copies_keep_every_value(monkeypatch) -> None:
    """bench.sanitize --device-written: every array of the tail re-made by the copy kernel
    (here a CPU stand-in for the CUDA copy), the same values in the same dtypes, so the
    launches and results are the same."""
    import mlx.core as mx

    from bench import sanitize
    from workbench import tail
    from workbench.fold.weights import QUANT_FORMATS
    from workbench.kernels import launch as kernel_launch

    copied: list[int] = []

    def stand_in(a):
        copied.append(id(a))
        return a * 1

    monkeypatch.setattr(sanitize, "device_copy", stand_in)
    q = QUANT_FORMATS["affine4"]
    w = tail.TailWeights.random(128, 512, 1024, seed=1, fold_block=256, dtype="bfloat16", quantize=q.as_quantize())
    prep = kernel_launch.prepare_tail(tail.tail_launch(w), "metal")
    copy = sanitize.device_written(prep)
    assert copy.templates() == prep.templates()
    pairs = [
        (prep.norm, copy.norm),
        (prep.params, copy.params),
        (prep.rot["sdest"], copy.rot["sdest"]),
        (prep.rot["table"], copy.rot["table"]),
    ]
    pairs += [
        (getattr(prep, m).__dict__[k], getattr(copy, m).__dict__[k])
        for m in ("wo", "gate", "up", "down")
        for k in ("w", "s", "b")
    ]
    assert len(copied) == len(pairs) and set(copied) == {id(old) for old, _ in pairs}
    for old, new in pairs:
        assert old is not new and old.dtype == new.dtype and bool(mx.array_equal(old, new))


def test_sanitize_counts_reports_by_kernel(tmp_path) -> None:
    """bench.sanitize reads the sanitizer's log (backtraces off) a line at a time: reports
    counted by kernel (MLX's prefix and the template suffix dropped), the first kept whole,
    the summary lines found."""
    from bench import sanitize

    def report(kernel: str, size: int) -> str:
        return (
            f"========= Uninitialized __global__ memory read of size {size} bytes\n"
            f"=========     at mlx::core::cu::custom_kernel_{kernel}(const float *, float *)+0xf0\n"
            "=========     by thread (19,0,0) in block (12,0,0)\n"
            "=========     Address 0x48ea0e4530\n=========\n"
        )

    log = tmp_path / "initcheck.log"
    log.write_text(
        "========= COMPUTE-SANITIZER\n"
        + report("fat_device_copy_4096", 2) * 3
        + report("fat_wo_residual_512_1_0_32_f_1024_256_t_1_8_4_t", 16)
        + report("fat_tail_one_launch", 4) * 2
        + "========= ERROR SUMMARY: 6 errors\n"
    )
    by_kernel, first, summary = sanitize.read_log(log)
    assert by_kernel == {"fat_device_copy": 3, "fat_wo_residual": 1, "fat_tail_one_launch": 2}
    assert summary == ["========= ERROR SUMMARY: 6 errors"] and sanitize._errors("initcheck", summary[0]) == 6
    assert len(first) == 6 and "size 16 bytes" in first[3] and "block (12,0,0)" in first[3]
    assert all(r.startswith("========= Uninitialized") and r.count("\n") == 3 for r in first)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("ctype", ["float", "__nv_bfloat16", "unsigned char", "unsigned int"])
def test_sanitize_device_copy_source_compiles_for_every_dtype(tmp_path, ctype) -> None:
    """The --device-written copy kernel's body, in the signature MLX gives it (the output
    typed as the input), compiles for the dtypes a tail's arrays have."""
    from bench import sanitize

    src = tmp_path / "copy.cu"
    src.write_text(
        "#include <cuda_bf16.h>\ntemplate <int NBYTES>\n"
        f"__global__ void copy(const {ctype}* src, {ctype}* dst) {{\n{sanitize._DEVICE_COPY_SOURCE}}}\n"
        f"template __global__ void copy<4098>(const {ctype}*, {ctype}*);\n"
    )
    r = subprocess.run(
        ["nvcc", "-arch=sm_90", "-c", "-o", str(tmp_path / "copy.o"), str(src)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_sanitize_jobs_run_one_child_a_tool_shape_and_format(tmp_path, monkeypatch, capsys) -> None:
    """bench.sanitize --jobs 2, without a GPU: compute-sanitizer replaced by a stand-in that
    writes the log a real run writes; one run a (tool, shape, format), one record, a run
    with an error or a bad exit not clean."""
    from bench import sanitize

    monkeypatch.setattr(sanitize.shutil, "which", lambda name: "/usr/bin/compute-sanitizer")
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        log = Path(cmd[cmd.index("--log-file") + 1])
        shape, fmt = cmd[cmd.index("--shapes") + 1], cmd[cmd.index("--formats") + 1]
        bad = cmd[cmd.index("--tool") + 1] == "racecheck" and fmt == "nvfp4"
        log.write_text(
            "========= COMPUTE-SANITIZER\n"
            + (f"========= RACECHECK SUMMARY: {int(bad)} hazards displayed\n" if "racecheck" in cmd else "")
            + "========= ERROR SUMMARY: 0 errors\n"
        )
        out = f"tail {shape} {fmt}: PASS\none-launch {shape} {fmt}: agrees\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    monkeypatch.setattr(sanitize.bounded_run, "run_bounded", fake_run)
    rc = sanitize.main(
        [
            "--tools",
            "memcheck,racecheck",
            "--shapes",
            "small",
            "--formats",
            "bfloat16,nvfp4",
            "--parts",
            "one-launch",
            "--jobs",
            "2",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert rc == 1 and len(calls) == 4
    (path,) = tmp_path.glob("sanitize-*.json")
    rec = json.loads(path.read_text())
    assert rec["jobs"] == 2 and not rec["all_clean"]
    got = {(r["tool"], r["formats"][0]): r["passed"] for r in rec["runs"]}
    assert got == {
        ("memcheck", "bfloat16"): True,
        ("memcheck", "nvfp4"): True,
        ("racecheck", "bfloat16"): True,
        ("racecheck", "nvfp4"): False,
    }
    assert all("--log-file" not in r["command"] for r in rec["runs"])  # a temporary path, not the record's
    from workbench.reports.sanitize import coverage

    cov = coverage([rec])
    assert cov.loc[("small", "bfloat16"), "racecheck"] == "T1" and cov.loc[("small", "nvfp4"), "racecheck"] == "-"
    assert cov.loc[("small", "nvfp4"), "initcheck"] == "-"


def test_sanitize_jobs_run_the_head_apart_from_the_tail(tmp_path, monkeypatch) -> None:
    """With --jobs, the head launch runs in a child of its own, so a head that outlives its
    limit leaves the tail's verdict standing; each run records its parts, and case lines
    ending in their seconds still count."""
    from bench import sanitize

    monkeypatch.setattr(sanitize.shutil, "which", lambda name: "/usr/bin/compute-sanitizer")
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        parts = cmd[cmd.index("--parts") + 1]
        if parts == "head":
            raise subprocess.TimeoutExpired(cmd, kw["timeout"], output="")
        Path(cmd[cmd.index("--log-file") + 1]).write_text("========= ERROR SUMMARY: 0 errors\n")
        return subprocess.CompletedProcess(
            cmd,
            0,
            stdout="tail bonsai affine4: outputs finite [41 s]\n"
            "one-launch bonsai affine4 (640 threads a group): agrees [97 s]\n"
            "next-norm bonsai affine4 (640 threads a group): agrees [99 s]\n",
            stderr="",
        )

    monkeypatch.setattr(sanitize.bounded_run, "run_bounded", fake_run)
    assert (
        sanitize.main(
            [
                "--tools",
                "memcheck",
                "--shapes",
                "bonsai",
                "--formats",
                "affine4",
                "--jobs",
                "2",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert sorted(c[c.index("--parts") + 1] for c in calls) == ["head", "tail,one-launch,next-norm"]
    rec = json.loads(next(tmp_path.glob("sanitize-*.json")).read_text())
    assert sorted((r["parts"], r["passed"]) for r in rec["runs"]) == [
        (["head"], False),
        (["tail", "one-launch", "next-norm"], True),
    ]
    from workbench.reports.sanitize import coverage

    assert coverage([rec]).loc[("bonsai", "affine4"), "memcheck"] == "T1N"


@pytest.mark.parametrize(
    "parts, groups",
    [
        (["tail", "one-launch", "head"], [["tail", "one-launch"], ["head"]]),
        (["head"], [["head"]]),
        (["tail", "one-launch"], [["tail", "one-launch"]]),
    ],
)
def test_sanitize_part_groups(parts, groups) -> None:
    from bench import sanitize

    assert sanitize.part_groups(parts) == groups


def test_sanitize_says_a_run_killed_at_its_limit_timed_out(tmp_path, monkeypatch, capsys) -> None:
    """A child killed at --timeout gives no verdict: the record says timed_out, the line
    says TIMED OUT and how far it got, and the run counts as not passed."""
    from bench import sanitize

    monkeypatch.setattr(sanitize.shutil, "which", lambda name: "/usr/bin/compute-sanitizer")

    def slow_run(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"tail bonsai bfloat16: outputs finite\n")

    monkeypatch.setattr(sanitize.bounded_run, "run_bounded", slow_run)
    rc = sanitize.main(
        [
            "--tools",
            "racecheck",
            "--shapes",
            "small",
            "--formats",
            "bfloat16",
            "--parts",
            "head",
            "--timeout",
            "5",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert rc == 1
    (run,) = json.loads(next(tmp_path.glob("sanitize-*.json")).read_text())["runs"]
    assert run["timed_out"] and not run["passed"] and run["returncode"] is None
    out = capsys.readouterr().out
    assert "TIMED OUT (no verdict; got as far as: tail bonsai bfloat16: outputs finite)" in out


@pytest.mark.parametrize(
    "asked, runs",
    [
        (["head"], ["head"]),  # the head alone: no tail before it
        (["one-launch"], ["tail", "one-launch"]),  # the one launch is checked against the tail
        (["next-norm"], ["tail", "next-norm"]),  # so is the one launch carrying the next norm
        (["head", "tail"], ["tail", "head"]),  # PARTS order
        (["tail", "one-launch", "head"], ["tail", "one-launch", "head"]),
        (["head", "next-norm", "one-launch"], ["tail", "one-launch", "next-norm", "head"]),
    ],
)
def test_sanitize_parts_to_run(asked, runs) -> None:
    from bench import sanitize

    assert sanitize.parts_to_run(asked) == runs


def test_sanitize_child_runs_the_parts_asked_for_in_every_format_and_shape(monkeypatch) -> None:
    """The child, without a GPU: each (shape, format) runs the tail (with the one launch when
    asked) and the head as asked, the head at Bonsai's shape in every format too."""
    from bench import sanitize

    calls = []
    monkeypatch.setattr(
        sanitize,
        "_tail_parts",
        lambda s, f, i, one, dev, nt, carried: calls.append(("tail", s, f, one, nt, carried)) or 0,
    )
    monkeypatch.setattr(sanitize, "_head_part", lambda s, f, i: calls.append(("head", s, f)) or (f == "nvfp4"))
    assert sanitize._child(["bonsai"], ["affine4", "nvfp4"], ["head"]) == 1  # nvfp4's head "failed"
    assert calls == [("head", "bonsai", "affine4"), ("head", "bonsai", "nvfp4")]
    calls.clear()
    assert sanitize._child(["small"], ["bfloat16"], ["one-launch"], one_launch_nt=640) == 0
    assert calls == [("tail", "small", "bfloat16", True, 640, False)]
    calls.clear()
    assert sanitize._child(["small"], ["affine4"], ["next-norm"]) == 0  # the carrying launch without the plain one
    assert calls == [("tail", "small", "affine4", False, None, True)]


def test_sanitize_passes_the_one_launch_threads_to_every_child(tmp_path, monkeypatch) -> None:
    """--one-launch-nt reaches each child's command line and the record; a bad value is refused."""
    from bench import sanitize

    monkeypatch.setattr(sanitize.shutil, "which", lambda name: "/usr/bin/compute-sanitizer")
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        Path(cmd[cmd.index("--log-file") + 1]).write_text("========= ERROR SUMMARY: 0 errors\n")
        return subprocess.CompletedProcess(
            cmd, 0, stdout="one-launch small affine4 (640 threads a group): agrees\n", stderr=""
        )

    monkeypatch.setattr(sanitize.bounded_run, "run_bounded", fake_run)
    assert (
        sanitize.main(
            [
                "--tools",
                "memcheck",
                "--shapes",
                "small",
                "--formats",
                "affine4",
                "--parts",
                "one-launch",
                "--one-launch-nt",
                "640",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    (cmd,) = calls
    assert cmd[cmd.index("--one-launch-nt") + 1] == "640" and cmd[cmd.index("--parts") + 1] == "tail,one-launch"
    rec = json.loads(next(tmp_path.glob("sanitize-*.json")).read_text())
    assert rec["one_launch_nt"] == 640
    from workbench.reports.sanitize import coverage

    assert coverage([rec]).loc[("small", "affine4"), "memcheck"] == "1"  # the case line still parses


@pytest.mark.parametrize("nt", ["48", "0", "1056"])
def test_sanitize_refuses_one_launch_threads_that_are_not_whole_warps(nt, capsys) -> None:
    from bench import sanitize

    with pytest.raises(SystemExit):
        sanitize.main(["--one-launch-nt", nt])
    assert (
        f"--one-launch-nt must be a multiple of 32 from 32 to 1024 (whole warps); got {nt}" in capsys.readouterr().err
    )


def test_sanitize_refuses_no_jobs(capsys) -> None:
    from bench import sanitize

    with pytest.raises(SystemExit):
        sanitize.main(["--jobs", "0"])
    assert "--jobs must be >= 1; got 0" in capsys.readouterr().err
