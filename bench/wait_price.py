"""Measure what one wait costs on this machine's MLX device, for the price ledger.

    python -m bench.wait_price                                    # a record in data/bench/
    python -m bench.wait_price --add data/bench/wait_price-<device>-<UTC time>.json   # into the ledger

A wait is the smallest submission plus its round trip to the host
(``workbench.waits.measurement.measure_wait_price``: ``(x + 1).item()`` on a resident scalar, warmed up, the
median of many with its spread); ``--device cpu`` measures a GPU machine's CPU stream instead. Writes
``data/bench/wait_price-<device>-<UTC time>.json`` (or ``--out``). ``--add`` copies a record into
``data/ledger/wait_prices.json`` (``--ledger``) as ``measured-<backend>-<device>``, replacing an entry of that
id only with ``--force`` (and saying which).
Needs only numpy and MLX (``PYTHONPATH=.`` on a GPU machine without the install).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from bench.common import cli, record
from bench.common.ledger import add_to_ledger


def _entry_id(rec: dict) -> str:
    dev = re.sub(r"[^a-z0-9]+", "-", str(rec.get("device", "device")).lower()).strip("-")[:40]
    return f"measured-{rec.get('backend', 'mlx')}-{dev}"


def ledger_entry(rec: dict) -> dict:
    """The ledger's entry for a measurement record."""
    keep = (
        "ms",
        "p10_ms",
        "p90_ms",
        "iqr_ms",
        "mean_ms",
        "eval_only_ms",
        "n",
        "warmup",
        "device",
        "backend",
        "date",
        "mlx_version",
        "method",
        "command",
    )
    entry = {"id": _entry_id(rec), "kind": "measured"}
    entry.update({k: rec[k] for k in keep if k in rec})
    entry["source"] = rec.get("record", "bench/wait_price.py")
    return entry


def add(p: argparse.ArgumentParser, record_path: str, ledger: str | None, force: bool) -> dict:
    """``--add``: the record's ledger entry into the ledger, reporting a replaced entry."""
    try:
        rec = json.loads(Path(record_path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        p.error(f"--add: cannot read the record {record_path}: {err}")
    if not isinstance(rec, dict):
        p.error(f"--add: {record_path} is not a wait_price record (a JSON object)")
    rec.setdefault("record", record.project_relative(record_path))
    entry = ledger_entry(rec)
    add_to_ledger(p, entry, ledger, force)
    return entry


def main(argv: list[str] | None = None) -> dict:
    p = cli.parser(
        "wait_price",
        __doc__,
        writes=(
            "writes a JSON record to OUT_DIR/wait_price-<device>-<UTC time>.json (or --out); with --add, changes only "
            "the ledger; never replaces a file or a ledger entry without --force"
        ),
    )
    p.add_argument(
        "--out", type=cli.out_file, default=None, help="write the JSON record to this file instead of OUT_DIR"
    )
    p.add_argument("--n", type=int, default=5000, help="timed waits")
    p.add_argument("--warmup", type=int, default=500, help="untimed waits first")
    p.add_argument("--device", choices=("default", "cpu", "gpu"), default="default", help="MLX device to measure")
    p.add_argument("--add", metavar="RECORD", help="add this record to the ledger and stop (measures nothing)")
    p.add_argument(
        "--ledger",
        type=cli.existing_file,
        default=None,
        help="the ledger file (default: the project's data/ledger/wait_prices.json)",
    )
    args = p.parse_args(argv)
    if args.n < 10:
        p.error(f"--n must be >= 10; got {args.n}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0; got {args.warmup}")

    if args.add is not None:  # --add "" names no record: refused when read, never a measurement instead
        return add(p, args.add, args.ledger, args.force)
    if args.out is not None and not args.no_record:
        cli.refuse_existing(p, args.out, args.force)

    import mlx.core as mx

    from workbench.waits import measure_wait_price

    device = None if args.device == "default" else mx.Device(getattr(mx, args.device))
    rec = {"bench": "wait_price", **measure_wait_price(device, n=args.n, warmup=args.warmup)}
    rec["command"] = " ".join(["python -m bench.wait_price"] + (argv if argv is not None else sys.argv[1:]))
    print(f"{'device':>12}  {rec['device']} ({rec['backend']}, MLX {rec['mlx_version']})")
    for k in ("ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "eval_only_ms"):
        print(f"{k:>12}  {rec[k]:.4f}")
    print(f"{'n':>12}  {rec['n']} (after {rec['warmup']} warm-up)")
    if not args.no_record:
        out = (
            args.out
            if args.out is not None
            else args.out_dir / (record.record_stem("wait_price", rec["device"]) + ".json")
        )
        rec["record"] = record.project_relative(out)
        path = record.write(rec, out.parent, out.stem, force=args.force)
        rec["record"] = record.project_relative(path)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.wait_price"))
