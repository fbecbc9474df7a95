"""workbench.reports.sanitize: the table of what compute-sanitizer found clean, from the
committed ``bench.sanitize`` records (read through ``workbench.reports.records``) and from
records made up here."""

from __future__ import annotations

import pytest

from workbench.reports import records
from workbench.reports import sanitize as sc


def _rec(runs: list[dict] | None = None, tools: dict | None = None) -> dict:
    """A sanitize record with every key its kind promises (None but the bench), and these runs."""
    rec: dict = {key: None for key in records.KINDS["sanitize"].keys} | {"bench": "sanitize"}
    if runs is not None:
        rec["runs"] = runs
    if tools is not None:
        rec["tools"] = tools
    return rec


def test_the_committed_records():
    """Every tool clean for every part and format at both shapes, over all records and over
    the runs of one kernel text (``c60431e0a55f``, whose Bonsai runs finished it, and
    ``a5b094e07023``, with the next norm's epilogue; notebook 08 prints these tables). The bench's
    names and orders are the table's."""
    from bench import sanitize

    assert tuple(sanitize.SHAPES) == sc.SHAPES and sanitize.FORMATS == sc.FORMATS and sanitize.TOOLS == sc.TOOLS
    # every sanitize record committed: together they must cover every shape, format, part and tool
    every = sc.load_records()
    assert every == records.load_all("sanitize") and len(every) >= 49
    cov = sc.coverage(every)
    assert list(cov.columns) == list(sc.TOOLS)
    assert len(cov) == len(sc.SHAPES) * len(sc.FORMATS) and (cov == "T1NH").all().all()
    # one kernel text alone: the head launch at Bonsai's shape too (sanitize-…195746Z and on)
    one_text = sc.coverage(sc.of_kernel_text(every, "c60431e0a55f"))
    assert len(one_text) == len(sc.SHAPES) * len(sc.FORMATS) and (one_text == "T1H").all().all()
    for shape in sc.SHAPES:
        for part in ("tail", "one-launch", "head"):  # that text had no next-norm epilogue
            assert sc.not_yet_clean(one_text, shape, part) == {t: [] for t in sc.TOOLS}
    # the text with the next norm's epilogue (a5b094e07023): every part, the carrying launch too
    carried = sc.coverage(sc.of_kernel_text(every, "a5b094e07023"))
    assert len(carried) == len(sc.SHAPES) * len(sc.FORMATS) and (carried == "T1NH").all().all()
    for shape in sc.SHAPES:
        for part in sc.PART_LETTERS:
            assert sc.not_yet_clean(carried, shape, part) == {t: [] for t in sc.TOOLS}


def test_only_passed_runs_count_and_both_record_layouts_are_read():
    cases = ["tail small bfloat16: PASS", "one-launch small bfloat16: agrees", "head small bfloat16: outputs finite"]
    old = _rec(
        tools={"memcheck": {"passed": True, "cases": cases}, "racecheck": {"passed": False, "cases": cases}}
    )  # stopped at its time limit
    new = _rec(
        runs=[
            {"tool": "synccheck", "passed": True, "cases": cases[:2]},
            {"tool": "initcheck", "passed": True, "cases": ["tail bonsai nvfp4: outputs finite"]},
        ]
    )
    cov = sc.coverage([old, new])
    assert cov.loc[("small", "bfloat16")].tolist() == ["T1H", "-", "T1", "-"]
    assert cov.loc[("bonsai", "nvfp4")].tolist() == ["-", "-", "-", "T"]
    assert list(cov.index) == [("small", "bfloat16"), ("bonsai", "nvfp4")]  # the bench's order


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"bench": "one_launch"}, r"records\[0\]: is a 'one_launch' record, expected 'sanitize'"),
        ("sanitize", r"records\[0\]: must be a 'sanitize' record \(a dict\)"),
        (None, r"records\[0\]: must be a 'sanitize' record"),
        ({"bench": "sanitize"}, r"records\[0\]: a 'sanitize' record must have"),
    ],
)
def test_what_is_not_a_sanitize_record_is_refused(bad, says):
    with pytest.raises(records.RecordError, match=says):
        sc.coverage([bad])
    with pytest.raises(records.RecordError, match="rec: "):
        sc.record_runs(bad)


