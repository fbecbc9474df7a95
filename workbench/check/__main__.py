"""Check a fused tail of your own against the float64 oracle, for an engine's CI.

    python -m workbench.check mypkg.tails:my_tail --seeds 200 --tolerance 1e-4 --record check.json

The implementation is a callable by import path (``module:function``, handed one
``workbench.check.StoredCase`` a call) or a kernels folder (``--kernels-dir``, run on the
CPU emulator). Prints the verdict and the tables, writes the JSON record where
``--record`` says (never over an existing file), and exits 1 when the verdict fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from workbench import files
from workbench.check.run import DEFAULT_SCALES, check_kernel
from workbench.check.subjects import CallableSubject, KernelsFolderSubject


def _callable(path: str):
    mod, _, attr = path.partition(":")
    if not mod or not attr:
        raise SystemExit(f"implementation: must be 'module:function', got {path!r}")
    return getattr(importlib.import_module(mod), attr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("implementation", nargs="?", help="module:function of a callable tail")
    p.add_argument("--kernels-dir", help="a folder shaped like kernels/ (run on the CPU emulator)")
    p.add_argument("--seeds", type=int, default=100, help="seeded cases a configuration (default 100)")
    p.add_argument("--scales", default=",".join(f"{s:g}" for s in DEFAULT_SCALES), help="input scales, comma-separated")
    p.add_argument("--fold", type=int, default=16, help="fold block on wo's input (0: none; default 16)")
    p.add_argument("--tolerance", type=float, help="your own tolerance on the worst scaled error")
    p.add_argument("--time-limit", type=float, default=30.0, help="seconds a case may take (default 30)")
    p.add_argument("--record", help="write the JSON record here (refused if the file exists)")
    a = p.parse_args(argv)
    if (a.implementation is None) == (a.kernels_dir is None):
        p.error("give exactly one of: implementation (module:function), --kernels-dir")
    subject = KernelsFolderSubject(a.kernels_dir) if a.kernels_dir else CallableSubject(_callable(a.implementation))
    rep = check_kernel(subject, seeds=range(a.seeds), scales=[float(s) for s in a.scales.split(",")],
                       folds=(a.fold or None,), tolerance=a.tolerance, time_limit=a.time_limit)
    print(rep)
    if a.record:
        files.write_atomic(a.record, json.dumps(rep.to_record(), indent=1) + "\n", overwrite=False)
    return 0 if rep.passed else 1


if __name__ == "__main__":
    sys.exit(main())
