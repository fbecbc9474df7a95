"""Measure what one wait costs on this machine's MLX device, for the price ledger.

    python -m bench.wait_price --out data/bench/wait_price-cpu.json          # here (CPU)
    PYTHONPATH=/tmp/site:. python3 -m bench.wait_price --out data/bench/wait_price-h200.json   # on the H200
    python -m bench.wait_price --add data/bench/wait_price-h200.json         # into the ledger

A wait is the smallest submission plus its round trip to the host
(``workbench.wait_measurement.measure_wait_price``: ``(x + 1).item()`` on a resident scalar, warmed
up, the median of many with its spread). The record (device, date, MLX version, method,
the command line) goes to ``--out``; ``--add`` copies a record into
``data/ledger/wait_prices.json`` (``--ledger``) under the id ``measured-<backend>-<device>``.
With ``--device cpu`` a machine with a GPU measures its CPU stream instead.

Needs only numpy and MLX (the H200 machine has no pandas, no tqdm).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def _entry_id(rec: dict) -> str:
    dev = re.sub(r"[^a-z0-9]+", "-", str(rec.get("device", "device")).lower()).strip("-")[:40]
    return f"measured-{rec.get('backend', 'mlx')}-{dev}"


def ledger_entry(rec: dict) -> dict:
    """The ledger's entry for a measurement record."""
    keep = ("ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "eval_only_ms", "n", "warmup", "device", "backend", "date",
            "mlx_version", "method", "command")
    entry = {"id": _entry_id(rec), "kind": "measured"}
    entry.update({k: rec[k] for k in keep if k in rec})
    entry["source"] = rec.get("record", "bench/wait_price.py")
    return entry


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.wait_price", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the JSON record here (e.g. data/bench/wait_price-cpu.json)")
    p.add_argument("--n", type=int, default=5000, help="timed waits (default 5000)")
    p.add_argument("--warmup", type=int, default=500, help="untimed waits first (default 500)")
    p.add_argument("--device", choices=("default", "cpu", "gpu"), default="default", help="MLX device to measure")
    p.add_argument("--add", metavar="RECORD", help="add this record to the ledger and stop (measures nothing)")
    p.add_argument("--ledger", default=None, help="the ledger file (default data/ledger/wait_prices.json)")
    args = p.parse_args(argv)

    from workbench import wait_measurement, waits

    if args.add:
        rec = json.loads(Path(args.add).read_text())
        rec.setdefault("record", args.add)
        entry = ledger_entry(rec)
        waits.add_price(entry, args.ledger)
        print(f"added {entry['id']}: {entry['ms']:.4f} ms to {args.ledger or waits.LEDGER_PATH}")
        return entry

    import mlx.core as mx

    device = None if args.device == "default" else mx.Device(getattr(mx, args.device))
    rec = wait_measurement.measure_wait_price(device, n=args.n, warmup=args.warmup)
    rec["command"] = " ".join(["python -m bench.wait_price"] + (argv if argv is not None else sys.argv[1:]))
    print(f"{'device':>12}  {rec['device']} ({rec['backend']}, MLX {rec['mlx_version']})")
    for k in ("ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "eval_only_ms"):
        print(f"{k:>12}  {rec[k]:.4f}")
    print(f"{'n':>12}  {rec['n']} (after {rec['warmup']} warm-up)")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        rec["record"] = str(out)
        out.write_text(json.dumps(rec, indent=2) + "\n")
        print(f"record: {out}")
    return rec


if __name__ == "__main__":
    main()
