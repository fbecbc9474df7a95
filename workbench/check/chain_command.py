"""``python -m workbench.check --chain tail,gdn_in,gdn``: parts chained as the engine launches
them, checked as ONE implementation, or as one callable a link, against the chained float64
truth, each link's error beside the workbench's float32 reference chain's.

    python -m workbench.check --chain tail,gdn_in,gdn mypkg.chains:my_chain --seeds 30 --record chain.json
    python -m workbench.check --chain tail,gdn_in,gdn --link tail=mypkg.tails:my_tail \\
        --link gdn=mypkg.steps:my_step --dims hidden=128,ffn=256
    python -m workbench.check --chain gdn,tail,head mypkg.chains:run_end   # the run's last step, the next head

One implementation is ``module:function``, handed a ``ChainCase`` (the chain's inputs, every
link's weights, the dims) and returning every link's outputs (a mapping by link name, or a
list in link order). ``--link NAME=module:function`` (repeated) gives a link its own callable,
handed a ``LinkCase`` (the inputs the user's previous link returned), ``--link NAME=FOLDER``
a kernels folder (the tail's or the step's bodies, on the CPU emulator); a link not given
runs the workbench's float32 reference. Exit 0: every link passes; 1: some link fails (the first
is named); 2: nothing could be judged, with ONE line on stderr naming the option.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from workbench.check import command_args as args
from workbench.check.chain_links import INT_DIMS

PROG = "python -m workbench.check"

#: The check's parameters (as its ``ValueError`` messages name them) -> the options typed.
OPTIONS: dict[str, str] = {
    "chain": "--chain",
    "subject": "--link",
    "dims": "--dims",
    "seeds": "--seeds",
    "scales": "--scales",
    "gates": "--gates",
    "state_scales": "--state-scales",
    "tolerance": "--tolerance",
    "time_limit": "--time-limit",
}

#: Options of the tail's and the step's checks a chain has no use for (refused by name).
OTHER_OPTIONS: tuple[str, ...] = (
    "--part",
    "--kernels-dir",
    "--source",
    "--dump",
    "--arrays",
    "--batched",
    "--fold",
    "--mutants",
    "--mutant-files",
    "--output",
    "--inputs",
    "--header",
    "--grid",
    "--threadgroup",
    "--template",
    "--language",
    "--run-on",
    "--tokens",
    "--horizons",
    "--geometries",
    "--faults",
    "--replay",
    "--replay-dir",
    "--replay-max-bytes",
)

#: What ``--dims`` may set (``chain_links.ChainDims``'s integer fields): widths >= 1, the
#: head's rotated dims and the token's position >= 0.
DIM_NAMES: tuple[str, ...] = (*INT_DIMS, "rotary_dim", "position")


def _dims(text: str) -> dict[str, int]:
    """argparse type of ``--dims``: ``name=value,...`` of :data:`DIM_NAMES`."""
    out = {}
    for item in text.split(","):
        k, sep, v = item.strip().partition("=")
        if not sep or k.strip() not in DIM_NAMES:
            raise argparse.ArgumentTypeError(
                f"must be name=value,... with names of {', '.join(DIM_NAMES)}, got {text!r}"
            )
        least = 1 if k.strip() in INT_DIMS else 0
        out[k.strip()] = args.count(least, 1 << 24)(v.strip())
    return out


def _link(text: str) -> tuple[str, str]:
    """argparse type of ``--link``: ``NAME=module:function`` or ``NAME=FOLDER`` (a kernels folder)."""
    name, sep, spec = text.partition("=")
    if not sep or not name.strip() or not spec.strip():
        raise argparse.ArgumentTypeError(f"must be LINK=module:function or LINK=FOLDER, got {text!r}")
    return name.strip(), spec.strip()


#: link -> its part's kernels-folder form (the user's bodies on the workbench's launches, on the emulator).
FOLDER_FORMS: dict[str, str] = {"tail": "KernelsFolderSubject", "gdn": "KernelsFolderStep"}


def _folder_form(link: str, folder: str) -> Any:
    """``--link LINK=FOLDER``: the part's kernels-folder form, or a ValueError naming ``--link``."""
    if link not in FOLDER_FORMS:
        raise ValueError(
            f"--link {link}: a kernels folder runs the {' and '.join(FOLDER_FORMS)} links only, got {folder!r}"
        )
    if link == "tail":
        from workbench.check.subjects import KernelsFolderSubject

        return KernelsFolderSubject(folder, process=False)
    from workbench.check.gdn_subjects import KernelsFolderStep

    return KernelsFolderStep(folder)