def test_not_yet_clean_lists_each_tools_missing_formats():
    new = _rec(
        runs=[
            {
                "tool": "racecheck",
                "passed": True,
                "cases": ["tail bonsai bfloat16: outputs finite", "one-launch bonsai bfloat16: agrees"],
            },
            {"tool": "memcheck", "passed": True, "cases": ["tail bonsai nvfp4: outputs finite"]},
        ]
    )
    table = sc.coverage([new])
    todo = sc.not_yet_clean(table, "bonsai", "one-launch")
    assert todo["racecheck"] == [f for f in sc.FORMATS if f != "bfloat16"]
    assert todo["memcheck"] == list(sc.FORMATS)  # nvfp4 ran its tail only
    assert sc.not_yet_clean(table, "bonsai", "tail")["memcheck"] == [f for f in sc.FORMATS if f != "nvfp4"]
    assert sc.not_yet_clean(table, "small", "head") == {t: list(sc.FORMATS) for t in sc.TOOLS}  # never ran there
    with pytest.raises(ValueError, match="part must be one of"):
        sc.not_yet_clean(table, "bonsai", "wo")
    with pytest.raises(ValueError, match="shape must be one of"):
        sc.not_yet_clean(table, "huge", "tail")


def test_of_kernel_text_keeps_the_runs_of_that_text_only():
    """A clean run of other kernel text says nothing about this one: of_kernel_text keeps
    the records that carried the fingerprint asked for (records made before records carried
    one match none)."""
    cases = ["tail small affine4: PASS"]
    now = dict(_rec(runs=[{"tool": "memcheck", "passed": True, "cases": cases}]), kernel_text="aaaaaaaaaaaa")
    before = dict(_rec(runs=[{"tool": "racecheck", "passed": True, "cases": cases}]), kernel_text="bbbbbbbbbbbb")
    unmarked = _rec(runs=[{"tool": "synccheck", "passed": True, "cases": cases}])
    kept = sc.of_kernel_text([now, before, unmarked], "aaaaaaaaaaaa")
    assert kept == [now]
    assert sc.coverage(kept).loc[("small", "affine4")].tolist() == ["T", "-", "-", "-"]
    empty = sc.coverage(sc.of_kernel_text([before, unmarked], "aaaaaaaaaaaa"))
    assert empty.empty and list(empty.columns) == list(sc.TOOLS)
    assert sc.not_yet_clean(empty, "small", "tail") == {t: list(sc.FORMATS) for t in sc.TOOLS}
    for bad in ("", None, 12):
        with pytest.raises(ValueError, match="kernel_text must be a kernel_source.fingerprint string"):
            sc.of_kernel_text([now], bad)


def test_the_dequantization_rewrite_was_sanitized_at_the_small_shape():
    """The kernel text of 2026-12-01's rewrite of the 4-bit and fp4 decoding (fingerprint
    99260f381d1a; the records of its runs carry it): at the small shape every part, in every
    format, clean under every tool."""
    # the records of that text's runs: the proof the rewrite was sanitized before it was kept
    recs = sc.load_records()
    cov = sc.coverage(sc.of_kernel_text(recs, "99260f381d1a"))
    assert (cov.loc["small"] == "T1H").all().all()
    assert sc.not_yet_clean(cov, "small", "head") == {t: [] for t in sc.TOOLS}


def test_runs_table_has_a_row_a_run_and_refuses_other_records():
    rec = _rec(
        runs=[
            {
                "tool": "memcheck",
                "parts": ["tail", "one-launch"],
                "formats": ["bfloat16", "nvfp4"],
                "passed": True,
                "errors": 0,
                "seconds": 12.4,
            },
            {
                "tool": "racecheck",
                "parts": ["head"],
                "formats": ["bfloat16"],
                "passed": False,
                "errors": None,
                "seconds": 240.0,
            },
        ]
    )
    table = sc.runs_table({"…one": dict(rec, device_written=True)})
    assert table[["tool", "parts", "formats", "device-written", "clean", "seconds"]].values.tolist() == [
        ["memcheck", "tail+one-launch", 2, True, True, 12],
        ["racecheck", "head", 1, True, False, 240],
    ]
    with pytest.raises(records.RecordError, match=r"records\['bad'\]: is a 'one_launch' record, expected 'sanitize'"):
        sc.runs_table({"bad": {"bench": "one_launch"}})


def test_runs_table_of_the_bonsai_runs_one_at_a_time():
    """The eight runs that finished Bonsai's shape (notebook 08 prints this table)."""
    # one tool and part at a time (--jobs 1): the only runs at Bonsai's shape that finished
    # within the sanitizer's time limit, so the only proof that shape is clean
    names = ["195411Z", "195511Z", "195611Z", "195746Z", "195827Z", "195954Z", "200044Z", "200122Z"]
    table = sc.runs_table({n: records.load("sanitize", f"sanitize-nvidia-h200-20261201T{n}.json") for n in names})
    assert len(table) == 8 and table["clean"].all() and (table["errors"] == 0).all()
    assert sorted(table["tool"].tolist()) == sorted(2 * list(sc.TOOLS))
    assert table["seconds"].sum() == 457
