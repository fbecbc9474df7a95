"""``python -m workbench.check --part gdn``: a Gated DeltaNet recurrent step of your own checked
over runs of tokens with both states fed back, against the float64 truth.

    python -m workbench.check --part gdn mypkg.steps:my_step --arrays mlx --tokens 1024 --record gdn.json
    python -m workbench.check --part gdn --kernels-dir my_kernels/ --tokens 64 --seeds 8
    python -m workbench.check --part gdn --source step.metal --header helpers.h --grid 6 --threadgroup 6 \\
        --template HK=HK,HV=HV,DK=DK,DV=DV,K=K,C=C
    python -m workbench.check --part gdn --dump gdn_dumps/ --horizons 1,64
    python -m workbench.check --part gdn --kernels-dir my_kernels/ --tokens 64 --mutants

The step is a callable (``module:function``: ``StepInputs -> (out, conv_state, state)``, one
token of one sequence, numpy, MLX or PyTorch arrays), a kernels folder (its ``gdn_step.body``
on the workbench's launch, on the CPU emulator), a Metal (``--language cuda``: CUDA) step
body with its launch, or an engine's safetensors dump of a run (docs/DUMP_LAYOUT.md).
``--mutants`` also runs source-level mutants of the kernel text (the folder's gdn_step.body, or
the --source) on the emulator and prints which the check catches. Exit 0:
the verdict passes; 1: it fails; 2: nothing could be judged, with ONE line on stderr naming
the option. The user's files are only read; a record is never overwritten.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.check import command_args as args
from workbench.check.gdn_subjects import TimedStep
from workbench.check.parts import PART_NAMES

PROG = "python -m workbench.check"

#: The check's parameters (as its ``ValueError`` messages name them) -> the options typed.
OPTIONS: dict[str, str] = {
    "fn": "implementation",
    "folder": "--kernels-dir",
    "path": "--dump",
    "source": "--source",
    "inputs": "--inputs",
    "grid": "--grid",
    "threadgroup": "--threadgroup",
    "template": "--template",
    "language": "--language",
    "run_on": "--run-on",
    "tokens": "--tokens",
    "horizons": "--horizons",
    "seeds": "--seeds",
    "scales": "--scales",
    "gates": "--gates",
    "state_scales": "--state-scales",
    "geometries": "--geometries",
    "faults": "--faults",
    "tolerance": "--tolerance",
    "files": "--mutant-files",
    "replay_dir": "--replay-dir",
    "replay_max_bytes": "--replay-max-bytes",
    "replay": "--replay",
}

#: Options of this part only (the tail's command names them when given without ``--part gdn``).
ONLY_OPTIONS: tuple[str, ...] = (
    "--tokens",
    "--horizons",
    "--gates",
    "--state-scales",
    "--geometries",
    "--faults",
    "--header",
)

#: The tail's options this part has no use for (refused by name, not as unrecognized).
TAIL_OPTIONS: tuple[str, ...] = ("--batched", "--fold", "--output")

#: A mutant study's runs: each mutant runs in three schedules, so fewer and shorter than a check's.
MUTANT_SEEDS, MUTANT_TOKENS = 4, 16

_LAUNCH = ("--inputs", "--header", "--grid", "--threadgroup", "--template", "--language", "--run-on")
_RUNS = ("--tokens", "--seeds", "--scales", "--gates", "--state-scales", "--geometries")


def _names(what: str, allowed: tuple[str, ...], extra: tuple[str, ...] = ()) -> Callable[[str], list[str]]:
    """argparse type: comma-separated names of ``allowed`` (or one of ``extra`` alone)."""

    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",")]
        if text.strip() in extra:
            return []
        bad = [t for t in items if t not in allowed]
        if bad or not text.strip():
            more = f", or {' or '.join(extra)}" if extra else ""
            raise argparse.ArgumentTypeError(
                f"must be comma-separated {what} of {', '.join(allowed)}{more}, got {text!r}"
            )
        return items

    return parse


def _ints(text: str) -> list[int]:
    """argparse type of ``--horizons``: comma-separated integers >= 1."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
    return [args.count(1, 1 << 20)(t) for t in items]