def parser() -> argparse.ArgumentParser:
    """The chain's options, as ``--chain ... --help`` prints them."""
    from workbench.check.chain_links import LINKS
    from workbench.check.chain_run import CHAIN_GATES, CHAIN_SCALES, CHAIN_STATE_SCALES
    from workbench.check.gdn_cases import GATES

    lines = [f"  {k}: {v.what}; reads {', '.join(v.inputs)}; writes {', '.join(v.outputs)}" for k, v in LINKS.items()]
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        epilog="\n".join(["links (--chain, in launch order):", *lines]),
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "implementation", nargs="?", help="module:function of ONE chain implementation (ChainCase -> outputs)"
    )
    p.add_argument("--chain", required=True, help=f"the links in launch order, comma-separated, of {', '.join(LINKS)}")
    p.add_argument(
        "--link",
        type=_link,
        action="append",
        default=[],
        help="LINK=module:function: that link's own callable (LinkCase -> outputs), or LINK=FOLDER: a kernels "
        "folder (tail, gdn) on the CPU emulator; repeat a link each",
    )
    p.add_argument("--dims", type=_dims, default={}, help=f"the tiny config, name=value,... of {', '.join(DIM_NAMES)}")
    p.add_argument("--seeds", type=args.count(1, 1_000_000), default=30, help="cases a condition (default 30)")
    p.add_argument(
        "--scales",
        type=args.number_list(positive=True),
        default=list(CHAIN_SCALES),
        help=f"input scales of the chain's inputs (default {args.csv(CHAIN_SCALES)})",
    )
    p.add_argument(
        "--gates",
        default=",".join(CHAIN_GATES),
        help=f"the step's gate regimes, of {', '.join(GATES)} (default typical)",
    )
    p.add_argument(
        "--state-scales",
        type=args.number_list(positive=False),
        default=list(CHAIN_STATE_SCALES),
        help=f"the recurrent state's magnitudes (default {args.csv(CHAIN_STATE_SCALES)})",
    )
    p.add_argument("--tolerance", type=args.non_negative, help="your own tolerance on every link's worst scaled error")
    p.add_argument("--time-limit", type=args.positive, default=30.0, help="seconds one call of yours may take (30)")
    p.add_argument("--record", type=args.record, help="write the JSON record here (refused if the file exists)")
    return p


def main(argv: list[str] | None = None) -> int:
    """The chain's command: exit status 0 pass, 1 fail; ``SystemExit(2)`` with one line otherwise."""
    given_argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    given = {tok.split("=", 1)[0] for tok in given_argv if tok.startswith("--")}
    other = sorted(given & set(OTHER_OPTIONS))
    if other:
        p.error(f"{', '.join(other)}: options of the tail's or the step's check, not used by --chain")
    a = p.parse_args(given_argv)
    if (a.implementation is None) == (not a.link):
        p.error("--chain: give exactly one of: implementation (module:function, the whole chain), or --link options")
    return args.run_command(lambda: _run(a, argv), PROG, OPTIONS)


def _run(a: argparse.Namespace, argv: list[str] | None) -> int:
    from workbench.check.chain_links import ChainDims
    from workbench.check.chain_run import check_chain
    from workbench.check.chain_wiring import chain_names, instance_labels

    names = chain_names(a.chain)
    valid = set(names) | set(instance_labels(names))  # a name gives every occurrence, a label (gdn@2) one
    dims = ChainDims(**a.dims)
    gates = [g.strip() for g in a.gates.split(",")]
    if a.implementation is not None:
        subject: Any = args.load_callable(a.implementation, "ChainCase -> every link's outputs")
        shown = a.implementation
    else:
        subject = {}
        for link, spec in a.link:
            if link not in valid:
                raise ValueError(f"--link: {link!r} is not a link of the chain {','.join(instance_labels(names))}")
            if link in subject:
                raise ValueError(f"--link: {link!r} given twice")
            try:
                if ":" not in spec and Path(spec).is_dir():
                    subject[link] = _folder_form(link.split("@")[0], spec)
                else:
                    subject[link] = args.load_callable(spec, "LinkCase -> the link's outputs")
            except ValueError as e:
                text = str(e).removeprefix("implementation: ").removeprefix("folder: ")
                raise ValueError(f"--link {link}: {text}" if not text.startswith("--link") else text) from None
        shown = ",".join(f"{k}={v}" for k, v in a.link)
    rep = check_chain(
        subject,
        names,
        dims=dims,
        seeds=range(a.seeds),
        scales=a.scales,
        gates=gates,
        state_scales=a.state_scales,
        tolerance=a.tolerance,
        time_limit=a.time_limit,
        name=shown,
    )
    print(rep)
    if rep.problems:
        print(f"problems ({len(rep.problems)}):")
        print("\n".join(f"  - {x}" for x in rep.problems[:20]))
        if len(rep.problems) > 20:
            print(f"  ... and {len(rep.problems) - 20} more (all in the record)")
    if a.record is not None:
        args.write_record(a.record, {**rep.to_record(), **args.provenance(argv)}, rep.passed)
    return 0 if rep.passed else 1
