"""Check a fused tail of your own against the float64 oracle, for an engine's CI.

    python -m workbench.check mypkg.tails:my_tail --seeds 200 --tolerance 1e-4 --record check.json
    python -m workbench.check --kernels-dir my_kernels/ --seeds 20 --mutants
    python -m workbench.check --source tail.metal --inputs branch,residual,wo,ffn_norm,gate,up,down,eps \
        --grid 32 --threadgroup 32 --template HIDDEN=hidden,BRANCH=branch,FFN=ffn --mutants
    python -m workbench.check --dump dumps/ --tolerance 2e-4
    python -m workbench.check mypkg.tails:my_tail --shape 2048,2048,8192 --seeds 0:500 --record a.json
    python -m workbench.check mypkg.tails:my_tail --shape 2048,2048,8192 --seeds 500:1000 --record b.json
    python -m workbench.check --merge a.json b.json --record all.json     # the report of seeds 0..999
    python -m workbench.check mypkg.tails:my_tail --seeds 1000 --workers 2    # or --scheduler tcp://host:8786
    python -m workbench.check mypkg.tails:my_tail --replay-dir cases/    # then, a case at a time:
    python -m workbench.check mypkg.tails:my_tail \
        --replay cases/callable-64x96x80-float32-fold16-qnone-seed3.safetensors

The implementation is a callable (``module:function``, handed one ``StoredCase`` a call), a
kernels folder or a Metal (``--language cuda``: CUDA) kernel body with its launch, run on the CPU
emulator or (``--run-on device``) its GPU, or an engine's safetensors dumps (docs/DUMP_LAYOUT.md).
``--mutants`` also runs source-level mutants of the user's text and prints which the check catches.
``--part gdn`` checks a Gated DeltaNet recurrent step instead (``--part gdn --help``), ``--part head``
an attention head (``--part head --help``);
``--chain tail,gdn_in,gdn`` parts chained as the engine launches them, each link's error named
(``--chain tail --help``). ``--replay-dir`` writes each failing case as a reproducer; ``--replay FILE``
runs one again (the subject given the same way).
``--seeds A:B`` checks a shard (seeds A..B-1); ``--record`` keeps its per-case errors in Parquet beside
the JSON, and ``--merge`` gives the report of disjoint shards' union, the same bits as one run. While
it runs, a check with ``--record R`` writes each finished block to ``R.partial/``: the same command
run again after an interruption resumes from there. The cases run in blocks sized to
``--memory-budget`` (default 4G, or half the machine's memory if less); a bar on stderr counts
them when stderr is a terminal (``--quiet``: never).
Exit 0: the verdict passes; 1: it fails; 2: nothing could be judged (a bad argument, a module that
does not import, a kernel that does not compile, a form that cannot run here), with ONE line on
stderr and no traceback (``WORKBENCH_TRACEBACK=1`` keeps it), so a CI log shows the line that
matters. Every argument is checked before any case runs; the user's files are only read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.check import chain_command, gdn_command, head_command, shards
from workbench.check import command_args as args
from workbench.check.budget import DEFAULT_BUDGET_GIB
from workbench.check.cluster import cluster_client
from workbench.check.parts import PART_NAMES
from workbench.check.replay import DEFAULT_MAX_BYTES, replay
from workbench.check.run import DEFAULT_SCALES, check_dump, check_kernel
from workbench.check.source_launch import SHAPE_NAMES, SOURCE_INPUTS, SourceLaunch
from workbench.check.stored import ARRAY_KINDS
from workbench.check.subjects import CallableSubject, KernelsFolderSubject, SourceSubject
from workbench.fold.weights import DENSE_DTYPES, QUANT_FORMATS

#: The exit status of a usage error (argparse's own), distinct from a failing verdict's 1.
USAGE_ERROR = 2

#: Most seeds one run takes: each seed is a case at every scale and configuration, so a
#: million is already hours; a larger count is a typo, and would first allocate its seeds.
MAX_SEEDS = 1_000_000

#: The check's parameters (as its ``ValueError`` messages name them) -> the options a user
#: typed: an error the check raises about a parameter is reported under the option.
OPTIONS: dict[str, str] = {
    "fn": "implementation",
    "folder": "--kernels-dir",
    "path": "--dump",
    "source": "--source",
    "inputs": "--inputs",
    "output": "--output",
    "grid": "--grid",
    "threadgroup": "--threadgroup",
    "template": "--template",
    "language": "--language",
    "run_on": "--run-on",
    "seeds": "--seeds",
    "scales": "--scales",
    "folds": "--fold",
    "tolerance": "--tolerance",
    "time_limit": "--time-limit",
    "files": "--mutant-files",
    "replay_dir": "--replay-dir",
    "replay_max_bytes": "--replay-max-bytes",
    "replay": "--replay",
    "shapes": "--shape",
    "dtypes": "--dtype",
    "quantize": "--quantize",
    "memory_budget": "--memory-budget",
    "journal": "--record",
    "reports": "--merge",
    "record": "--merge",
    "workers": "--workers",
    "scheduler": "--scheduler",
}


def as_option(message: str) -> str:
    """``message`` on one line, its leading parameter name (``folds: ...``) replaced by the
    option the user typed (``--fold: ...``); a message naming no parameter is kept as is."""
    return args.as_option(message, OPTIONS)


def _launch(a: argparse.Namespace) -> SourceLaunch:
    path = Path(a.source)
    if not path.is_file():
        raise ValueError(f"--source: must be a file holding the kernel body, got {a.source!r} (not a file)")
    if not a.inputs:
        raise ValueError(f"--inputs: a source needs its inputs' names, comma-separated, from {SOURCE_INPUTS}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--source: {a.source} is not UTF-8 text (byte {e.start}); is it the kernel body?") from None
    return SourceLaunch(
        text,
        tuple(a.inputs.split(",")),
        output=a.output,
        grid=a.grid,
        threadgroup=a.threadgroup,
        template=args.template(a.template, SHAPE_NAMES),
        name=path.stem,
        source_file=a.source,
    )


def _compile_error(subject: Any, time_limit: float) -> str | None:
    """For a kernel form run on the emulator: clang's first complaint (one line, with the
    count of the others) when the text does not compile, tried on the check's first case
    (seed 0, scale 1, dense float32, unfolded); None when it compiled, or when it failed
    otherwise (the check reports that case by case, as part of its verdict).

    Without this, a text that does not compile is compiled again for each of its hundreds
    of case runs, and ends as a failing verdict (1) although nothing was judged."""
    import inspect

    from workbench.check.time_limit import LimitedCaller
    from workbench.kernels.metal_emulation import MetalCompileError
    from workbench.studies.cases import case_arrays, case_row_weights
    from workbench.tail.weights import DEFAULT_EPS

    shape = inspect.signature(check_kernel).parameters["shapes"].default[0]  # the shape the check runs
    w, b, r = case_row_weights(case_arrays(shape, [0]), 0, dtype="float32", fold=None, spec=None, eps=DEFAULT_EPS)
    if isinstance(subject, SourceSubject):
        call = lambda: subject.run_one(w, b, r)  # noqa: E731
    else:
        call = lambda: subject.run(w, b[None], r[None])  # noqa: E731
    (outcome,) = LimitedCaller(time_limit).run_all([call])
    if not isinstance(outcome.error, MetalCompileError):
        return None
    lines = [line.strip() for line in str(outcome.error).splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return f"{errors[0] if errors else lines[0]}{more}"


def _mutant_files(text: str, folder: str) -> list[str]:
    """``--mutant-files``: names of files in the kernels folder, checked before the check runs
    (the mutants run after it, minutes later)."""
    names = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"--mutant-files: must be comma-separated file names of {folder}, got {text!r}")
    there = sorted(q.name for q in Path(folder).iterdir() if q.is_file())
    for n in names:
        if n not in there:
            raise ValueError(f"--mutant-files: {n!r} is not a file of {folder} (it has {there})")
    return names


def _part(argv: list[str]) -> str:
    """The part ``--part`` names (the tail when not given); a bad name is argparse's refusal."""
    pre = argparse.ArgumentParser(prog="python -m workbench.check", add_help=False, allow_abbrev=False)
    pre.add_argument("--part", choices=PART_NAMES, default=PART_NAMES[0])
    return pre.parse_known_args(argv)[0].part


