"""The figures the notebooks show.

Each function draws one figure from tested workbench functions and returns the
matplotlib ``Figure``; the notebook calls ``plt.show()``. This module is the top floor:
it may import any other workbench module, and none imports it (so ``import workbench``
never loads matplotlib).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from workbench import backends, validate
from workbench.fold.rotation import HadamardFold
from workbench.models.config import Mixer, ModelConfig
from workbench.models.refusals import Refusal, layer_refusals
from workbench.reports.schedule_run import clock_table
from workbench.waits import plan as waits


def _frame(name: str, df, columns: dict[str, str] | None = None):
    """``df`` checked to be a non-empty pandas DataFrame holding ``columns`` (parameter -> column)."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{name}: must be a pandas DataFrame, got {validate.describe(df)}")
    if df.empty:
        raise ValueError(f"{name}: the table is empty")
    for param, col in (columns or {}).items():
        if not isinstance(col, str) or col not in df.columns:
            raise ValueError(
                f"{param}: must be a column of {name} ({', '.join(map(str, df.columns))}), got {validate.describe(col)}"
            )
    return df


def _tolerances(tolerances) -> dict | None:
    """``None`` or a dict of label -> a finite number > 0 (drawn as lines on a log axis)."""
    if tolerances is None:
        return None
    if not isinstance(tolerances, dict):
        raise ValueError(
            f"tolerances: must be None or a dict of label -> tolerance, got {validate.describe(tolerances)}"
        )
    return {
        k: validate.number(f"tolerances[{k!r}]", v, minimum=0, exclusive_minimum=True) for k, v in tolerances.items()
    }


#: How a figure's title names MLX's device kind (``backends.device_kind``).
DEVICE_KINDS = {"cpu": "CPU", "cuda": "CUDA GPU", "metal": "Metal GPU"}


def _where(df) -> str:
    """Where a sweep frame's errors were measured, for a figure's title: its backends and the
    kind of device MLX ran them on (this process's: a sweep is measured where it is drawn).
    The kind, not the device's model name, so the same run draws the same figure on any
    machine of that kind (a committed notebook's figure stays the same bytes)."""
    names = ", ".join(str(b) for b in dict.fromkeys(df["backend"])) if "backend" in df.columns else "graph"
    return f"{names} on MLX's {DEVICE_KINDS.get(backends.device_kind(), backends.device_kind())}"


def _axes(ax, figsize: tuple[float, float]):
    """``(figure, axes)``: the caller's ``ax`` and its figure, or a new figure of ``figsize``."""
    if ax is None:
        return plt.subplots(figsize=figsize)
    return ax.figure, ax


