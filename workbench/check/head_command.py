"""``python -m workbench.check --part head``: an attention head of your own checked against the
float64 truth, one case a seed over the head's shape, the hidden state's scale and the position.

    python -m workbench.check --part head mypkg.heads:my_head --arrays mlx --positions 0,1,4095
    python -m workbench.check --part head mypkg.heads:my_head --model qwen3.5-9b --layer 3
    python -m workbench.check --part head --kernels-dir my_kernels/ --seeds 8
    python -m workbench.check --part head --source head.metal --inputs hidden,attn_norm,q_w,k_w,v_w,q_norm,k_norm,\\
eps,position,rope_theta --grid 6 --threadgroup 6 --template HID=HID,HQ=HQ,HKV=HKV,D=D,ROT=ROT
    python -m workbench.check --part head --dump head_dumps/

The head is a callable (``module:function``: ``HeadInputs -> (q, k, v[, gate])``, one case,
numpy, MLX or PyTorch arrays), a kernels folder (its ``head_qkv.body`` on the workbench's head
launch, the ``launch`` shape, on the CPU emulator), a Metal (``--language cuda``: CUDA) head body
with its launch, or an engine's safetensors dump (docs/DUMP_LAYOUT.md). The head's shape is
``--shape`` (``launch``: frink-models' launch; ``model``: Qwen3.5's head, gate, QK-norm and
partial RoPE) or a real model's attention layer at a checkable width (``--model``, ``--layer``).
Exit 0: the verdict passes; 1: it fails; 2: nothing could be judged, with ONE line on stderr
naming the option. The user's files are only read; a record is never overwritten.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.check import command_args as args
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
    "seeds": "--seeds",
    "scales": "--scales",
    "positions": "--positions",
    "faults": "--faults",
    "tolerance": "--tolerance",
    "layer": "--layer",
    "name": "--model",
}

#: Options of this part only (the tail's and the step's commands name them when given without ``--part head``).
ONLY_OPTIONS: tuple[str, ...] = ("--shape", "--positions", "--model", "--layer")

#: The tail's options this part has no use for (refused by name, not as unrecognized).
OTHER_OPTIONS: tuple[str, ...] = (
    "--batched",
    "--fold",
    "--mutant-files",
    "--output",
    "--tokens",
    "--horizons",
    "--gates",
    "--state-scales",
    "--geometries",
)

_LAUNCH = ("--inputs", "--header", "--grid", "--threadgroup", "--template", "--language", "--run-on")
_RUNS = ("--seeds", "--scales", "--positions", "--shape", "--model", "--layer")

#: The head's inputs and outputs, as ``--part head --help`` ends.
INPUTS_HELP = """\
A callable is handed one case (workbench.check.HeadInputs): hidden [hidden] (before the norm),
attn_norm [hidden], the stored q_w [q_rows, hidden] (with a gate: each head's head_dim query rows,
then its head_dim gate rows), k_w and v_w [kv_heads head_dim, hidden], q_b, k_b, v_b (None without
biases), q_norm and k_norm [head_dim] (None without QK-norm), fold (the HadamardFold Q, K and V
share: rotate the normed vector with fold.rotate; None unfolded), position, spec (widths, eps,
rotary_dim, rope_theta) and case. It returns (q [q_heads head_dim], k, v [kv_heads head_dim]) and,
with a gate, gate [q_heads head_dim], float32: q and k after QK-norm and RoPE.
"""


def _names(what: str, allowed: tuple[str, ...], extra: tuple[str, ...] = ()) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        if text.strip() in extra:
            return []
        items = [t.strip() for t in text.split(",")]
        bad = [t for t in items if t not in allowed]
        if bad or not text.strip():
            more = f", or {' or '.join(extra)}" if extra else ""
            raise argparse.ArgumentTypeError(
                f"must be comma-separated {what} of {', '.join(allowed)}{more}, got {text!r}"
            )
        return items

    return parse


def _positions(text: str) -> list[int]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 0, got {text!r}")
    return [args.count(0, 1 << 24)(t) for t in items]


def parser() -> argparse.ArgumentParser:
    """The part's options, as ``--part head --help`` prints them."""
    from workbench.check.head_cases import DEFAULT_POSITIONS, HEAD_SCALES
    from workbench.check.head_math import HEAD_FAULTS
    from workbench.check.head_spec import HEAD_SHAPES
    from workbench.check.head_subjects import HEAD_DIMS, HEAD_INPUTS, HEAD_OUTPUTS
    from workbench.check.stored import ARRAY_KINDS

    shapes = [f"  {k}: {v}" for k, v in HEAD_SHAPES.items()]
    faults = [f"  {k}: {v}" for k, v in HEAD_FAULTS.items()]
    epilog = "\n".join([INPUTS_HELP, "shapes (--shape):", *shapes, "", "fault models (--faults):", *faults])
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        epilog=epilog,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("implementation", nargs="?", help="module:function of a callable head (HeadInputs -> tensors)")
    p.add_argument("--part", choices=PART_NAMES, default=PART_NAMES[0], help="the part checked: here head")
    p.add_argument("--kernels-dir", type=args.path, help="a folder shaped like kernels/ with your head_qkv.body")
    p.add_argument("--source", type=args.path, help="a file holding a Metal (or CUDA) head body, launched as below")
    p.add_argument("--dump", type=args.path, help="a safetensors dump of heads, or a folder of them (DUMP_LAYOUT)")
    p.add_argument("--arrays", choices=ARRAY_KINDS, default="numpy", help="the arrays a callable is handed")
    args.source_launch_group(
        p,
        f"the body writes {', '.join(HEAD_OUTPUTS.values())} (gate_out with a gate), float32",
        HEAD_INPUTS,
        HEAD_DIMS,
    )
    r = p.add_argument_group("the cases (not with --dump: a dump is judged as dumped)")
    r.add_argument(
        "--shape",
        type=_names("head shapes", tuple(HEAD_SHAPES)),
        help="the head's shape(s), comma-separated (default: launch for --kernels-dir, else model)",
    )
    r.add_argument("--model", help="a model of workbench.models.list_models(): its attention layer's head instead")
    r.add_argument(
        "--layer", type=args.count(0, 1 << 16), help="with --model: the attention layer (default: its first)"
    )
    r.add_argument("--seeds", type=args.count(1, 1_000_000), default=20, help="cases a condition (default 20)")
    r.add_argument(
        "--scales",
        type=args.number_list(positive=True),
        default=list(HEAD_SCALES),
        help=f"the hidden state's scales (default {args.csv(HEAD_SCALES)})",
    )
    r.add_argument(
        "--positions",
        type=_positions,
        default=list(DEFAULT_POSITIONS),
        help=f"token positions, for RoPE (default {args.csv(DEFAULT_POSITIONS)})",
    )
    p.add_argument(
        "--faults",
        type=_names("fault models", tuple(HEAD_FAULTS), ("none",)),
        default=list(HEAD_FAULTS),
        help="fault models run beside the head, comma-separated, or none (default all)",
    )
    p.add_argument("--mutants", action="store_true", help="also run source mutants of --source (on the emulator)")
    p.add_argument("--tolerance", type=args.non_negative, help="your own tolerance on the worst scaled error")
    p.add_argument("--time-limit", type=args.positive, default=30.0, help="seconds one case's call may take (30)")
    p.add_argument("--record", type=args.record, help="write the JSON record here (refused if the file exists)")
    return p


