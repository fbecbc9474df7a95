"""The notebooks' figures: titled with what and where it was measured, legends that fit, axes that fit the data.

A figure read out of context (a report page, a slide) must say what it shows and on which
device; a legend with an entry per run covered half of the schedule's plot, and an axis
drawn to the longest diagonal left every point in a corner. These are checked on the
figures drawn from the project's own records and from a small sweep.
"""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from workbench import backends
from workbench.decode import savings
from workbench.reports import plots
from workbench.reports import schedule_run as schedule_report
from workbench.studies import sweeps

RECORDS = schedule_report.load_records()


def _legend_outside_the_axes(fig, ax) -> bool:
    """The legend's box lies beside or below the axes' box, and inside the figure (drawn,
    in display coordinates): it covers no point and is not cut off."""
    fig.canvas.draw()
    legend, axes, page = ax.get_legend().get_window_extent(), ax.get_window_extent(), fig.bbox
    beside_or_below = legend.x0 >= axes.x1 or legend.y1 <= axes.y0
    return beside_or_below and page.x0 - 1 <= legend.x0 and legend.x1 <= page.x1 + 1 and legend.y0 >= page.y0 - 1


def test_the_schedule_figure_has_one_entry_a_setup_and_axes_that_fit():
    fig = plots.plot_schedule_runs(RECORDS)
    ax = fig.axes[0]
    setups = {plots._run_label(r) for r in RECORDS}
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(texts) == len(set(texts)) <= len(setups) + 3  # + the hollow markers, the line and the band
    assert _legend_outside_the_axes(fig, ax)
    x = np.concatenate([c.get_offsets()[:, 0] for c in ax.collections if len(c.get_offsets())])
    lo, hi = ax.get_xlim()
    assert lo <= x.min() and x.max() <= hi and (hi - lo) <= 1.2 * (x.max() - min(x.min(), 0.0))
    assert all(str(r["device"]) in ax.get_title() for r in RECORDS)
    plt.close(fig)


def test_the_stage_clock_names_its_device_and_starts_at_zero():
    kinds = set(savings.MEASURED_SPLITS) - {"qkv>host|wo"}
    runs = {
        r.get("quant") or r["dtype"]: r
        for r in schedule_report.kernel_records(RECORDS)
        if kinds <= {s["split"] for s in r["splits"]}
    }
    if not runs:
        pytest.skip("no kernels record with every split priced in data/bench")
    fig = plots.plot_stage_clock(runs)
    ax = fig.axes[0]
    assert all(str(r["device"]) in ax.get_title() for r in runs.values()) and ax.get_ylim()[0] == 0
    assert _legend_outside_the_axes(fig, ax)
    plt.close(fig)
    for bad in ({}, [], None, {"bf16": {"device": "x"}}):
        with pytest.raises(ValueError, match="^(runs|rec)"):
            plots.plot_stage_clock(bad)


@pytest.fixture(scope="module")
def small_sweep():
    return sweeps.sweep(
        shapes=[(64, 128, 192)], seeds=range(16), folds=(None, 16), quantize=(None, "affine8"), progress=False
    )


@pytest.mark.parametrize(
    "draw",
    [
        lambda df: plots.plot_error_histograms(df),
        lambda df: plots.plot_error_ecdf(df),
        lambda df: plots.plot_fold_effect(df),
    ],
)
def test_a_sweep_figure_says_what_and_where_it_was_measured(small_sweep, draw):
    fig = draw(small_sweep)
    titles = [fig._suptitle.get_text() if fig._suptitle else ""] + [a.get_title() for a in fig.axes]
    where = f"on MLX's {plots.DEVICE_KINDS[backends.device_kind()]}"
    assert any(where in t and f"{len(small_sweep)} cases" in t for t in titles), titles
    plt.close(fig)


def test_the_schedule_figure_refuses_what_is_not_a_record():
    for bad in ([], [{"device": "x"}], [3]):
        with pytest.raises(ValueError, match="^records"):
            plots.plot_schedule_runs(bad)


def test_the_schedule_figure_draws_one_marker_a_setup_and_stage_pair():
    """~190 comparisons in data/bench drew ~190 markers on top of each other: one a set-up and
    pair of stages (the median over its runs) reads."""
    fig = plots.plot_schedule_runs(RECORDS)
    ax = fig.axes[0]
    markers = sum(
        len(c.get_offsets())
        for c in ax.collections
        if type(c).__name__ == "PathCollection" and len(c.get_sizes()) and c.get_sizes()[0] >= plots.MEDIAN_MARKER
    )
    keys = {
        (plots._run_label(r), c.get("from"), c.get("to"), bool(c.get("same_work", True)))
        for r in RECORDS
        for c in r["comparisons"]
    }
    assert markers <= len(keys) < sum(len(r["comparisons"]) for r in RECORDS)
    plt.close(fig)


@pytest.mark.parametrize(
    "draw",
    [
        lambda df: plots.plot_error_histograms(df, metric="model_worst"),
        lambda df: plots.plot_error_ecdf(df, metric="model_worst"),
        lambda df: plots.plot_fold_effect(df, metric="model_nmse"),
    ],
)
def test_a_sweep_figure_labels_its_axes_in_words(small_sweep, draw):
    """An axis says what it measures in words (the column's name may follow in brackets)."""
    fig = draw(small_sweep)
    labels = [a.get_xlabel() for a in fig.axes] + [a.get_ylabel() for a in fig.axes]
    labels = [text for text in labels if text]
    assert any("master weights' truth" in text for text in labels), labels
    for text in labels:  # a column's name only in brackets, after the words
        assert "_" not in re.sub(r"\([^)]*\)", "", text), text
    plt.close(fig)