def main(argv: list[str] | None = None) -> int:
    """The command: the exit status (0 pass, 1 fail); a usage error is argparse's
    ``SystemExit(2)`` with one line on stderr (see the module's docstring). ``--part gdn``
    hands the whole command line to :mod:`workbench.check.gdn_command`."""
    given_argv = sys.argv[1:] if argv is None else list(argv)
    if any(t == "--chain" or t.startswith("--chain=") for t in given_argv):
        return chain_command.main(argv)  # parts chained as the engine launches them
    chosen = _part(given_argv)
    if chosen == "gdn":
        return gdn_command.main(argv)
    if chosen == "head":
        return head_command.main(argv)
    # allow_abbrev off: which options were given is read from argv (below), by full name
    p = argparse.ArgumentParser(
        prog="python -m workbench.check",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("implementation", nargs="?", help="module:function of a callable tail")
    p.add_argument(
        "--part",
        choices=PART_NAMES,
        default=PART_NAMES[0],
        help="the part checked: tail (default; the options below), gdn, the Gated DeltaNet recurrent step "
        "(--part gdn --help lists its inputs and options), or head, the attention head (--part head --help)",
    )
    p.add_argument("--kernels-dir", type=args.path, help="a folder shaped like kernels/ (run on the CPU emulator)")
    p.add_argument(
        "--source", type=args.path, help="a file holding a Metal (or CUDA) kernel body, with the launch options below"
    )
    p.add_argument("--dump", type=args.path, help="a safetensors dump file or a folder of them (docs/DUMP_LAYOUT.md)")
    p.add_argument(
        "--merge",
        nargs="+",
        type=args.path,
        metavar="RECORD",
        help="records of disjoint shards (--seeds A:B, with --record): the report of their union",
    )
    p.add_argument(
        "--arrays",
        choices=ARRAY_KINDS,
        default="numpy",
        help="the arrays a callable is handed and returns (default numpy)",
    )
    p.add_argument(
        "--batched",
        action="store_true",
        help="the callable takes a case's input scales as a leading axis ([n, branch] in, [n, hidden] out)",
    )
    g = p.add_argument_group("the launch of --source")
    g.add_argument(
        "--inputs", help=f"the body's input names in order, comma-separated, from {', '.join(SOURCE_INPUTS)}"
    )
    g.add_argument("--output", default="out", help="the output's name ([hidden] float32; default out)")
    g.add_argument(
        "--grid",
        type=args.dims(2**31 - 1),
        default=(32, 1, 1),
        help="threads in the grid: X (1-D) or X,Y,Z (default 32)",
    )
    g.add_argument(
        "--threadgroup",
        type=args.dims(1024, 1024),
        default=(32, 1, 1),
        help="threads in a threadgroup: X or X,Y,Z, at most 1024 in all as on Metal and CUDA (default 32)",
    )
    g.add_argument("--template", help=f"NAME=value,... (a number, or one of {', '.join(SHAPE_NAMES)})")
    g.add_argument("--language", choices=("metal", "cuda"), default="metal", help="the body's language (default metal)")
    g.add_argument(
        "--run-on",
        choices=("emulator", "device"),
        default="emulator",
        help="the CPU emulator (Metal only) or the GPU (default emulator)",
    )
    p.add_argument(
        "--seeds",
        type=args.seed_range(MAX_SEEDS),
        default=range(100),
        help=f"seeded cases a configuration: N (seeds 0..N-1) or A:B (seeds A..B-1, a shard), at most {MAX_SEEDS} "
        "(default 100)",
    )
    p.add_argument("--shape", type=args.shape, help="hidden,branch,ffn of the cases (default 64,96,80)")
    p.add_argument("--dtype", choices=tuple(DENSE_DTYPES), default="float32", help="the weights' stored dtype")
    p.add_argument(
        "--quantize",
        choices=("none", *QUANT_FORMATS),
        default="none",
        help="the weights' quantized format (default none)",
    )
    p.add_argument(
        "--memory-budget",
        type=args.byte_count,
        help=f"bytes the check's blocks of cases may hold: 512M, 4G, ... (default {DEFAULT_BUDGET_GIB:g}G, "
        "or half this machine's memory if less)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bar (one is drawn on stderr when it is a terminal)"
    )
    p.add_argument(
        "--scales",
        type=args.number_list(positive=True),
        default=list(DEFAULT_SCALES),
        help="input scales, comma-separated (default " + ",".join(f"{s:g}" for s in DEFAULT_SCALES) + ")",
    )
    p.add_argument(
        "--fold",
        type=args.count(0, 2**20),
        default=16,
        help="fold block on wo's input (0: none; default 16; a --source takes unfolded weights only)",
    )
    p.add_argument("--tolerance", type=args.non_negative, help="your own tolerance on the worst scaled error")
    p.add_argument("--time-limit", type=args.positive, default=30.0, help="seconds a case may take (default 30)")
    p.add_argument(
        "--workers",
        type=args.count(1, 4096),
        help="run the seeds in shards on a Dask LocalCluster of this many single-threaded workers (progress on stderr)",
    )
    p.add_argument("--scheduler", help="run the seeds in shards on the Dask cluster at this address (tcp://host:8786)")
    p.add_argument(
        "--mutants", action="store_true", help="also run source-level mutants of --kernels-dir or an emulated --source"
    )
    p.add_argument(
        "--mutant-files",
        help="with --kernels-dir: the files to mutate, comma-separated (default: every "
        "*.body and *.h; each mutant recompiles, so a large folder takes long)",
    )
    p.add_argument("--record", type=args.record, help="write the JSON record here (refused if the file exists)")
    p.add_argument("--replay-dir", type=args.path, help="write each failing case here as a reproducer (safetensors)")
    p.add_argument(
        "--replay-max-bytes",
        type=args.count(1, 2**40),
        default=DEFAULT_MAX_BYTES,
        help=f"the largest reproducer written, in bytes (default {DEFAULT_MAX_BYTES}; checked before any case runs)",
    )
    p.add_argument(
        "--replay",
        type=args.path,
        help="a reproducer --replay-dir wrote: its case run again on the subject given (the same verdict and bits?)",
    )
    given = {tok.split("=", 1)[0] for tok in (sys.argv[1:] if argv is None else argv) if tok.startswith("--")}
    step_only = sorted(given & set(gdn_command.ONLY_OPTIONS))
    if step_only:
        p.error(f"{', '.join(step_only)}: options of --part gdn (the recurrent step), not of the tail's check")
    # --shape is the head's (its geometry) and the tail's (hidden,branch,ffn) alike
    head_only = sorted(given & (set(head_command.ONLY_OPTIONS) - {"--shape"}))
    if head_only:
        p.error(f"{', '.join(head_only)}: options of --part head (the attention head), not of the tail's check")
    a = p.parse_args(argv)
    forms = [x for x in (a.implementation, a.kernels_dir, a.source, a.dump, a.merge) if x is not None]
    if len(forms) != 1:
        p.error("give exactly one of: implementation (module:function), --kernels-dir, --source, --dump, --merge")
    if a.mutants and not (a.kernels_dir or (a.source and a.run_on == "emulator")):
        p.error("--mutants: only with --kernels-dir or a --source run on the emulator")
    if a.replay is not None and a.dump is not None:
        p.error(
            "--replay: with the subject the check was given (module:function, --kernels-dir or --source), not --dump"
        )
    if a.mutant_files is not None and not (a.mutants and a.kernels_dir):
        p.error("--mutant-files: only with --mutants and --kernels-dir")
    if a.workers is not None and a.scheduler is not None:
        p.error("--workers: a --scheduler's cluster has its own workers; give one of them")
    unused = _unused_options(a, sys.argv[1:] if argv is None else argv)
    if unused:
        p.error(f"{', '.join(unused)}: not used by this form of the check (nothing given is ignored silently)")
    return args.run_command(lambda: _run(a, argv), p.prog, OPTIONS, USAGE_ERROR)


#: The options each form of the check reads beyond the ones every form reads
#: (--tolerance, --record, --time-limit where cases run).
_SOURCE_LAUNCH = ("--inputs", "--output", "--grid", "--threadgroup", "--template", "--language", "--run-on")


def _unused_options(a: argparse.Namespace, argv: list[str]) -> list[str]:
    """The options given in ``argv`` that the chosen form does not read: a dump is judged as
    dumped (its own seeds, scales, fold and weights), a source takes unfolded weights and its
    own launch, a callable or a kernels folder has no launch of its own."""
    given = {tok.split("=", 1)[0] for tok in argv if tok.startswith("--")}
    cases = {"--seeds", "--scales", "--fold", "--shape", "--dtype", "--quantize", "--memory-budget", "--quiet"}
    if a.replay is not None:  # the case, its scales and tolerances are the reproducer's
        unused = cases | {"--tolerance", "--mutants", "--mutant-files", "--record"}
        unused |= {"--replay-dir", "--replay-max-bytes", "--workers", "--scheduler"}
        return sorted(given & unused)
    if a.merge is not None:  # the shards' own cases, tolerance and subject
        unused = cases | {"--tolerance", "--time-limit", "--arrays", "--batched", *_SOURCE_LAUNCH}
        unused |= {"--replay-dir", "--replay-max-bytes", "--mutants", "--mutant-files", "--replay"}
        return sorted(given & unused)
    if a.dump is not None:
        unused = cases | {"--time-limit", "--arrays", "--batched", *_SOURCE_LAUNCH}
        unused |= {"--replay-dir", "--replay-max-bytes", "--workers", "--scheduler"}
    elif a.source is not None:
        unused = {"--fold", "--arrays", "--batched"}
    else:
        unused = set(_SOURCE_LAUNCH)
        if a.kernels_dir is not None:
            unused |= {"--arrays", "--batched"}
    return sorted(given & unused)


def _subject(a: argparse.Namespace, launch: SourceLaunch | None = None) -> Any:
    """The implementation the options name: a kernels folder, a source with its launch, or a callable."""
    if a.kernels_dir:
        return KernelsFolderSubject(a.kernels_dir)
    if a.source:
        return SourceSubject(launch or _launch(a), language=a.language, run_on=a.run_on)
    return CallableSubject(args.load_callable(a.implementation), arrays=a.arrays, batched=a.batched)


def _run(a: argparse.Namespace, argv: list[str] | None) -> int:
    """Every argument checked, then the check, the mutants, the record (``ValueError`` or
    ``OSError`` for what the user gave)."""
    study = None
    if a.replay is not None:
        got = replay(a.replay, _subject(a), time_limit=a.time_limit)
        print(got)
        return 0 if got.passed else 1
    journal = None
    if a.merge:
        rep = shards.merge_reports([shards.read_report(r) for r in a.merge])
    elif a.dump:
        rep = check_dump(a.dump, tolerance=a.tolerance)
    else:
        folds = (None,) if a.source else (a.fold or None,)
        launch = _launch(a) if a.source else None
        chosen = _mutant_files(a.mutant_files, a.kernels_dir) if a.mutant_files is not None else None
        subject = _subject(a, launch)
        if a.kernels_dir or (launch is not None and a.run_on == "emulator"):
            problem = _compile_error(subject, a.time_limit)
            if problem is not None:
                option, given = ("--kernels-dir", a.kernels_dir) if a.kernels_dir else ("--source", a.source)
                raise ValueError(f"{option}: {given} does not compile for the emulator: {problem}")
        common = {"seeds": a.seeds, "scales": a.scales, "tolerance": a.tolerance, "time_limit": a.time_limit}
        replays = {"replay_dir": a.replay_dir, "replay_max_bytes": a.replay_max_bytes}
        client = None if a.workers is None and a.scheduler is None else cluster_client(a.workers, a.scheduler)
        journal = None if a.record is None or client is not None else partial_folder(a.record)
        if journal is not None and journal.exists():
            print(f"resuming from {journal}", file=sys.stderr)
        try:
            rep = check_kernel(
                subject,
                folds=folds,
                **common,
                **_configuration(a),
                **replays,
                memory_budget=a.memory_budget,
                journal=journal,
                progress=False if a.quiet else None,
                client=client,
            )
        finally:
            if client is not None:
                client.close()
        if a.mutants:
            from workbench.check.mutants import folder_mutant_study, mutant_study

            few = {**common, "seeds": a.seeds[:8], "time_limit": max(a.time_limit, 120.0)}
            study = (
                folder_mutant_study(a.kernels_dir, files=chosen, folds=folds, **few)
                if a.kernels_dir
                else mutant_study(launch, **few)
            )
    print(rep)
    record = {**rep.to_record(), "flake_rate": rep.flake_rate, **args.provenance(argv)}
    if study is not None:
        print()
        print(study)
        record["mutants"] = {
            "counts": study.counts(),
            "original_same_bits": study.original_same_bits,
            "orders": list(study.orders),
            "table": json.loads(study.table.to_json(orient="records")),
        }
    if a.record is not None:
        try:  # the tables first: the JSON, written last, is the record
            record["tables"] = shards.write_tables(rep, a.record)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())
            raise ValueError(
                f"--record: {a.record} was not written ({reason}); the verdict printed above "
                f"stands: {'PASS' if rep.passed else 'FAIL'}"
            ) from None
        args.write_record(a.record, record, rep.passed)
        if journal is not None and journal.exists():
            shards.remove_journal(journal)
    return 0 if rep.passed else 1


def partial_folder(record: Path) -> Path:
    """Where a check run with ``--record`` keeps its finished blocks until the record is written."""
    return record.with_name(record.name + ".partial")


def _configuration(a: argparse.Namespace) -> dict[str, Any]:
    """``--shape``, ``--dtype`` and ``--quantize`` as the check's arguments (the check's defaults where not given)."""
    out: dict[str, Any] = {"dtypes": (a.dtype,), "quantize": (None if a.quantize == "none" else a.quantize,)}
    if a.shape is not None:
        out["shapes"] = (a.shape,)
    return out


if __name__ == "__main__":
    sys.exit(main())
