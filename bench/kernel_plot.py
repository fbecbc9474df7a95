"""The kernel benchmark's plot: every weight format's milliseconds against its own floor.

    python -m bench.kernel_plot data/bench/kernel_bench-<device>-<date>.json

Reads a record of ``python -m bench.kernel_bench`` (or ``bench.gpu_check``, whose
``bench`` section is the same) and writes a PNG beside it (same name, ``.png``): one group
of bars per format (bf16, affine 4/8-bit, mxfp4, nvfp4): the floor (weight + scale bytes
over the measured copy bandwidth), the kernels' device time a tail (10 tails in one
evaluation), one evaluation with its wait (compiled), and PyTorch's CUDA-graph replay where
it has a peer (bf16). Each bar is labelled with its ratio to the floor. Never overwrites a
PNG that exists (``--force`` to replace it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.common import cli
from workbench.reports import records

#: The record kinds whose ``bench`` section holds the kernel benchmark's cases.
PLOTTED = ("kernel_bench", "gpu_check")

#: (label, how to read the ms from a case entry) for each bar of a format.
SERIES: tuple[tuple[str, Any], ...] = (
    ("floor", lambda c: c["floor_ms"]),
    ("kernels, device time", lambda c: c["device_ms_per_tail"]["kernels"]),
    (
        "kernels, one wait (compiled)",
        lambda c: c["resident_ms"].get("kernels_compiled", c["resident_ms"]["kernels"])["median_ms"],
    ),
    ("PyTorch CUDA graph, one wait", lambda c: c["resident_ms"].get("torch_cuda_graph", {}).get("median_ms")),
)


def plot(rec: dict[str, Any], path: Path) -> Path:
    cases = rec["bench"]["cases"]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.2
    for j, (label, get) in enumerate(SERIES):
        xs, ys, cs = [], [], []
        for i, c in enumerate(cases):
            v = get(c)
            if v is not None:
                xs.append(i + (j - 1.5) * width)
                ys.append(v)
                cs.append(c)
        bars = ax.bar(xs, ys, width, label=label)
        for b, v, c in zip(bars, ys, cs):
            ax.annotate(
                f"{v / c['floor_ms']:.2f}x", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7
            )
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{c['case'].removeprefix('bonsai27b-')}\n{c['weight_bytes'] / 1e6:.0f} MB" for c in cases])
    ax.set_ylabel("ms per tail")
    bw = rec["bench"]["copy_bandwidth_Bps"]["used_for_floor"]
    device = rec.get("device", "")
    device = device.get("device_name", "") if isinstance(device, dict) else device
    ax.set_title(
        f"Bonsai-27B tail on {device}"
        f" (MLX {rec.get('mlx_version', '?')}): ms against the floor (bytes / {bw / 1e12:.2f} TB/s)"
    )
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the ratios above the tallest bars
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(
        "kernel_plot",
        __doc__,
        record_options=False,
        writes="writes RECORD's figure beside it, as RECORD with .png for .json; never replaces "
        "an existing PNG without --force",
    )
    ap.add_argument("record", help="a kernel_bench (or gpu_check) JSON record")
    ap.add_argument("--force", action="store_true", help="replace the PNG if it exists")
    a = ap.parse_args(argv)
    src = Path(a.record)
    # A missing, unreadable, empty, truncated or binary file is the user's input, not a bug:
    # one line naming it, never a traceback.
    try:
        rec = json.loads(src.read_text(encoding="utf-8"))
    except FileNotFoundError:
        ap.error(f"record: no file {src}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        ap.error(f"record: {src} is not a readable JSON record ({type(err).__name__}: {err})")
    if not isinstance(rec, dict):
        ap.error(f"record: {src} holds a JSON {type(rec).__name__}, not a record (an object)")
    kind = records.kind_of(rec)
    if kind not in PLOTTED:
        ap.error(
            f"record: {src} is {'no bench record' if kind is None else f'a {kind} record'}; this plot reads "
            f"a record of {' or '.join(PLOTTED)}"
        )
    section = rec.get("bench")
    if not isinstance(section, dict) or not isinstance(section.get("cases"), list) or not section["cases"]:
        ap.error(
            f"record: {src} has no benchmark cases (a 'bench' section with a list of 'cases'); "
            "a gpu_check record run with --checks-only has none"
        )
    out = src.with_suffix(".png")
    if out.exists() and not a.force:
        ap.error(f"{out} exists; pass --force to replace it")
    try:
        print(f"plot: {plot(rec, out)}")
    except (KeyError, TypeError, AttributeError, ZeroDivisionError) as err:
        # A record of the right kind whose cases lack a field the bars read (an older schema,
        # a hand-edited file): said in one line, naming the file and the field.
        ap.error(f"record: {src}: a case lacks what the plot reads ({type(err).__name__}: {err})")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.kernel_plot"))