def _unused(a: argparse.Namespace, given: set[str]) -> list[str]:
    if a.dump is not None:
        unused = {*_RUNS, *_LAUNCH, "--arrays", "--time-limit", "--mutants"}
    elif a.source is not None:
        unused = {"--arrays"} | ({"--mutants"} if a.run_on != "emulator" else set())
    else:
        unused = set(_LAUNCH) | {"--mutants"} | ({"--arrays"} if a.kernels_dir is not None else set())
    if a.model is None:
        unused.add("--layer")
    else:
        unused.add("--shape")
    return sorted(given & unused)


def main(argv: list[str] | None = None) -> int:
    """The part's command: exit status 0 pass, 1 fail; ``SystemExit(2)`` with one line otherwise."""
    given_argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    given = {tok.split("=", 1)[0] for tok in given_argv if tok.startswith("--")}
    other = sorted(given & set(OTHER_OPTIONS))
    if other:
        p.error(f"{', '.join(other)}: options of another part's check, not used by --part head")
    a = p.parse_args(given_argv)
    forms = [x for x in (a.implementation, a.kernels_dir, a.source, a.dump) if x is not None]
    if len(forms) != 1:
        p.error("--part head: give exactly one of: implementation (module:function), --kernels-dir, --source, --dump")
    unused = _unused(a, given)
    if unused:
        p.error(f"{', '.join(unused)}: not used by this form of the check (nothing given is ignored silently)")
    return args.run_command(lambda: _run(a, argv), PROG, OPTIONS)


class TimedHead:
    """A head form whose every call (its preparation, a case) runs under a time limit: a call
    past it raises ``TimeoutError`` (the check names the case)."""

    def __init__(self, inner: Any, seconds: float) -> None:
        from workbench.check.time_limit import LimitedCaller

        self.inner, self.seconds, self._caller = inner, seconds, LimitedCaller(seconds)
        self.name, self.kind = inner.name, inner.kind

    def _limited(self, fn: Callable[..., Any], *xs: Any) -> Any:
        o = self._caller(fn, *xs)
        if o.timed_out:
            raise TimeoutError(f"took over {self.seconds:g} s (--time-limit)")
        if o.error is not None:
            raise o.error
        return o.value

    def prepare(self, spec: Any) -> Callable[[Any], Any]:
        call = self._limited(self.inner.prepare, spec)

        def evaluated(head: Any) -> Any:
            import mlx.core as mx  # evaluated on the worker: MLX records a graph on the calling thread's stream

            out = call(head)
            if isinstance(out, (tuple, list)):
                mx.eval(*[x for x in out if isinstance(x, mx.array)])
            return out

        return lambda head: self._limited(evaluated, head)