def _geometries(text: str) -> list[tuple[int, ...]]:
    """argparse type of ``--geometries``: ``Hk/Hv/Dk/Dv/K`` items, comma-separated."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("/")
        if len(parts) != 5:
            raise argparse.ArgumentTypeError(f"must be comma-separated Hk/Hv/Dk/Dv/K (e.g. 2/6/32/32/4), got {text!r}")
        out.append(tuple(args.count(1, 1 << 16)(p.strip()) for p in parts))
    return out


#: The step's inputs and outputs, as ``--part gdn --help`` ends.
INPUTS_HELP = """\
A callable is handed one token of one sequence (workbench.check.StepInputs): mixed [C] (q | k | v
before the conv, C = 2 Hk Dk + Hv Dv), z [Hv Dv], b and a [Hv], the states conv_state [K-1, C] and
state [Hv, Dv, Dk], the layer's conv_w [K, C], a_log and dt_bias [Hv], o_norm [Dv], eps (the RMS
norm's), k_heads (Hk), case and token (where it is). It returns (out [Hv Dv], conv_state [K-1, C],
state [Hv, Dv, Dk]), float32: both states are fed back as the next token's.
"""


def parser() -> argparse.ArgumentParser:
    """The part's options, as ``--part gdn --help`` prints them."""
    from workbench.check.gdn_cases import DEFAULT_GEOMETRIES, GATES
    from workbench.check.gdn_faults import GDN_FAULTS
    from workbench.check.gdn_run import DEFAULT_HORIZONS, STATE_SCALES, STEP_SCALES
    from workbench.check.gdn_subjects import STEP_DIMS, STEP_INPUTS, STEP_OUTPUTS
    from workbench.check.stored import ARRAY_KINDS

    geoms = ",".join("/".join(map(str, g)) for g in DEFAULT_GEOMETRIES)
    lines = [f"  {k}: {v}" for k, v in GATES.items()]
    faults = [f"  {k}: {v}" for k, v in GDN_FAULTS.items()]
    epilog = "\n".join([INPUTS_HELP, "gate regimes (--gates):", *lines, "", "fault models (--faults):", *faults])
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        epilog=epilog,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("implementation", nargs="?", help="module:function of a callable step (StepInputs -> 3 tensors)")
    p.add_argument("--part", choices=PART_NAMES, default=PART_NAMES[0], help="the part checked: here gdn")
    p.add_argument("--kernels-dir", type=args.path, help="a folder shaped like kernels/ with your gdn_step.body")
    p.add_argument("--source", type=args.path, help="a file holding a Metal (or CUDA) step body, launched as below")
    p.add_argument("--dump", type=args.path, help="a safetensors dump of a run, or a folder of them (DUMP_LAYOUT)")
    p.add_argument("--arrays", choices=ARRAY_KINDS, default="numpy", help="the arrays a callable is handed")
    args.source_launch_group(
        p,
        f"the body writes {', '.join(STEP_OUTPUTS)} ([Hv Dv], [K-1, C], [Hv, Dv, Dk], float32)",
        STEP_INPUTS,
        STEP_DIMS,
    )
    r = p.add_argument_group("the runs (not with --dump: a dump is judged as dumped)")
    r.add_argument("--tokens", type=args.count(1, 1 << 20), default=256, help="tokens a run, states fed back (256)")
    r.add_argument("--seeds", type=args.count(1, 1_000_000), default=20, help="runs a condition (default 20)")
    r.add_argument(
        "--scales",
        type=args.number_list(positive=True),
        default=list(STEP_SCALES),
        help=f"input scales of the conv's inputs (default {args.csv(STEP_SCALES)})",
    )
    r.add_argument(
        "--gates",
        type=_names("gate regimes", tuple(GATES)),
        default=list(GATES),
        help=f"gate regimes (default {args.csv(GATES)})",
    )
    r.add_argument(
        "--state-scales",
        type=args.number_list(positive=False),
        default=list(STATE_SCALES),
        help=f"the initial state's magnitudes (default {args.csv(STATE_SCALES)})",
    )
    r.add_argument(
        "--geometries",
        type=_geometries,
        default=list(DEFAULT_GEOMETRIES),
        help=f"Hk/Hv/Dk/Dv/K, comma-separated (default {geoms})",
    )
    p.add_argument(
        "--horizons",
        type=_ints,
        default=list(DEFAULT_HORIZONS),
        help=f"tokens the verdict is given at, the run's length always (default {args.csv(DEFAULT_HORIZONS)})",
    )
    p.add_argument(
        "--faults",
        type=_names("fault models", tuple(GDN_FAULTS), ("none",)),
        default=list(GDN_FAULTS),
        help="fault models run beside the step, comma-separated, or none (default all)",
    )
    p.add_argument("--tolerance", type=args.non_negative, help="your own tolerance on the worst scaled error")
    p.add_argument("--time-limit", type=args.positive, default=30.0, help="seconds one token's call may take (30)")
    p.add_argument(
        "--mutants",
        action="store_true",
        help="also run source-level mutants of --kernels-dir's gdn_step.body or an emulated Metal --source "
        f"(short runs: at most {MUTANT_SEEDS} seeds of {MUTANT_TOKENS} tokens, three emulator schedules)",
    )
    p.add_argument(
        "--mutant-files", help="with --mutants and --kernels-dir: the files to mutate, comma-separated (gdn_step.body)"
    )
    p.add_argument("--replay-dir", type=args.path, help="write each failing run here as a reproducer (safetensors)")
    p.add_argument(
        "--replay-max-bytes",
        type=args.count(1, 2**40),
        default=16 * 2**20,
        help="the largest reproducer written (bytes; default 16 MiB), checked before any run",
    )
    p.add_argument(
        "--replay",
        type=args.path,
        help="a reproducer --replay-dir wrote: its run again on the step given (the same verdict and bits?)",
    )
    p.add_argument("--record", type=args.record, help="write the JSON record here (refused if the file exists)")
    return p


