"""The check's figure: per input scale, the distribution of each case's worst scaled error,
the implementation's beside the workbench reference's on the same cases, on one log x range
shared by every panel, with the tolerances judged drawn as vertical lines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The figure's x axis in words.
X_LABEL = "worst |x - y| / max(|y|, 1) of a case (log)"

_STYLES = ("--", ":", "-.", (0, (5, 1)))


def check_figure(report: Any) -> Any:
    """The figure of ``report`` (a :class:`~workbench.check.report.CheckReport`), a ``Figure``."""
    import matplotlib.pyplot as plt

    cases = report.cases
    scales = sorted(cases["scale"].unique())
    lines = {k: lim for k, (m, lim) in report.tolerances.items() if m == "worst" and lim > 0}
    vals = np.concatenate([cases["worst"].to_numpy(), cases["ref_worst"].to_numpy()])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    lo = vals.min() if vals.size else 1e-9
    hi = max([vals.max() if vals.size else 1.0, *lines.values()])
    edges = np.logspace(np.log10(lo) - 0.1, np.log10(hi) + 0.1, 40)
    fig, axes = plt.subplots(1, len(scales), figsize=(4 * len(scales), 3.2), squeeze=False, sharex=True)
    for ax, s in zip(axes[0], scales):
        d = cases[cases["scale"] == s]
        for col, label, color in (("worst", report.subject, "C0"), ("ref_worst", "workbench reference", "C1")):
            v = d[col].to_numpy()
            v = v[np.isfinite(v)]
            ax.hist(np.clip(v, edges[0], edges[-1]), bins=edges, alpha=0.5, label=label, color=color)
        for i, (name, lim) in enumerate(lines.items()):
            ax.axvline(lim, color=f"C{i + 3}", linestyle=_STYLES[i % len(_STYLES)], linewidth=1.2, label=name)
        ax.set_xscale("log")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_title(f"input scale {s:g} ({len(d)} cases)", fontsize=9)
        ax.set_xlabel(X_LABEL, fontsize=8)
    axes[0][0].set_ylabel("cases")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, names, fontsize=8, loc="upper center", ncol=min(len(handles), 5), bbox_to_anchor=(0.5, 0.0))
    return fig
