"""What a wait costs between two real submissions: the split price, beside the tiny one.

    python -m bench.split_price                  # here: tiny step and a small tail; --bonsai: Bonsai-27B's tail too
    python -m bench.split_price --add data/bench/schedule_run-<device>-<UTC time>.json   # its split prices, ledgered

The plan's table prices a wait at the smallest submission's round trip; an engine's waits sit between real
submissions, where the device also idles while the host reads back, encodes and submits. This measures that
(``wait_measurement.measure_split_price``): a step run twice, dependent, as two submissions against the same two
in one, for ``tiny`` (``x * 0.5 + 1`` on a scalar), ``tail-graph`` (the tail as one MLX graph) and, on a GPU,
``tail-kernels``. Writes ``data/bench/split_price-<device>-<UTC time>.json``.

The split prices BY KIND are measured by ``bench.schedule_run`` in the run they price; ``--add`` puts them into
``data/ledger/wait_prices.json`` under a lock, one entry a kind
(``split-<backend>-<device>-<matvec>-<dtype>-<kind>``), replacing an entry only with ``--force``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from bench.common import cli, record
from bench.common.ledger import add_to_ledger
from workbench import backends, tail
from workbench.kernels import prepared
from workbench.models import BONSAI_SHAPE
from workbench.waits import measure_split_price, measure_wait_price


def tail_steps(shape: tuple[int, int, int], block: int, dtype: str, seed: int) -> dict[str, Callable]:
    """``h -> tail(branch, h)`` for one layer's tail, as the MLX graph and (on a GPU) the kernels."""
    w = tail.TailWeights.random(*shape, seed=seed, fold_block=block, dtype=dtype)
    branch, _ = tail.random_inputs(w, seed=seed + 1)
    launch = tail.tail_launch(w)
    b = mx.array(branch)
    mx.eval(b)
    steps: dict[str, Callable] = {"tail-graph": lambda h: tail.tail_graph(launch, b, h)}
    dialect = "cuda" if backends.cuda_available() else ("metal" if backends.metal_available() else None)
    if dialect is not None:
        kern = prepared(launch, dialect)
        steps["tail-kernels"] = lambda h: kern(b, h)
    return steps


def split_entries(rec: dict, source: str) -> list[dict]:
    """The ledger entries for a ``bench.schedule_run`` record's split prices (one a kind).

    A price is the median of ``split - joined``; where that is not above zero (the joined
    run was no faster: the split costs nothing measurable), there is no price to enter
    and a ValueError says so, naming the kind.
    """
    if not isinstance(rec, dict) or rec.get("bench") != "schedule_run" or not rec.get("splits"):
        raise ValueError("the record must be a bench.schedule_run record with split prices ('splits')")
    dev = re.sub(r"[^a-z0-9]+", "-", str(rec["device"]).lower()).strip("-")[:40]
    dtype = rec["dtype"] + (f"-{rec['quant']}" if rec.get("quant") else "")
    out = []
    for r in rec["splits"]:
        if not r["ms"] > 0:
            raise ValueError(
                f"split {r['split']!r}: its measured price is {r['ms']:.4f} ms (split no slower than "
                "joined), which is no price; not entered"
            )
        out.append(
            {
                "id": f"split-{rec['backend']}-{dev}-{rec['matvec']}-{dtype}-{r['split']}",
                "kind": "measured",
                "ms": r["ms"],
                "p90_ms": r["p90_ms"],
                "n": r["n"],
                "warmup": r["warmup"],
                "device": rec["device"],
                "backend": rec["backend"],
                "date": rec["date"][:10],
                "mlx_version": rec["mlx_version"],
                "command": _without_out(rec["command"]),
                "split": r["split"],
                "matvec": rec["matvec"],
                "dtype": dtype,
                "method": r["method"]
                + f" Submissions: the {rec['model']} decode step's own ({rec['geometry']} geometry, "
                f"{rec.get('matvec_detail', rec['matvec'])}).",
                "source": source,
            }
        )
        if r["p10_ms"] >= 0:
            out[-1]["p10_ms"] = r["p10_ms"]
        else:  # a spread below zero is no price: said, not clipped
            out[-1]["method"] += (
                f" Its 10th percentile, {r['p10_ms']:.4f} ms, is below zero (in some rounds the split "
                "ran faster than the joined), so only the 90th is entered; the record has both."
            )
    return out


