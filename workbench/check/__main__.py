"""Check a fused tail of your own against the float64 oracle, for an engine's CI.

    python -m workbench.check mypkg.tails:my_tail --seeds 200 --tolerance 1e-4 --record check.json
    python -m workbench.check --kernels-dir my_kernels/ --seeds 20 --mutants
    python -m workbench.check --source tail.metal --inputs branch,residual,wo,ffn_norm,gate,up,down,eps \
        --grid 32 --threadgroup 32 --template HIDDEN=hidden,BRANCH=branch,FFN=ffn --mutants
    python -m workbench.check --dump dumps/ --tolerance 2e-4

The implementation is one of: a callable by import path (``module:function``, handed one
``workbench.check.StoredCase`` a call); a kernels folder (``--kernels-dir``, run on the
CPU emulator); a Metal kernel body (``--source``, with its launch: the inputs' names from
``workbench.check.source_launch.SOURCE_INPUTS``, 1-D grid and threadgroup in threads,
template values as numbers or the case's dimensions by name), run on the CPU emulator,
or with ``--run-on device`` on its GPU (``--language cuda`` for a CUDA body); or safetensors
files an engine dumped (``--dump``, a file or a folder; docs/DUMP_LAYOUT.md).
``--mutants`` (kernels folder or Metal source on the emulator) also runs the source-level
mutants of the user's text through the same check and prints which the check catches.

Prints the verdict and the tables, writes the JSON record where ``--record`` says (never
over an existing file), and exits 1 when the verdict fails, 2 on bad arguments or when
the form cannot run here (e.g. a CUDA source without an NVIDIA GPU; the message says why).
The user's files are only read.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench import backends, files
from workbench.check.run import DEFAULT_SCALES, check_dump, check_kernel
from workbench.check.source_launch import SHAPE_NAMES, SOURCE_INPUTS, SourceLaunch
from workbench.check.stored import ARRAY_KINDS
from workbench.check.subjects import CallableSubject, KernelsFolderSubject, SourceSubject


def _callable(path: str):
    mod, _, attr = path.partition(":")
    if not mod or not attr:
        raise SystemExit(f"implementation: must be 'module:function', got {path!r}")
    return getattr(importlib.import_module(mod), attr)


def _template(text: str | None) -> dict[str, Any]:
    """``NAME=value,...``: a value is an int, a float, or one of the case's dimensions by name."""
    out: dict[str, Any] = {}
    for item in filter(None, (text or "").split(",")):
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"--template: items must be NAME=value, got {item!r}")
        if value in SHAPE_NAMES:
            out[name] = value
            continue
        try:
            out[name] = int(value)
        except ValueError:
            try:
                out[name] = float(value)
            except ValueError:
                raise ValueError(f"--template: {name}'s value must be a number or one of {SHAPE_NAMES}, "
                                 f"got {value!r}") from None
    return out


def _launch(a: argparse.Namespace) -> SourceLaunch:
    path = Path(a.source)
    if not path.is_file():
        raise ValueError(f"--source: must be a file holding the kernel body, got {a.source!r} (not a file)")
    if not a.inputs:
        raise ValueError(f"--inputs: a source needs its inputs' names, comma-separated, from {SOURCE_INPUTS}")
    return SourceLaunch(path.read_text(), tuple(a.inputs.split(",")), output=a.output, grid=(a.grid, 1, 1),
                        threadgroup=(a.threadgroup, 1, 1), template=_template(a.template), name=path.stem)