def _unused(a: argparse.Namespace, given: set[str]) -> list[str]:
    replays = {"--replay-dir", "--replay-max-bytes", "--replay"}
    if a.replay is not None:  # the run, its settings and tolerance are the reproducer's
        return sorted(
            given
            & ({*_RUNS, "--horizons", "--faults", "--tolerance", "--mutants", "--record"} | replays - {"--replay"})
        )
    if a.dump is not None:
        unused = {*_RUNS, *_LAUNCH, "--arrays", "--time-limit", "--mutants", "--mutant-files", *replays}
    elif a.source is not None:
        unused = {"--arrays"}
    else:
        unused = set(_LAUNCH) | ({"--arrays"} if a.kernels_dir is not None else set())
    return sorted(given & unused)


def main(argv: list[str] | None = None) -> int:
    """The part's command: exit status 0 pass, 1 fail; ``SystemExit(2)`` with one line otherwise."""
    given_argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    given = {tok.split("=", 1)[0] for tok in given_argv if tok.startswith("--")}
    tail_only = sorted(given & set(TAIL_OPTIONS))
    if tail_only:
        p.error(f"{', '.join(tail_only)}: options of the tail's check, not used by --part gdn")
    a = p.parse_args(given_argv)
    forms = [x for x in (a.implementation, a.kernels_dir, a.source, a.dump) if x is not None]
    if len(forms) != 1:
        p.error("--part gdn: give exactly one of: implementation (module:function), --kernels-dir, --source, --dump")
    if a.mutants and not (a.kernels_dir or (a.source and a.run_on == "emulator" and a.language == "metal")):
        p.error("--mutants: only with --kernels-dir or a Metal --source run on the emulator")
    if a.mutant_files is not None and not (a.mutants and a.kernels_dir):
        p.error("--mutant-files: only with --mutants and --kernels-dir")
    unused = _unused(a, given)
    if unused:
        p.error(f"{', '.join(unused)}: not used by this form of the check (nothing given is ignored silently)")
    return args.run_command(lambda: _run(a, argv), PROG, OPTIONS)


def _subject(a: argparse.Namespace) -> Any:
    from workbench.check.gdn_subjects import STEP_DIMS, STEP_INPUTS, CallableStep, KernelsFolderStep, StepSource

    if a.kernels_dir is not None:
        if not Path(a.kernels_dir).is_dir():
            raise ValueError(f"--kernels-dir: must be a folder shaped like kernels/, got {a.kernels_dir!r}")
        return KernelsFolderStep(a.kernels_dir)
    if a.source is not None:
        text = args.read_text("--source", a.source, "the step's kernel body")
        header = "" if a.header is None else args.read_text("--header", a.header, "the kernel's helper functions")
        ins = tuple(STEP_INPUTS) if a.inputs is None else tuple(a.inputs.split(","))
        return StepSource(
            text,
            ins,
            grid=a.grid,
            threadgroup=a.threadgroup,
            template=args.template(a.template, STEP_DIMS),
            header=header,
            language=a.language,
            run_on=a.run_on,
            name=Path(a.source).stem,
        )
    fn = args.load_callable(a.implementation, "StepInputs -> (out, conv_state, state)")
    return CallableStep(fn, arrays=a.arrays, name=a.implementation)