def _without_out(command: str) -> str:
    """``command`` without its ``--out-dir`` / ``--out`` argument: where a device wrote its
    record is no part of how it measured, and the ledger names no path outside the project."""
    return re.sub(r"\s--out(-dir)?(=|\s+)\S+", "", command)


def add(p, record_path: str, ledger: str | None, force: bool) -> list[dict]:
    """``--add``: a schedule_run record's split prices into the ledger, one entry a kind."""
    from workbench.waits import check_entry

    try:
        rec = json.loads(Path(record_path).read_text())
        entries = split_entries(rec, record.project_relative(record_path))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, ValueError) as err:
        p.error(f"--add: {record_path}: {err}")
    for e in entries:  # every entry checked before the first is written
        try:
            check_entry(e)
        except ValueError as err:
            p.error(f"--add: {err}")
    for e in entries:
        add_to_ledger(p, e, ledger, force)
    return entries


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("split_price", __doc__)
    p.add_argument("--n", type=int, default=50, help="timed rounds per step")
    p.add_argument("--bonsai", action="store_true", help="also Bonsai-27B's tail (5120, 6144, 17408), bf16")
    p.add_argument(
        "--add",
        metavar="RECORD",
        help="put a bench.schedule_run record's split prices into the ledger and stop (measures nothing)",
    )
    p.add_argument(
        "--ledger",
        type=cli.existing_file,
        default=None,
        help="the ledger file (default: the project's data/ledger/wait_prices.json)",
    )
    args = p.parse_args(argv)
    if args.add is not None:  # --add "" names no record: refused when read, never a measurement instead
        return {"added": add(p, args.add, args.ledger, args.force)}
    if args.n < 5:
        p.error("--n must be >= 5")

    tiny = measure_wait_price(n=max(200, args.n * 4), warmup=50)
    rows = [
        {
            "step": "tiny wait (measure_wait_price)",
            "shape": "scalar",
            "ms": tiny["ms"],
            "p10_ms": tiny["p10_ms"],
            "p90_ms": tiny["p90_ms"],
        }
    ]
    x = mx.array(1.0)
    rows.append(
        {
            "step": "tiny",
            "shape": "scalar",
            **measure_split_price(lambda a: a * 0.5 + 1.0, x, n=args.n),
        }
    )
    shapes = [("small", (256, 384, 704), 128)]
    if args.bonsai:
        shapes.append(("bonsai27b", BONSAI_SHAPE, 1024))
    for label, shape, block in shapes:
        steps = tail_steps(shape, block, "bfloat16", seed=7)
        h = mx.random.uniform(-1, 1, (shape[0],), key=mx.random.key(8))
        mx.eval(h)
        for name, step in cli.progress(steps.items(), len(steps), f"{label} tails"):
            rows.append({"step": name, "shape": label, **measure_split_price(step, h, n=args.n)})
        del steps

    print(f"{'step':<32} {'shape':<10} {'price ms':>9} {'p10':>8} {'p90':>8} {'split ms':>9} {'joined ms':>10}")
    for r in rows:
        print(
            f"{r['step']:<32} {r['shape']:<10} {r['ms']:>9.4f} {r['p10_ms']:>8.4f} {r['p90_ms']:>8.4f} "
            f"{r.get('split_ms', float('nan')):>9.4f} {r.get('joined_ms', float('nan')):>10.4f}"
        )
    rec = {
        **record.provenance("split_price", argv),
        "method": measure_split_price.__doc__.split("\n\n")[1].strip(),
        "results": rows,
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("split_price"), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.split_price"))