def _provenance(argv: list[str] | None) -> dict[str, Any]:
    """Where and when the check ran, as the bench records say it: date (UTC), the command
    line, MLX's version and device, numpy's, Python's, the platform."""
    import mlx.core as mx  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    args = sys.argv[1:] if argv is None else list(argv)
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python -m workbench.check", *args]), "mlx_version": mx.__version__,
            "mlx_device": str(mx.default_device()), "numpy_version": np.__version__,
            "python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("implementation", nargs="?", help="module:function of a callable tail")
    p.add_argument("--kernels-dir", help="a folder shaped like kernels/ (run on the CPU emulator)")
    p.add_argument("--source", help="a file holding a Metal (or CUDA) kernel body, with the launch options below")
    p.add_argument("--dump", help="a safetensors dump file or a folder of them (docs/DUMP_LAYOUT.md)")
    p.add_argument("--arrays", choices=ARRAY_KINDS, default="numpy",
                   help="the arrays a callable is handed and returns (default numpy)")
    p.add_argument("--batched", action="store_true",
                   help="the callable takes a case's input scales as a leading axis ([n, branch] in, [n, hidden] out)")
    g = p.add_argument_group("the launch of --source")
    g.add_argument("--inputs", help=f"the body's input names in order, comma-separated, from {', '.join(SOURCE_INPUTS)}")
    g.add_argument("--output", default="out", help="the output's name ([hidden] float32; default out)")
    g.add_argument("--grid", type=int, default=32, help="threads in the grid, 1-D (default 32)")
    g.add_argument("--threadgroup", type=int, default=32, help="threads in a threadgroup (default 32)")
    g.add_argument("--template", help=f"NAME=value,... (a number, or one of {', '.join(SHAPE_NAMES)})")
    g.add_argument("--language", choices=("metal", "cuda"), default="metal", help="the body's language (default metal)")
    g.add_argument("--run-on", choices=("emulator", "device"), default="emulator",
                   help="the CPU emulator (Metal only) or the GPU (default emulator)")
    p.add_argument("--seeds", type=int, default=100, help="seeded cases a configuration (default 100)")
    p.add_argument("--scales", default=",".join(f"{s:g}" for s in DEFAULT_SCALES), help="input scales, comma-separated")
    p.add_argument("--fold", type=int, default=16, help="fold block on wo's input (0: none; default 16; "
                   "a --source takes unfolded weights only)")
    p.add_argument("--tolerance", type=float, help="your own tolerance on the worst scaled error")
    p.add_argument("--time-limit", type=float, default=30.0, help="seconds a case may take (default 30)")
    p.add_argument("--mutants", action="store_true",
                   help="also run source-level mutants of --kernels-dir or an emulated --source")
    p.add_argument("--mutant-files", help="with --kernels-dir: the files to mutate, comma-separated (default: every "
                   "*.body and *.h; each mutant recompiles, so a large folder takes long)")
    p.add_argument("--record", help="write the JSON record here (refused if the file exists)")
    a = p.parse_args(argv)
    forms = [x for x in (a.implementation, a.kernels_dir, a.source, a.dump) if x is not None]
    if len(forms) != 1:
        p.error("give exactly one of: implementation (module:function), --kernels-dir, --source, --dump")
    if a.mutants and not (a.kernels_dir or (a.source and a.run_on == "emulator")):
        p.error("--mutants: only with --kernels-dir or a --source run on the emulator")
    if a.mutant_files and not (a.mutants and a.kernels_dir):
        p.error("--mutant-files: only with --mutants and --kernels-dir")
    if a.record and Path(a.record).exists():
        p.error(f"--record: {a.record} exists; a record is never overwritten (give a new name)")
    study = None
    try:
        scales = [float(s) for s in a.scales.split(",")]
        if a.dump:
            rep = check_dump(a.dump, tolerance=a.tolerance)
        else:
            folds = (None,) if a.source else (a.fold or None,)
            launch = _launch(a) if a.source else None
            if a.kernels_dir:
                subject = KernelsFolderSubject(a.kernels_dir)
            elif launch is not None:
                subject = SourceSubject(launch, language=a.language, run_on=a.run_on)
            else:
                subject = CallableSubject(_callable(a.implementation), arrays=a.arrays, batched=a.batched)
            common = {"seeds": range(a.seeds), "scales": scales, "tolerance": a.tolerance, "time_limit": a.time_limit}
            rep = check_kernel(subject, folds=folds, **common)
            if a.mutants:
                from workbench.check.mutants import folder_mutant_study, mutant_study  # noqa: PLC0415

                few = {**common, "seeds": range(min(a.seeds, 8)), "time_limit": max(a.time_limit, 120.0)}
                chosen = a.mutant_files.split(",") if a.mutant_files else None
                study = (folder_mutant_study(a.kernels_dir, files=chosen, folds=folds, **few) if a.kernels_dir
                         else mutant_study(launch, **few))
    except (ValueError, backends.BackendUnavailable) as e:  # bad input, or a backend this machine lacks
        p.error(str(e))
    print(rep)
    record = {**rep.to_record(), **_provenance(argv)}
    if study is not None:
        print()
        print(study)
        record["mutants"] = {"counts": study.counts(), "original_same_bits": study.original_same_bits,
                             "orders": list(study.orders),
                             "table": json.loads(study.table.to_json(orient="records"))}
    if a.record:
        files.write_atomic(a.record, json.dumps(record, indent=1) + "\n", overwrite=False)
    return 0 if rep.passed else 1


if __name__ == "__main__":
    sys.exit(main())