def plot_refusal_map(cfgs: Sequence, *, ax=None, kernels_enabled: bool = True):
    """Models by layer, each cell coloured by its verdict.

    One row per model (``ModelConfig``), one column per layer index. A cell is
    green where the attention tail may fuse, light grey where the layer is not an
    attention layer at all (nothing to fuse; Gated DeltaNet, Mamba-2, MLP-only), and
    otherwise coloured by the FIRST refusal reason, which is the one frink-models
    itself would stop at. Rows of models with fewer layers end in white.

    Returns the ``matplotlib.figure.Figure``.
    """

    cfgs = list(validate.sequence("cfgs", cfgs, what="ModelConfigs"))
    for i, c in enumerate(cfgs):
        if not isinstance(c, ModelConfig):
            raise ValueError(
                f"cfgs[{i}]: must be a ModelConfig (e.g. load_model('bonsai-27b')), got {validate.describe(c)}"
            )
    kernels_enabled = validate.flag("kernels_enabled", kernels_enabled)

    # Category codes: 0 absent (past the model's last layer), 1 not attention,
    # 2 eligible, 3 + i the i-th Refusal in enum order.
    reasons = list(Refusal)
    max_layers = max(c.num_layers for c in cfgs)
    grid = np.zeros((len(cfgs), max_layers), dtype=int)
    used: set[int] = set()
    for r, cfg in enumerate(cfgs):
        for layer in cfg.layers:
            if layer.mixer is not Mixer.ATTENTION:
                code = 1
            else:
                found = layer_refusals(cfg, layer.index, kernels_enabled=kernels_enabled)
                code = 2 if not found else 3 + reasons.index(found[0])
            grid[r, layer.index] = code
            used.add(code)

    # One distinct colour a reason, in Refusal order; none of them green (eligible) or
    # light grey (not attention), so a refused cell never reads as either.
    reason_colours = [
        "#4d4d4d",
        "#9467bd",
        "#1f77b4",
        "#d62728",
        "#ff9896",
        "#8c564b",
        "#e377c2",
        "#bcbd22",
        "#17becf",
        "#aec7e8",
        "#c49c94",
        "#ff7f0e",
        "#c5b0d5",
        "#393b79",
        "#8c6d31",
    ]
    if len(reason_colours) < len(reasons):  # a reason added to Refusal needs a colour here
        raise ValueError(f"reasons: {len(reasons)} Refusal members, only {len(reason_colours)} colours")
    colours = ["white", "#e6e6e6", "#2ca02c"] + reason_colours[: len(reasons)]
    cmap = ListedColormap(colours)

    fig, ax = _axes(ax, (12, 0.42 * len(cfgs) + 1.8))
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(colours) - 1, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(cfgs)))
    ax.set_yticklabels([c.name for c in cfgs])
    ax.set_xlabel("layer index (0-based)")
    ax.set_title("Fused attention tail: eligible, or the first refusal reason")
    # Thin white lines between rows so adjacent models stay apart.
    ax.set_yticks(np.arange(-0.5, len(cfgs), 1), minor=True)
    ax.grid(which="minor", axis="y", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)

    labels = {1: "not attention (nothing to fuse)", 2: "eligible"}
    labels.update({3 + i: f"refused: {r.name}" for i, r in enumerate(reasons)})
    handles = [Patch(facecolor=colours[c], edgecolor="black", label=labels[c]) for c in sorted(used) if c != 0]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_rotation(fold, dim: int | None = None):
    """The dense orthogonal ``R`` of a fold as an image, with ``R R^T`` beside it.

    Blocks show as the diagonal squares of the Hadamard pattern; signs flip whole columns;
    a permutation scatters columns. Values are +-1/sqrt(b), so the colour scale is fixed.
    """

    if not isinstance(fold, HadamardFold):
        raise ValueError(f"fold: must be a HadamardFold, got {validate.describe(fold)}")
    r = fold.matrix(dim)
    v = 1.0 / np.sqrt(fold.block)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4.2))
    im = a.imshow(r, cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
    a.set_title(f"R = B P D  ({r.shape[0]}x{r.shape[1]}, block {fold.block})")
    a.set_xlabel("input index j")
    a.set_ylabel("output index i")
    fig.colorbar(im, ax=a, shrink=0.8)
    im2 = b.imshow(r @ r.T, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    b.set_title("R R^T = I (orthogonal)")
    b.set_xlabel("index j")
    b.set_ylabel("index i")
    fig.colorbar(im2, ax=b, shrink=0.8)
    fig.tight_layout()
    return fig


def plot_quantization_study(df, *, title: str = "quantization error of the map, with and without the fold"):
    """Grouped bars: one group per format (rows of ``df``), one bar per fold (columns)."""
    _frame("df", df)

    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(df.index))
    width = 0.8 / len(df.columns)
    for i, col in enumerate(df.columns):
        ax.bar(x + (i - (len(df.columns) - 1) / 2) * width, df[col].to_numpy(), width, label=str(col))
    ax.set_xticks(x, [str(i) for i in df.index])
    ax.set_ylabel("||map(Q(W)) - W||_F / ||W||_F")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(title="fold")
    fig.tight_layout()
    return fig


# -- the wait-cost table ----------------------------------------------------------------


def plot_stage_ms(cfg, prices, *, ax=None):
    """Ms a token that waits cost, stage by stage of the resident-state plan, at several prices.

    ``cfg``: a ``ModelConfig``; ``prices``: ``{label: ms a wait}`` (e.g. from the ledger).
    One line per price; the stages' wait counts label the x axis. Log y, since prices
    span two orders of magnitude. Returns the ``Figure``.
    """

    plan = waits.load_plan()
    counts = [waits.waits_per_token(cfg, s, plan=plan) for s in plan.stages]
    if not prices:
        raise ValueError("prices: need at least one {label: ms} entry")
    fig, ax = _axes(ax, (9, 4.2))
    x = list(range(1, len(counts) + 1))
    for label, p in prices.items():
        ms = [c * p for c in counts]
        ax.plot(x, ms, marker="o", label=f"{label} ({p:.3g} ms a wait)")
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{s.number}\n{c} wait{'' if c == 1 else 's'}" for s, c in zip(plan.stages, counts)])
    ax.set_xlabel("stage of the plan (5: floor, attention on the host; 6: attention on the device)")
    ax.set_ylabel("ms a token spent waiting")
    ax.set_title(f"{cfg.name}: what waits cost a token, stage by stage")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_wait_share(cfg, *, weight_gb=(54.0, 14.0, 7.0), bandwidth_gbs: float = 800.0, prices_ms=None):
    """How much of a token the waits take, and what the plan saves, against the price of a wait.

    A decode step streams every weight once (``weight_gb`` gigabytes at ``bandwidth_gbs``,
    default 800 GB/s, an M3-Ultra-class Apple GPU) and waits ``waits x price`` on top
    (``waits.wait_share``). Left: the share of a token the waits take at stage 1 (solid)
    and at the host floor (dashed), per weight size. Right: tokens a second at the host
    floor over stage 1 (the plan's speed-up). Returns the ``Figure``.
    """

    plan = waits.load_plan()
    first, floor = plan.stages[0], next(s for s in plan.stages if s.floor)
    w1, wf = waits.waits_per_token(cfg, first, plan=plan), waits.waits_per_token(cfg, floor, plan=plan)
    prices = np.logspace(-3, 0, 61) if prices_ms is None else np.asarray(prices_ms, dtype=float)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, gb in enumerate(weight_gb):
        colour = f"C{i}"
        s1 = [waits.wait_share(w1, p, gb * 1e9, bandwidth_gbs) for p in prices]
        sf = [waits.wait_share(wf, p, gb * 1e9, bandwidth_gbs) for p in prices]
        a.plot(prices, s1, color=colour, label=f"{gb:g} GB of weights, stage 1 ({w1} waits)")
        a.plot(prices, sf, color=colour, linestyle="--", label=f"{gb:g} GB, host floor ({wf} waits)")
        stream = gb / bandwidth_gbs * 1e3
        b.plot(prices, (stream + w1 * prices) / (stream + wf * prices), color=colour, label=f"{gb:g} GB")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("ms a wait")
        ax.grid(True, which="both", alpha=0.3)
        ax.axvline(0.17, color="grey", linewidth=0.8)
    a.set_ylabel("share of a token spent waiting")
    a.set_title(f"{cfg.name} at {bandwidth_gbs:g} GB/s (grey: frink-models' 0.17 ms)", fontsize=10)
    a.legend(fontsize=7)
    b.set_ylabel("tokens/s at the host floor / at stage 1")
    b.set_title("what the plan buys, by weight size", fontsize=10)
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _run_label(rec) -> str:
    """A schedule record's device and set-up in a few words (one legend entry per distinct one)."""
    label = f"{rec['device']} ({rec['backend']}), {rec['geometry']} geometry, {rec['dtype']}"
    quant = rec.get("quant")
    return label + (f" {quant}" if quant else "") + (", kernels" if rec.get("matvec") == "kernels" else "")


def _devices(records) -> str:
    """The devices a set of records were measured on, for a title: ``NVIDIA H200, AMD EPYC ...``."""
    return ", ".join(dict.fromkeys(str(r["device"]) for r in records))


#: The area (points squared) of :func:`plot_schedule_runs`' median markers; its faint dots are smaller.
MEDIAN_MARKER = 30


def plot_schedule_runs(records, *, ax=None):
    """The schedule's measured savings against the table's prediction, one marker a set-up and stage pair.

    ``records``: schedule records (``bench/schedule_run.py``'s JSON, as dicts). x: the
    predicted saving (waits saved x the price measured in the same run); y: the measured
    one (median ms a token of one stage minus the other's, paired by round where the
    record has each token's time). One marker a set-up and pair of stages: the median over
    that set-up's runs, each run's own point a faint dot behind it where it has several (one
    marker a comparison drew ~190, most on top of each other). Hollow markers: pairs
    with the device floor, where the attention moved to the device as well. The line y = x
    with a +-20% band.

    Runs of the same device and set-up share one colour and one legend entry (a folder of
    records holds many runs of few set-ups: one entry a run filled half the axes), the
    hollow markers one entry for all; the legend sits below the axes, and the axes span
    the points, not the longest diagonal. The title names the devices. Returns the ``Figure``.
    """

    if not records:
        raise ValueError("records: need at least one schedule record")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not {"comparisons", "device", "backend", "geometry", "dtype"} <= set(rec):
            raise ValueError(
                f"records[{i}]: must be a schedule record (bench.schedule_run's JSON), got {validate.describe(rec)}"
            )
    groups = list(dict.fromkeys(_run_label(r) for r in records))
    colour = {g: f"C{k % 10}" if k < 10 else plt.get_cmap("tab20")(k % 20) for k, g in enumerate(groups)}
    fig, ax = _axes(ax, (6.5, 5))
    # One marker a set-up and stage pair, at the median over the set-up's runs, each run's own
    # point a faint dot behind it: a folder of records drew ~190 equal markers, one a comparison,
    # most on top of each other.
    pairs: dict[tuple, list[tuple[float, float]]] = {}
    for rec in records:
        g = _run_label(rec)
        for c in rec["comparisons"]:
            key = (g, c.get("from"), c.get("to"), bool(c.get("same_work", True)))
            y = c.get("ms_saved_paired", c["ms_saved_measured"])
            pairs.setdefault(key, []).append((c["ms_saved_predicted"], y))
    xs, ys, labelled, hollow = [], [], set(), False
    for (g, _, _, same), points in pairs.items():
        pts = np.array([[np.nan if v is None else v for v in p] for p in points], dtype=float)
        xs.append(pts[:, 0])
        ys.append(pts[:, 1])
        pts = pts[np.isfinite(pts).all(axis=1)]
        if not len(pts):
            continue
        if len(pts) > 1:  # the runs themselves, faint
            ax.scatter(pts[:, 0], pts[:, 1], color=colour[g], s=6, alpha=0.3, linewidths=0, zorder=2)
        x, y = np.median(pts[:, 0]), np.median(pts[:, 1])
        if same:
            ax.scatter([x], [y], color=colour[g], s=MEDIAN_MARKER, label=None if g in labelled else g, zorder=3)
            labelled.add(g)
        else:  # pairs with the device floor: the attention moved too, not only the waits
            ax.scatter([x], [y], facecolors="none", edgecolors=colour[g], s=MEDIAN_MARKER, zorder=3)
            hollow = True
    if hollow:  # one entry for every run's hollow markers, in neutral grey
        ax.scatter(
            [], [], facecolors="none", edgecolors="grey", label="hollow: against the device floor (attention moved too)"
        )
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    ok = np.isfinite(x_all) & np.isfinite(y_all)
    if not ok.any():
        raise ValueError("records: no comparison has a finite predicted and measured saving")
    lo_x, hi_x = min(0.0, float(x_all[ok].min())), max(float(x_all[ok].max()), 1e-9)
    lo_y, hi_y = min(0.0, float(y_all[ok].min())), max(float(y_all[ok].max()), 1.2 * hi_x)
    t = np.linspace(lo_x, hi_x * 1.05, 50)
    ax.plot(t, t, color="black", linewidth=0.8, label="measured = predicted")
    ax.fill_between(t, 0.8 * t, 1.2 * t, color="grey", alpha=0.2, label="within 20%")
    ax.set_xlim(lo_x - 0.05 * (hi_x - lo_x), hi_x + 0.05 * (hi_x - lo_x))
    ax.set_ylim(lo_y - 0.05 * (hi_y - lo_y), hi_y + 0.05 * (hi_y - lo_y))
    ax.set_xlabel("predicted saving, ms a token (waits saved x measured price)")
    ax.set_ylabel("measured saving, ms a token")
    ax.set_title(f"The schedule against the table: {len(records)} runs on {_devices(records)}", fontsize=10)
    ax.text(
        0.01,
        0.99,
        "markers: a set-up's median for a pair of stages; faint dots: its runs",
        transform=ax.transAxes,
        fontsize=7,
        va="top",
        color="dimgrey",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    fig.tight_layout()
    return fig


def plot_stage_clock(runs, *, ax=None):
    """Ms a token at each stage of the plan, one line per weight format, beside its floor.

    ``runs``: ``{format label: schedule record}`` (records of ``bench.schedule_run
    --matvec kernels``, whose ``clock_table`` has each stage's ms). Solid: the measured
    median ms a token; dashed, same colour: that run's weight-bytes floor (the bytes a token
    streams over the copy bandwidth measured in the same run). The title names the devices.
    Returns the ``Figure``.
    """
    if not isinstance(runs, dict) or not runs:
        raise ValueError(
            f"runs: must be a non-empty dict of format label -> schedule record, got {validate.describe(runs)}"
        )
    fig, ax = _axes(ax, (8, 3.5))
    top = 0.0
    for i, (fmt, rec) in enumerate(runs.items()):
        clock = clock_table(rec)
        ax.plot(clock["stage"], clock["ms"], marker="o", color=f"C{i}", label=f"{fmt}: ms a token")
        ax.axhline(rec["floor_ms"], color=f"C{i}", ls="--", lw=1, label=f"{fmt}: weight-bytes floor")
        top = max(top, float(np.nanmax(clock["ms"])), float(rec["floor_ms"]))
    ax.set_xlabel("stage of the plan")
    ax.set_ylabel("ms a token (median)")
    ax.set_ylim(0, top * 1.1)
    ax.set_title(
        f"A decode step on the project's kernels, stage by stage: {_devices(list(runs.values()))}", fontsize=10
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


# -- error distributions and tolerances -----------------------------------------------


#: A sweep's metric columns in words, for axis labels and titles: a reader of a figure
#: should not need the frame's column names (``workbench.studies.sweeps`` defines them).
METRIC_WORDS: dict[str, str] = {
    "worst": "worst scaled error vs the stored weights' truth",
    "max_abs": "largest absolute error vs the stored weights' truth",
    "max_rel": "largest relative error vs the stored weights' truth",
    "nmse": "normalized squared error vs the stored weights' truth",
    "ulp_max": "largest error in float32 ulps",
    "ulp_mean": "mean error in float32 ulps",
    "torch_ratio": "error / torch's float32 tolerance",
    "model_worst": "worst scaled error vs the master weights' truth",
    "model_nmse": "normalized squared error vs the master weights' truth",
}


def metric_words(metric: str) -> str:
    """``metric`` (a sweep's column) in words, its column name after them: ``"worst scaled error
    vs the master weights' truth (model_worst)"``; a column not listed is its own name."""
    words = METRIC_WORDS.get(metric)
    return metric if words is None else f"{words} ({metric})"


def _tolerance_lines(ax, tolerances, *, vertical: bool = True) -> None:
    """Draw ``name -> value`` as labelled lines (vertical: x = value)."""
    styles = ["--", ":", "-.", (0, (5, 1)), (0, (1, 1))]
    for i, (name, value) in enumerate((tolerances or {}).items()):
        kw = dict(color=f"C{(i + 3) % 10}", linestyle=styles[i % len(styles)], linewidth=1.2, label=name)
        if vertical:
            ax.axvline(value, **kw)
        else:
            ax.axhline(value, **kw)


def plot_error_histograms(df, *, metric: str = "worst", by: str = "dtype", tolerances=None, bins: int = 60):
    """Histograms of a sweep's per-case ``metric`` on a log x axis, one panel per ``by`` value.

    ``df``: a ``workbench.studies.sweeps.sweep`` frame; ``tolerances``: ``name -> value`` drawn as
    vertical lines on every panel (e.g. frink-models' 2e-4 and the calibrated ones). Returns the
    ``Figure``.
    """

    _frame("df", df, {"metric": metric, "by": by})
    tolerances = _tolerances(tolerances)
    bins = validate.integer("bins", bins, minimum=2, maximum=10_000)
    groups = [(k, g[metric].to_numpy()) for k, g in df.groupby(by, observed=True)]
    if not groups:
        raise ValueError("df: the sweep is empty")
    vals = np.concatenate([v for _, v in groups])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    lo = vals.min() if vals.size else 1e-9
    hi = max([vals.max() if vals.size else 1.0] + list((tolerances or {}).values()))
    edges = np.logspace(np.log10(lo) - 0.1, np.log10(hi) + 0.1, bins)
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 1.9 * len(groups) + 0.8), sharex=True, squeeze=False)
    for ax, (k, v) in zip(axes[:, 0], groups):
        ax.hist(v[v > 0], bins=edges, color="C0", alpha=0.8)
        _tolerance_lines(ax, tolerances)
        ax.set_xscale("log")
        ax.set_ylabel("cases")
        ax.set_title(f"{by} = {k}  ({len(v)} cases)", fontsize=9)
    # The legend goes beside the panels, not on them: inside, it hid the bf16 histogram's bars.
    handles, names = axes[0, 0].get_legend_handles_labels()
    axes[-1, 0].set_xlabel(f"{metric_words(metric)}, per case (log)")
    fig.suptitle(f"{metric_words(metric)} of each case, {len(df)} cases: {_where(df)}", fontsize=10)
    fig.tight_layout()
    if handles:
        fig.legend(
            handles,
            names,
            fontsize=8,
            loc="upper center",
            ncol=min(len(handles), 3),
            bbox_to_anchor=(0.5, 0.0),
            frameon=False,
        )
    return fig


def plot_error_ecdf(df, *, metric: str = "worst", by: str = "dtype", tolerances=None, flake_rate=None, ax=None):
    """Exceedance curves ``P(error > x)`` per ``by`` group, log-log: the tail a tolerance sits in.

    The complement of the ECDF, so the far tail (where a tolerance must sit) is visible.
    ``flake_rate``: a horizontal line at that probability; ``tolerances``: vertical lines.
    """

    _frame("df", df, {"metric": metric, "by": by})
    tolerances = _tolerances(tolerances)
    if flake_rate is not None:
        flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=1)
    fig, ax = _axes(ax, (8, 4.5))
    for i, (k, g) in enumerate(df.groupby(by, observed=True)):
        v = np.sort(g[metric].to_numpy())
        n = v.size
        surv = 1.0 - np.arange(n) / n  # P(E >= v_i)
        ax.step(v, surv, where="post", color=f"C{i}", label=f"{by} = {k}")
    _tolerance_lines(ax, tolerances)
    if flake_rate is not None:
        ax.axhline(flake_rate, color="grey", linewidth=0.8)
        ax.annotate(
            f"flake rate {flake_rate:g}",
            (0.01, flake_rate),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            va="bottom",
            color="grey",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{metric_words(metric)}, x (log)")
    ax.set_ylabel("share of cases whose error exceeds x (log)")
    ax.set_title(f"how often the error exceeds x, {len(df)} cases: {_where(df)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_fold_effect(df, *, metric: str = "model_nmse", ax=None, title: str | None = None):
    """Median ``metric`` per quantization, with and without a fold (bars, log y), with the
    interquartile range as error bars: where the fold matters (against the master weights).
    ``title``: default, the metric, the case count and where they were measured."""

    _frame("df", df, {"metric": metric})
    if not {"quant", "fold"} <= set(df.columns):
        raise ValueError("df: must be a sweep's frame, with its 'quant' and 'fold' columns")
    stats = df.groupby(["quant", "fold"], observed=True)[metric].quantile([0.25, 0.5, 0.75]).unstack()
    quants = list(dict.fromkeys(stats.index.get_level_values(0)))
    folds = list(dict.fromkeys(stats.index.get_level_values(1)))
    fig, ax = _axes(ax, (8, 4))
    width = 0.8 / max(len(folds), 1)
    x = np.arange(len(quants))
    for j, f in enumerate(folds):
        med, lo, hi = [], [], []
        for q in quants:
            row = stats.loc[(q, f)] if (q, f) in stats.index else None
            med.append(np.nan if row is None else row[0.5])
            lo.append(np.nan if row is None else row[0.5] - row[0.25])
            hi.append(np.nan if row is None else row[0.75] - row[0.5])
        ax.bar(
            x + (j - (len(folds) - 1) / 2) * width,
            med,
            width,
            yerr=[lo, hi],
            capsize=3,
            color=f"C{j}",
            label=f"fold {f}",
        )
    ax.set_xticks(x, quants, rotation=20)
    ax.set_yscale("log")
    ax.set_xlabel("weight format")
    ax.set_ylabel(f"median {metric_words(metric)} (log)", fontsize=8)
    ax.set_title(
        title
        if title is not None
        else f"median error (bars: quartiles) by weight format, {len(df)} cases: {_where(df)}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.2)
    fig.tight_layout()
    return fig


def plot_catch_rates(rates, *, ax=None, title: str = "fraction of wrong tails each tolerance catches"):
    """A heat map of ``workbench.studies.calibration.catch_rates`` output: rows mutations, columns tolerances."""

    _frame("rates", rates)
    data = rates.to_numpy(dtype=float)
    # Large cells and large numbers: the figure is read for its numbers, so each gets room,
    # and each is black or white, whichever stands out more against its cell's colour.
    fig, ax = _axes(ax, (1.45 * data.shape[1] + 3.5, 0.8 * data.shape[0] + 2.5))
    cmap = plt.get_cmap("RdYlGn")
    im = ax.imshow(data, vmin=0, vmax=1, cmap=cmap, aspect="auto")
    labels = [" / ".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in rates.index]
    ax.set_yticks(range(len(labels)), labels, fontsize=11)
    ax.set_xticks(range(data.shape[1]), [str(c) for c in rates.columns], rotation=30, ha="right", fontsize=10)
    for (i, j), v in np.ndenumerate(data):
        r, g, b, _ = cmap(v) if np.isfinite(v) else (1.0, 1.0, 1.0, 1.0)
        luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
        ax.text(
            j,
            i,
            f"{v:.2f}",
            ha="center",
            va="center",
            fontsize=12,
            fontweight="bold",
            color="black" if luminance > 0.5 else "white",
        )
    fig.colorbar(im, ax=ax, fraction=0.03, label="caught")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
