"""workbench.reports.records: one contract a bench record kind, shared by the command that
writes a record (``bench.common.record``) and the reports that read it.

Every committed record loads under its kind; a record of another kind, of a newer schema,
without a key its kind promises, a missing folder or file and a file that is not a JSON
object each give a clear error; and a record written through ``bench.common.record.write``
reads back as it was written, its schema stamped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import record
from workbench import files
from workbench.reports import records
from workbench.reports.records import KINDS, RecordError

BENCH = records.RECORD_DIR


def _made_up(kind: str, **fields) -> dict:
    """A record of ``kind`` with every key its kind promises (None where not given)."""
    return (
        {key: None for key in KINDS[kind].keys}
        | {
            "bench": kind,
            "command": f"python -m bench.{kind}",
            "date": "2026-12-01T13:12:03+00:00",
            "device": {"device_name": "Test GPU"},
            "mlx_version": "0.0.0",
        }
        | fields
    )


def test_every_committed_record_loads_under_its_kind():
    names = {p.name for p in BENCH.glob("*.json")}
    loaded = {rec["file"]: kind for kind in KINDS for rec in records.load_all(kind)}
    assert set(loaded) == names  # every record is of one kind, and found by its kind's file names
    for name, kind in loaded.items():
        assert records.kind_of(records.load(kind, name)) == kind
    # the first schedule records, named schedule-*.json, are schedule_run records
    assert {"schedule-cpu.json", "schedule-h200.json"} <= {r["file"] for r in records.load_all("schedule_run")}


def test_each_kinds_keys_are_those_every_committed_record_of_it_has():
    """The keys a kind promises are a subset of what each of its committed records has;
    and no kind promises nothing beyond the header."""
    for kind, spec in KINDS.items():
        assert spec.name == kind and spec.schema >= 1 and spec.description and len(spec.keys) == len(set(spec.keys))
        assert {"command", "date", "device", "mlx_version"} <= set(spec.keys), kind
        for rec in records.load_all(kind):
            assert set(spec.keys) <= set(rec), rec["file"]


def test_the_kind_of_a_record_whose_bench_holds_results_is_its_command():
    """gpu_check and kernel_bench records that ran the benchmark keep its results under
    "bench"; the first wait_price records have no "bench": their command names the kind."""
    rec = records.load("kernel_bench", "kernel_bench-nvidia-h200-20261201T060559Z.json")
    assert isinstance(rec["bench"], dict) and records.kind_of(rec) == "kernel_bench"
    assert "bench" not in records.load("wait_price", "wait_price-cpu.json")
    assert records.kind_of({"bench": {}, "command": "python -m bench.gpu_check --quick"}) == "gpu_check"
    assert records.kind_of({"command": "make test"}) is None and records.kind_of([]) is None


def test_check_returns_the_record_or_names_what_is_wrong():
    rec = _made_up("one_launch")
    assert records.check(rec, "one_launch") is rec
    assert records.check(dict(rec, schema=1), "one_launch")["schema"] == 1
    with pytest.raises(RecordError, match=r"^record: is a 'sanitize' record, expected 'one_launch'$"):
        records.check(_made_up("sanitize"), "one_launch")
    with pytest.raises(
        RecordError,
        match=r"^record: schema 3; this workbench reads 'one_launch' records up to "
        r"schema 1: update the workbench$",
    ):
        records.check(dict(rec, schema=3), "one_launch")
    lacking = {k: v for k, v in rec.items() if k not in ("checks", "formats")}
    with pytest.raises(RecordError, match=r"record: a 'one_launch' record must have \['formats', 'checks'\]"):
        records.check(lacking, "one_launch")
    with pytest.raises(RecordError, match="profile: must be a 'launch_profile' record \\(a dict\\), got None"):
        records.check(None, "launch_profile", name="profile")
    with pytest.raises(RecordError, match="record: names no kind"):
        records.check({"a": 1}, "sanitize")
    for schema in (0, "2", True, 1.0):
        with pytest.raises(RecordError, match="schema must be an integer >= 1"):
            records.check(dict(rec, schema=schema), "one_launch")
    with pytest.raises(ValueError, match="kind: must be one of .*'wait_price'.*got 'nope'"):
        records.check(rec, "nope")
    assert issubclass(RecordError, ValueError)  # callers that catch ValueError keep working


def test_load_finds_a_record_by_name_or_path_and_adds_its_file():
    name = "one_launch-nvidia-h200-20261201T131203Z.json"
    rec = records.load("one_launch", name)
    assert rec["file"] == name and rec["bench"] == "one_launch"
    assert records.load("one_launch", BENCH / name) == rec
    assert records.load("one_launch", name, folder=BENCH) == rec
    assert records.load("one_launch", name.removesuffix(".json")) == rec  # by the record's name
    with pytest.raises(RecordError, match=f"^{name}: is a 'one_launch' record, expected 'sanitize'$"):
        records.load("sanitize", name)


def test_stamp_is_the_utc_time_a_records_name_ends_with():
    assert records.stamp(records.load("one_launch", "one_launch-nvidia-h200-20261201T131203Z")) == "20261201T131203Z"
    assert records.stamp({"file": "gpu_check-nvidia-h200-20261202T014126Z-2.json"}) == "20261202T014126Z"
    with pytest.raises(RecordError, match="record: must be loaded from a file named .*, got 'schedule-cpu.json'"):
        records.stamp(records.load("schedule_run", "schedule-cpu"))
    with pytest.raises(RecordError, match="got None"):
        records.stamp({"bench": "sanitize"})


def test_load_names_a_missing_file_bad_json_and_a_non_object(tmp_path: Path):
    with pytest.raises(
        RecordError,
        match="no record .*one_launch-x.json; its 'one_launch' records run from "
        "one_launch-nvidia-h200-20261201T095241Z.json to .* \\(8\\)",
    ):
        records.load("one_launch", "one_launch-x.json")
    with pytest.raises(RecordError, match="no record .*sanitize-x.json; it holds no 'sanitize' record"):
        records.load("sanitize", "sanitize-x.json", folder=tmp_path)
    (tmp_path / "sanitize-bad.json").write_text('{"bench": "sanitize",')
    with pytest.raises(RecordError, match="record .*sanitize-bad.json is not valid JSON"):
        records.load("sanitize", "sanitize-bad.json", folder=tmp_path)
    (tmp_path / "sanitize-list.json").write_text("[1, 2]")
    with pytest.raises(RecordError, match="record .*sanitize-list.json is not a JSON object \\(it holds list\\)"):
        records.load("sanitize", tmp_path / "sanitize-list.json")
    with pytest.raises(ValueError, match="name: must be a record's file name or path, got None"):
        records.load("sanitize", None)


def test_load_all_reads_a_folder_and_names_what_it_cannot(tmp_path: Path):
    assert records.load_all("sanitize", tmp_path) == []
    for stamp in ("20261201T000002Z", "20261201T000001Z"):
        (tmp_path / f"sanitize-test-{stamp}.json").write_text(json.dumps(_made_up("sanitize", seen=stamp)))
    (tmp_path / "one_launch-test-20261201T000000Z.json").write_text(json.dumps(_made_up("one_launch")))
    assert [r["seen"] for r in records.load_all("sanitize", tmp_path)] == ["20261201T000001Z", "20261201T000002Z"]
    assert all(r["file"].startswith("sanitize-") for r in records.load_all("sanitize", str(tmp_path)))
    with pytest.raises(RecordError, match=f"folder: {tmp_path / 'nowhere'} is not a folder"):
        records.load_all("sanitize", tmp_path / "nowhere")
    (tmp_path / "sanitize-wrong.json").write_text(json.dumps(_made_up("one_launch")))
    with pytest.raises(RecordError, match="sanitize-wrong.json: is a 'one_launch' record, expected 'sanitize'"):
        records.load_all("sanitize", tmp_path)
    with pytest.raises(ValueError, match="folder: must be a path"):
        records.load_all("sanitize", 3)


def test_newest_is_the_latest_date_of_those_that_satisfy_where(tmp_path: Path):
    for name, date in [
        ("sanitize-b-1.json", "2026-12-01T10:00:00+00:00"),
        ("sanitize-a-2.json", "2026-12-02"),
        ("sanitize-c-3.json", "2026-12-01T23:00:00+00:00"),
    ]:
        (tmp_path / name).write_text(json.dumps(_made_up("sanitize", date=date)))
    assert records.newest("sanitize", tmp_path)["file"] == "sanitize-a-2.json"  # by date, not by name
    assert records.newest("sanitize", tmp_path, where=lambda r: "T" in r["date"])["file"] == "sanitize-c-3.json"
    with pytest.raises(RecordError, match="no 'sanitize' record in .* satisfies where"):
        records.newest("sanitize", tmp_path, where=lambda r: False)
    with pytest.raises(RecordError, match="no 'one_launch' record in"):
        records.newest("one_launch", tmp_path)
    with pytest.raises(ValueError, match="where: must be a function"):
        records.newest("sanitize", tmp_path, where="T")
    # the committed records: the newest one-launch run
    assert records.newest("one_launch")["file"] == "one_launch-nvidia-h200-20261201T200209Z.json"


def test_headline_names_the_file_device_date_mlx_and_command():
    rec = records.load("one_launch", "one_launch-nvidia-h200-20261201T131203Z.json")
    line = records.headline(rec)
    assert line.startswith("one_launch-nvidia-h200-20261201T131203Z.json: NVIDIA H200, 2026-12-01 13:12 UTC, MLX ")
    assert (
        line.endswith(
            ", command: python -m bench.one_launch --sweep-formats bfloat16,affine4,mxfp4,nvfp4 "
            "--repeats 20 --no-timeout-check"
        )
        and "\n" not in line
    )  # without its --out-dir /tmp/rec
    # a device named by a string, a day alone, and the --out-dir of a lent machine left out
    wait = records.headline(records.load("wait_price", "wait_price-h200.json"))
    assert wait.startswith("wait_price-h200.json: NVIDIA H200, 2026-11-29, MLX ")
    made = _made_up("sanitize", command="python -m bench.sanitize --out-dir /root/out --jobs 2")
    assert records.headline(made) == (
        "Test GPU, 2026-12-01 13:12 UTC, MLX 0.0.0, command: python -m bench.sanitize --jobs 2"
    )
    with pytest.raises(RecordError, match="record: must be a record of one of the kinds"):
        records.headline({"a": 1})
    with pytest.raises(RecordError, match="a 'sanitize' record must have"):
        records.headline({"bench": "sanitize"})


def test_a_record_written_by_a_bench_reads_back_as_written(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    rec = {**record.provenance("split_price", ["--n", "3"]), "method": "m", "results": [{"ms": 0.1}]}
    assert list(rec)[:3] == ["bench", "schema", "command"] and rec["schema"] == KINDS["split_price"].schema
    path = record.write(rec, tmp_path, record.record_stem("split_price"))
    back = records.load("split_price", path.name, folder=tmp_path)
    assert back == json.loads(json.dumps(rec)) | {"file": path.name}
    assert records.headline(back).startswith(f"{path.name}: ")
    # a header built without provenance gets its kind's schema, after "bench"
    wait = {"bench": "wait_price", **{k: 1 for k in KINDS["wait_price"].keys}, "command": "python -m bench.wait_price"}
    written = json.loads(record.write(wait, tmp_path, "w").read_text())
    assert list(written)[:2] == ["bench", "schema"] and written == {**wait, "schema": 1} and "schema" not in wait


def test_write_refuses_what_its_kind_does_not_allow(tmp_path: Path, monkeypatch):
    """A bench whose record lacks a key its readers rely on fails when it writes, in its
    own test, not in a notebook later; nothing is written."""
    monkeypatch.delenv("OUT", raising=False)
    rec = {**record.provenance("split_price", []), "results": []}
    with pytest.raises(RecordError, match=r"a 'split_price' record must have \['method'\]"):
        record.write(rec, tmp_path, "r")
    with pytest.raises(RecordError, match="record: names no kind"):
        record.write({"a": 1}, tmp_path, "r")
    with pytest.raises(RecordError, match="names the kind 'nope'"):
        record.write({"bench": "nope"}, tmp_path, "r")
    with pytest.raises(RecordError, match="schema 2"):
        record.write({**rec, "method": "m", "schema": 2}, tmp_path, "r")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="kind: must be one of"):
        record.provenance("nope", [])


def test_every_bench_command_that_writes_a_record_is_a_kind():
    """provenance and write refuse a kind KINDS lacks: each command under bench/ that
    writes a record (itself, or through the row-dot benches' run_and_record) is one."""
    root = files.PROJECT_ROOT / "bench"
    writers = {
        p.stem for p in root.glob("*.py") if "record.write(" in p.read_text() or "run_and_record(" in p.read_text()
    }
    assert writers and writers <= set(KINDS), sorted(writers - set(KINDS))
