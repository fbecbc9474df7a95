"""The figures the notebooks show.

Each function draws one figure from tested workbench functions and returns the
matplotlib ``Figure``; the notebook calls ``plt.show()``. Imports of other workbench
modules stay INSIDE each function, because plots sits at the bottom of the import
chain (design.md) and several people add functions here: a module-level import of
one of their modules must not break another's figure.
"""

from __future__ import annotations

from typing import Sequence


def plot_refusal_map(cfgs: Sequence, *, ax=None, kernels_enabled: bool = True):
    """Models by layer, each cell coloured by its verdict.

    One row per model (``ModelConfig``), one column per layer index. A cell is
    green where the attention tail may fuse, light grey where the layer is not an
    attention layer at all (nothing to fuse; Gated DeltaNet, Mamba-2, MLP-only), and
    otherwise coloured by the FIRST refusal reason, which is the one the seed itself
    would stop at. Rows of models with fewer layers end in white.

    Returns the ``matplotlib.figure.Figure``.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from workbench.model import Mixer
    from workbench.refusals import Refusal, refusals

    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("cfgs: need at least one ModelConfig, got an empty sequence")

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
                found = refusals(cfg, layer.index, kernels_enabled=kernels_enabled)
                code = 2 if not found else 3 + reasons.index(found[0])
            grid[r, layer.index] = code
            used.add(code)

    # One distinct colour a reason, in Refusal order; none of them green (eligible) or
    # light grey (not attention), so a refused cell never reads as either.
    reason_colours = [
        "#4d4d4d", "#9467bd", "#1f77b4", "#d62728", "#ff9896", "#8c564b", "#e377c2",
        "#bcbd22", "#17becf", "#aec7e8", "#c49c94", "#ff7f0e", "#c5b0d5", "#393b79",
    ]
    if len(reason_colours) < len(reasons):  # a reason added to Refusal needs a colour here
        raise ValueError(f"reasons: {len(reasons)} Refusal members, only {len(reason_colours)} colours")
    colours = ["white", "#e6e6e6", "#2ca02c"] + reason_colours[: len(reasons)]
    cmap = ListedColormap(colours)

    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.42 * len(cfgs) + 1.8))
    else:
        fig = ax.figure
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
    import matplotlib.pyplot as plt
    import numpy as np

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
    fig.colorbar(im2, ax=b, shrink=0.8)
    fig.tight_layout()
    return fig


def plot_quantization_study(df, *, title: str = "quantization error of the map, with and without the fold"):
    """Grouped bars: one group per format (rows of ``df``), one bar per fold (columns)."""
    import matplotlib.pyplot as plt
    import numpy as np

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