def compile_error(subject: Any, geometry: Any, time_limit: float) -> str | None:
    """For a kernel form on the emulator: clang's first complaint (with the count of the others)
    when the text does not compile, tried on one token of the first geometry; None otherwise
    (any other failure is the check's verdict, token by token)."""
    from workbench.check.gdn_cases import geometry as as_geometry
    from workbench.check.gdn_cases import token_run
    from workbench.check.gdn_subjects import StepInputs
    from workbench.kernels.metal_emulation import MetalCompileError

    s = as_geometry(geometry)
    r = token_run(s, [0], 1, scale=1.0, gate="typical", state_scale=1.0)
    w = r.weights
    consts = {"conv_w": w.conv_w[0], "a_log": w.a_log[0], "dt_bias": w.dt_bias[0], "o_norm": w.o_norm[0]}
    step = StepInputs(
        r.mixed[0, 0], r.z[0, 0], r.b[0, 0], r.a[0, 0], r.conv_state[0], r.state[0], *consts.values(), w.eps, w.k_heads
    )
    try:
        TimedStep(subject, time_limit).layer(s, consts, w.eps)(step)
    except MetalCompileError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        errors = [line for line in lines if ": error: " in line]
        more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
        return f"{errors[0] if errors else lines[0]}{more}"
    except Exception:
        return None
    return None


def _run(a: argparse.Namespace, argv: list[str] | None) -> int:
    from workbench.check.gdn_dump import check_step_dump
    from workbench.check.gdn_run import check_step

    common = {"horizons": a.horizons, "tolerance": a.tolerance, "faults": a.faults}
    study = None
    if a.replay is not None:
        from workbench.check.step_replay import replay_step

        got = replay_step(a.replay, _subject(a), time_limit=a.time_limit)
        print(got)
        return 0 if got.passed else 1
    if a.dump is not None:
        rep = check_step_dump(a.dump, **common)
    else:
        runs = {"tokens": a.tokens, "seeds": range(a.seeds), "scales": a.scales, "gates": a.gates}
        runs |= {"state_scales": a.state_scales, "geometries": a.geometries}
        from workbench.check.gdn_cases import geometry

        for g in a.geometries:
            geometry(g)  # every option checked before the first case
        subject = _subject(a)
        if a.kernels_dir or (a.source and a.run_on == "emulator"):
            problem = compile_error(subject, a.geometries[0], a.time_limit)
            if problem is not None:
                option, given = ("--kernels-dir", a.kernels_dir) if a.kernels_dir else ("--source", a.source)
                if a.source and problem.startswith("source:"):  # the emulator names the body "source"
                    problem = a.source + problem.removeprefix("source")
                raise ValueError(f"{option}: {given} does not compile for the emulator: {problem}")
        chosen = _mutant_files(a.mutant_files, a.kernels_dir) if a.mutant_files is not None else None
        replays = {"replay_dir": a.replay_dir, "replay_max_bytes": a.replay_max_bytes}
        rep = check_step(subject, time_limit=a.time_limit, **replays, **runs, **common)
        if a.mutants:
            from workbench.check.mutants import folder_mutant_study, mutant_study

            few = {"seeds": range(min(a.seeds, MUTANT_SEEDS)), "tokens": min(a.tokens, MUTANT_TOKENS)}
            few |= {"scales": a.scales, "tolerance": a.tolerance, "time_limit": max(a.time_limit, 120.0)}
            if a.kernels_dir:
                study = folder_mutant_study(a.kernels_dir, part="gdn", files=chosen, **few)
            else:
                study = mutant_study(subject, **few)
    print(rep)
    shown = rep.problems if a.dump is not None else rep.problems[:20]
    if shown:
        print(f"problems ({len(rep.problems)}):")
        print("\n".join(f"  - {x}" for x in shown))
        if len(shown) < len(rep.problems):
            print(f"  ... and {len(rep.problems) - len(shown)} more (all in the record)")
    for r in getattr(rep, "reproducers", []):
        print(f"reproducer: {r}")
    record = {**rep.to_record(), **args.provenance(argv)}
    if study is not None:
        print()
        print(study)
        record["mutants"] = study.to_record()
    if a.record is not None:
        args.write_record(a.record, record, rep.passed)
    return 0 if rep.passed else 1


def _mutant_files(text: str, folder: str) -> list[str]:
    """``--mutant-files``: names of files of the kernels folder, checked before the check runs
    (the mutants run after it, minutes later)."""
    names = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(names):
        raise ValueError(f"--mutant-files: must be comma-separated file names of {folder}, got {text!r}")
    for n in names:
        if not (Path(folder) / n).is_file():
            there = sorted(p.name for p in Path(folder).iterdir() if p.is_file())
            raise ValueError(f"--mutant-files: {n!r} is not a file of {folder} (it has {there})")
    return names