def _subject(a: argparse.Namespace) -> Any:
    from workbench.check.head_subjects import HEAD_DIMS, HEAD_INPUTS, CallableHead, HeadSource, KernelsFolderHead

    if a.kernels_dir is not None:
        if not Path(a.kernels_dir).is_dir():
            raise ValueError(f"--kernels-dir: must be a folder shaped like kernels/, got {a.kernels_dir!r}")
        return KernelsFolderHead(a.kernels_dir)
    if a.source is not None:
        text = args.read_text("--source", a.source, "the head's kernel body")
        header = "" if a.header is None else args.read_text("--header", a.header, "the kernel's helper functions")
        ins = tuple(HEAD_INPUTS) if a.inputs is None else tuple(a.inputs.split(","))
        return HeadSource(
            text,
            ins,
            grid=a.grid,
            threadgroup=a.threadgroup,
            template=args.template(a.template, HEAD_DIMS),
            header=header,
            language=a.language,
            run_on=a.run_on,
            name=Path(a.source).stem,
        )
    fn = args.load_callable(a.implementation, "HeadInputs -> (q, k, v[, gate])")
    return CallableHead(fn, arrays=a.arrays, name=a.implementation)


def specs(a: argparse.Namespace) -> list[Any]:
    """The specs the options ask for: ``--model``/``--layer``'s head, else ``--shape``'s defaults."""
    from workbench.check.head_spec import DEFAULT_HEAD_SPECS, HeadSpec

    if a.model is not None:
        from workbench.models import load_model

        cfg = load_model(a.model)
        layer = cfg.attention_layers()[0] if a.layer is None and cfg.attention_layers() else a.layer
        if layer is None:
            raise ValueError(f"--model: {a.model} has no attention layer")
        try:
            return [HeadSpec.from_layer(cfg, layer)]
        except ValueError as e:  # the layer's own refusal, said of the option the user typed
            raise ValueError(
                f"{'--layer' if a.layer is not None else '--model'}: {str(e).split(': ', 1)[-1]}"
            ) from None
    shapes = a.shape or (["launch"] if a.kernels_dir is not None else ["model"])
    return [DEFAULT_HEAD_SPECS[s] for s in shapes]


def compile_error(subject: Any, spec: Any, time_limit: float) -> str | None:
    """For a kernel form on the emulator: clang's first complaint (with the count of the others)
    when the text does not compile, tried on one case of ``spec``; None otherwise (any other
    failure is the check's verdict, case by case)."""
    from workbench.check.head_cases import draw_head_cases
    from workbench.kernels.metal_emulation import MetalCompileError

    try:
        TimedHead(subject, time_limit).prepare(spec)(draw_head_cases(spec, [0], scale=1.0).inputs(0, 1))
    except MetalCompileError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        errors = [line for line in lines if ": error: " in line]
        more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
        return f"{errors[0] if errors else lines[0]}{more}"
    except Exception:
        return None
    return None


def _run(a: argparse.Namespace, argv: list[str] | None) -> int:
    from workbench.check.head_run import check_head

    if a.dump is not None:
        from workbench.check.head_dump import check_head_dump

        rep = check_head_dump(a.dump, tolerance=a.tolerance, faults=a.faults)
        study = None
    else:
        spec_list = specs(a)
        subject = _subject(a)
        if a.kernels_dir or (a.source and a.run_on == "emulator"):
            problem = compile_error(subject, spec_list[0], a.time_limit)
            if problem is not None:
                option, given = ("--kernels-dir", a.kernels_dir) if a.kernels_dir else ("--source", a.source)
                if a.source and problem.startswith("source:"):  # the emulator names the body "source"
                    problem = a.source + problem.removeprefix("source")
                raise ValueError(f"{option}: {given} does not compile for the emulator: {problem}")
        common = {"specs": spec_list, "seeds": range(a.seeds), "scales": a.scales, "positions": a.positions}
        rep = check_head(TimedHead(subject, a.time_limit), **common, tolerance=a.tolerance, faults=a.faults)
        study = None
        if a.mutants:
            from workbench.check.head_mutants import head_mutant_study

            study = head_mutant_study(subject, **common, tolerance=a.tolerance)
    print(rep)
    shown = rep.problems[:20]
    if shown:
        print(f"problems ({len(rep.problems)}):")
        print("\n".join(f"  - {x}" for x in shown))
        if len(shown) < len(rep.problems):
            print(f"  ... and {len(rep.problems) - len(shown)} more (all in the record)")
    if study is not None:
        print(study)
    if a.record is not None:
        extra = {} if study is None else {"mutants": study.counts()}
        args.write_record(a.record, {**rep.to_record(), **extra, **args.provenance(argv)}, rep.passed)
    return 0 if rep.passed else 1
