"""What nvcc makes of the tail's kernels: registers, spills and instructions, no GPU needed.

    python -m bench.sass_counts                  # the kernels as they are
    python -m bench.sass_counts --old DIR        # an older kernels/ folder beside them

Compiles each launch of the tail (wo_residual, ffn_gate_up, ffn_down) and the tail as one launch in each weight
format (``--launches``, ``--formats``), at Bonsai-27B's shape with the launches' default template values, as
MLX would (``nvcc -arch=sm_90 -cubin``), and reads the machine code (``cuobjdump -sass``): registers, bytes
spilled, instructions, and the row loop's (for the one launch, each phase's) instructions by class
(``bench.common.sass.CLASSES``); with ``--old``, the old folder's counts and new / old. These are static counts,
one pass through a loop, not what a launch executes (``bench.launch_profile`` measures that on a GPU): they say
in seconds whether an edit of the kernel text cut instructions, and which.

Needs nvcc (CUDA 12 or 13), cuobjdump and nvdisasm (on PATH, or the ``test`` extra's NVIDIA wheels). Writes
``data/bench/sass_counts-<host>-<UTC time>.json`` with the compilers' versions. Exit status: 0; 2 without those
tools, with a DIR that is not a kernels folder, or for an unknown ``--formats`` or ``--launches`` item.
"""

from __future__ import annotations

import copy
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import cli, kernels, record
from bench.common.sass import CLASSES, compile_sass, find_tool, parse_sass, sass_counts, tool_version
from workbench.fold import AFFINE4, AFFINE8, BFLOAT16, MXFP4, NVFP4, Format, factor_block
from workbench.kernels import (
    BARRIER_LIMIT_MS,
    DENSE_GS,
    KERNELS,
    ONE_LAUNCH_BODY,
    ONE_LAUNCH_PHASES,
    TAIL_KERNELS,
    KernelTuning,
    OneLaunchShape,
    cuda_translation_unit,
    fingerprint,
    input_dtypes,
    interleaved,
    one_launch_inputs,
    one_launch_translation_unit,
    shape_for_formats,
    units_for,
)
from workbench.reports import kernel_bodies as kernel_versions


def _bonsai() -> dict[str, int]:
    """Bonsai-27B's tail as ``bench.common.kernels.BONSAI`` gives it (hidden, branch: wo's
    input, ffn; wo's fold block), the block factored as the rotation applies it
    (``hadamard.factor_block``: block = m 2^logp)."""
    (hidden, branch, ffn), block = kernels.BONSAI
    m, logp = factor_block(block)
    return {"hidden": hidden, "branch": branch, "ffn": ffn, "m": m, "logp": logp}


#: The shape counted.
BONSAI = _bonsai()

#: The tail as ONE launch (``kernels/tail_one_launch.body``, ``workbench.kernels.one_launch``), as
#: the record and ``--launches`` name it.
ONE_LAUNCH = kernel_versions.SASS_ONE_LAUNCH

#: The launches counted: the tail's three, then the tail as one launch.
LAUNCHES: tuple[str, ...] = (*TAIL_KERNELS, ONE_LAUNCH)

#: The weight formats counted, by the label records and ``--formats`` give them (dense
#: bfloat16 is "bf16"), each at its default group size.
FORMATS: dict[str, Format] = {
    "bf16": BFLOAT16,
    **{f.name: f for f in (AFFINE4, AFFINE8, MXFP4, NVFP4)},
}


def format_codes(fmt_label: str) -> tuple[int, int]:
    """The template values ``FMT`` and ``SFMT`` of ``fmt_label``'s matrices as the launches
    see MLX's arrays made from bfloat16 weights (affine scales and biases then bfloat16)."""
    fmt = FORMATS[fmt_label]
    assert fmt.code is not None  # every counted format is one the kernels read
    return fmt.code, fmt.scale_code("bfloat16")


def launch_templates(
    fmt_label: str, tuning: KernelTuning | None = None, shape: dict[str, int] | None = None
) -> dict[str, list[tuple[str, Any]]]:
    """The three launches' template values for ``fmt_label`` at ``shape`` (default:
    :data:`BONSAI`) with ``tuning`` (default ``KernelTuning()``), written out as
    ``PreparedTail.templates`` builds them from prepared weights (every matrix in one
    format; interleaved words where a row is a multiple of 128 words), because making
    Bonsai-27B's weights to prepare would take minutes of CPU. The tests check the two agree."""
    if fmt_label not in FORMATS:
        raise ValueError(f"fmt_label must be one of {tuple(FORMATS)}; got {fmt_label!r}")
    t = tuning or KernelTuning()
    sh = dict(BONSAI if shape is None else shape)
    fmt, (code, sfmt) = FORMATS[fmt_label], format_codes(fmt_label)
    gs = fmt.group_size or DENSE_GS
    u = units_for

    def base(cols: int) -> list[tuple[str, Any]]:
        return [("FMT", code), ("SFMT", sfmt), ("GS", gs), ("QI", interleaved(fmt, cols))]

    h, b, f = sh["hidden"], sh["branch"], sh["ffn"]
    return {
        "wo_residual": [
            ("NT", t.wo_nt),
            *base(b),
            ("WIDTH", b),
            ("ROWS", h),
            ("ROT", True),
            ("M", sh["m"]),
            ("LOGP", sh["logp"]),
            ("U", u(code, t.u_wo)),
            ("PRE", bool(t.pre_wo)),
        ],
        "ffn_gate_up": [
            ("NT", t.rows_nt),
            *base(h),
            ("HID", h),
            ("FFN", f),
            ("U", u(code, t.u_gate_up)),
            ("PRE", bool(t.pre_gate_up)),
        ],
        "ffn_down": [
            ("NT", t.down_nt),
            *base(f),
            ("HID", h),
            ("FFN", f),
            ("U", max(1, u(code, t.u_down) // t.down_rows)),
            ("DR", t.down_rows),
        ],
    }


def one_launch_shape(fmt_label: str) -> OneLaunchShape:
    """The one launch's shape for a tail whose matrices are all ``fmt_label``, as
    ``one_launch.shape_for`` chooses it (the shape ``fused_tail(backend="cuda")`` and
    ``bench.kernel_bodies`` run; ``one_launch.shape_for_formats``)."""
    if fmt_label not in FORMATS:
        raise ValueError(f"fmt_label must be one of {tuple(FORMATS)}; got {fmt_label!r}")
    return shape_for_formats([FORMATS[fmt_label]])


def one_launch_templates(
    fmt_label: str,
    tuning: KernelTuning | None = None,
    shape: dict[str, int] | None = None,
    launch_shape: OneLaunchShape | None = None,
) -> list[tuple[str, Any]]:
    """The one launch's template values for ``fmt_label`` at ``shape`` (default:
    :data:`BONSAI`) with ``tuning`` (default ``KernelTuning()``) in ``launch_shape``
    (default :func:`one_launch_shape`'s), written out as ``one_launch.OneLaunchTail``
    builds them (``one_launch.launch_template``) from :func:`launch_templates`: each
    phase's values under its prefix (NT the one launch's; wo's and gate_up's U from the
    shape's ``row_units`` where it sets them; down's DR rows a group sharing ``u_down``),
    the barrier counter after h and act on a 128-byte line, the default barrier limit.
    Checked against ``OneLaunchTail(...).template`` in the tests."""
    t = tuning or KernelTuning()
    ls = launch_shape or one_launch_shape(fmt_label)
    sh = dict(BONSAI if shape is None else shape)
    fmt = format_codes(fmt_label)[0]
    phases = {k: dict(v, NT=ls.nt) for k, v in launch_templates(fmt_label, t, sh).items()}
    if ls.row_units is not None:
        for k in ("wo_residual", "ffn_gate_up"):
            phases[k]["U"] = units_for(fmt, ls.row_units)
    phases["ffn_down"].update(DR=ls.down_rows, U=max(1, units_for(fmt, t.u_down) // ls.down_rows))
    h, f = sh["hidden"], sh["ffn"]
    template: list[tuple[str, Any]] = [
        ("NT", ls.nt),
        ("HID", h),
        ("FFN", f),
        ("SYNC_AT", -(-(h + f) // 32) * 32),
        ("BARRIER_LIMIT_MS", BARRIER_LIMIT_MS),
    ]
    for kernel, prefix in ONE_LAUNCH_PHASES:
        template += [(prefix + k, v) for k, v in phases[kernel].items() if k != "NT"]
    return template


def count_launch(
    source: str,
    workdir: Path,
    stem: str,
    *,
    nvcc: str,
    cuobjdump: str,
    nvdisasm: str,
    arch: str,
    phases: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Compile one translation unit; its registers, spills and instruction counts
    (:func:`sass_counts`; ``phases`` for the one launch)."""
    report, sass = compile_sass(source, workdir, stem, nvcc=nvcc, cuobjdump=cuobjdump, nvdisasm=nvdisasm, arch=arch)
    regs = re.search(r"Used (\d+) registers", report)
    spill = re.search(r"(\d+) bytes spill stores", report)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_bytes": int(spill.group(1)) if spill else None,
        **sass_counts(parse_sass(sass), phases),
    }


def run(
    formats: tuple[str, ...],
    *,
    old_dir: Path | None,
    nvcc: str,
    cuobjdump: str,
    nvdisasm: str,
    arch: str,
    jobs: int = 2,
    launches: tuple[str, ...] = LAUNCHES,
) -> list[dict[str, Any]]:
    """Every launch of ``launches`` (default: the three and the one launch) and format,
    each side with ``old_dir``: one row each. The one launch's old side only where
    ``old_dir`` has its body (a folder from before it has none). A text both sides share
    is compiled once."""
    sides = {"new": None} if old_dir is None else {"old": old_dir, "new": None}
    work = []
    for label in formats:
        fmt, sfmt = format_codes(label)
        for kernel, template in launch_templates(label).items():
            if kernel not in launches:
                continue
            dtypes = input_dtypes(KERNELS[kernel].inputs, fmt, sfmt)
            for side, folder in sides.items():
                text = cuda_translation_unit(kernel, dtypes, dict(template), kernel_dir=folder)
                work.append(({"launch": kernel, "format": label, "side": side, "template": dict(template)}, text))
        if ONE_LAUNCH in launches:
            template = dict(one_launch_templates(label))
            dtypes = input_dtypes(one_launch_inputs(), fmt, sfmt)
            for side, folder in sides.items():
                if folder is not None and not (folder / ONE_LAUNCH_BODY).is_file():
                    continue
                text = one_launch_translation_unit(dtypes, template, kernel_dir=folder)
                work.append(({"launch": ONE_LAUNCH, "format": label, "side": side, "template": template}, text))
                for kernel, values in phase_templates(template).items():  # each phase compiled alone
                    text = cuda_translation_unit(
                        kernel,
                        input_dtypes(KERNELS[kernel].inputs, fmt, sfmt),
                        values,
                        kernel_dir=folder,
                    )
                    work.append(({"launch": ONE_LAUNCH, "format": label, "side": side, "alone": kernel}, text))
    phases = tuple(k for k, _ in ONE_LAUNCH_PHASES)

    def count(w: tuple[dict[str, Any], str]) -> dict[str, Any]:
        key = w[0]
        stem = "-".join(str(key[k]) for k in ("side", "launch", "alone", "format") if k in key)
        one = key["launch"] == ONE_LAUNCH and "alone" not in key
        return count_launch(
            w[1],
            Path(tmp),
            stem,
            nvcc=nvcc,
            cuobjdump=cuobjdump,
            nvdisasm=nvdisasm,
            arch=arch,
            phases=phases if one else None,
        )

    # Each distinct text is compiled once: the old folder's text of a launch is often the new
    # one's (an unchanged launch, or a copy of kernels/), and a compile is seconds of nvcc.
    # The counts depend on the text and on whether it is read as the one launch (by phase).
    def text_key(w: tuple[dict[str, Any], str]) -> tuple[str, bool]:
        return w[1], w[0]["launch"] == ONE_LAUNCH and "alone" not in w[0]

    first = {}
    for w in work:
        first.setdefault(text_key(w), w)
    with tempfile.TemporaryDirectory(prefix="sass_counts-") as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        by_text = dict(zip(first, pool.map(count, first.values())))
    # A copy a row: the one launch's phases get their "alone" counts below, one side at a time.
    counted = [copy.deepcopy(by_text[text_key(w)]) for w in work]
    rows = [{**key, **res} for (key, _), res in zip(work, counted) if "alone" not in key]
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    for (key, _), res in zip(work, counted):
        if "alone" in key:
            by[(key["launch"], key["format"], key["side"])]["phases"][key["alone"]]["alone"] = {
                "registers": res["registers"],
                "spill_bytes": res["spill_bytes"],
                "instructions": res["instructions"],
            }
    return rows


def phase_templates(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each phase of the one launch as a launch of its own with the one launch's values for
    it (its prefixed values unprefixed, NT the one launch's): compiled alone, ptxas says
    the registers that phase asks for; the one launch's count is one number for all three."""
    return {
        kernel: {t: template["NT"] if t == "NT" else template[prefix + t] for t in KERNELS[kernel].template}
        for kernel, prefix in ONE_LAUNCH_PHASES
    }


#: How the one launch's phases are named in the table (and in ``kernel_versions.sass_table``).
_PHASE_SHORT = {"wo_residual": "wo", "ffn_gate_up": "gate_up", "ffn_down": "down", "barriers": "barriers"}


def print_table(rows: list[dict[str, Any]]) -> None:
    """The three launches: one line a launch and format (registers, instructions, the row
    loop's and its classes, and with two sides the loop's old count and new / old). The
    one launch, below: a line a phase, format and side (its instructions, its outer loops'
    and their classes, the loops inside those, and new / old of the outer loops), then its
    registers, spills and instructions in all. At most 100 columns."""
    by = {(r["launch"], r["format"], r["side"]): r for r in rows}
    two = any(r["side"] == "old" for r in rows)
    classes = (*CLASSES, "other")
    three = [k for k in by if k[0] != ONE_LAUNCH and k[2] == "new"]
    if three:
        head = f"{'launch':<12}{'format':<9}{'regs':>5}{'spill':>6}{'instr':>7}{'loop':>6}"
        head += "".join(f"{c:>8}" for c in classes) + (f"{'old loop':>10}{'new/old':>9}" if two else "")
        print(head)
    for launch, fmt, side in three:
        r = by[(launch, fmt, side)]
        cls = r["loop_classes"]
        line = (
            f"{launch.replace('ffn_', ''):<12}{fmt:<9}{r['registers']!s:>5}{r['spill_bytes']!s:>6}"
            f"{r['instructions']:>7}{r['loop_instructions']:>6}" + "".join(f"{cls[c]:>8}" for c in cls)
        )
        if two:
            old = by[(launch, fmt, "old")]["loop_instructions"]
            line += f"{old:>10}{r['loop_instructions'] / old:>9.3f}" if old else f"{'-':>10}{'-':>9}"
        print(line)
    formats = list(dict.fromkeys(k[1] for k in by if k[0] == ONE_LAUNCH))
    if not formats:
        return
    print(
        ("\n" if three else "") + "the one launch, a phase a line: instr = its instructions, loops = its outer "
        "loops'\n(cold paths out) by class, inner = the loops in those, alone = registers compiled alone"
    )
    print(
        f"{'phase':<10}{'format':<9}{'side':<5}{'instr':>6}{'loops':>7}"
        + "".join(f"{c:>8}" for c in classes)
        + f"{'inner':>7}{'alone':>6}{'new/old':>9}"
    )
    for fmt in formats:
        sides = [s for s in ("old", "new") if (ONE_LAUNCH, fmt, s) in by]
        for phase, short in _PHASE_SHORT.items():
            for side in sides:
                ph = by[(ONE_LAUNCH, fmt, side)]["phases"][phase]
                alone = ph.get("alone", {}).get("registers", "")
                line = (
                    f"{short:<10}{fmt:<9}{side:<5}{ph['instructions']:>6}{ph['loop_instructions']:>7}"
                    + "".join(f"{ph['loop_classes'][c]:>8}" for c in classes)
                    + f"{ph['inner_instructions']:>7}{alone!s:>6}"
                )
                old = by.get((ONE_LAUNCH, fmt, "old"))
                if side == "new" and old and old["phases"][phase]["loop_instructions"]:
                    line += f"{ph['loop_instructions'] / old['phases'][phase]['loop_instructions']:>9.3f}"
                print(line)
        for side in sides:
            r = by[(ONE_LAUNCH, fmt, side)]
            print(
                f"{'all':<10}{fmt:<9}{side:<5}{r['instructions']:>6}  registers {r['registers']}, "
                f"spilled {r['spill_bytes']} bytes"
            )


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("sass_counts", __doc__)
    ap.add_argument("--old", default=None, help="a copy of an older kernels/ folder to count beside kernels/")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {tuple(FORMATS)}")
    ap.add_argument(
        "--launches",
        default=",".join(LAUNCHES),
        help=f"comma list of {LAUNCHES} ({ONE_LAUNCH}: the tail as one launch, by phase)",
    )
    ap.add_argument("--arch", default="sm_90", help="the GPU architecture nvcc compiles for")
    ap.add_argument("--jobs", type=int, default=2, help="compilations at once")
    a = ap.parse_args(argv)
    formats = tuple(cli.comma_list(ap, "--formats", a.formats, tuple(FORMATS)))
    launches = tuple(k for k in LAUNCHES if k in cli.comma_list(ap, "--launches", a.launches, LAUNCHES))
    if not re.fullmatch(r"sm_\d{2,3}a?", a.arch):
        ap.error(f"--arch must name a GPU architecture such as sm_90; got {a.arch!r}")
    cli.at_least(ap, "--jobs", a.jobs, 1)
    old_dir = None
    if a.old is not None:
        old_dir = Path(a.old).resolve()
        needed = [
            "common.h",
            "prelude_cuda.h",
            *sorted({KERNELS[k].body for k in launches if k != ONE_LAUNCH}),
        ]
        missing = [n for n in needed if not (old_dir / n).is_file()]
        if missing:
            ap.error(f"--old must be a kernels folder holding {', '.join(needed)}; {old_dir} lacks {missing}")
        if ONE_LAUNCH in launches and not (old_dir / ONE_LAUNCH_BODY).is_file():
            print(
                f"{old_dir} has no {ONE_LAUNCH_BODY} (older than the one launch): "
                "the one launch is counted from kernels/ alone"
            )
    nvcc, cuobjdump, nvdisasm = shutil.which("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    if nvcc is None or cuobjdump is None or nvdisasm is None:
        print(
            "needs nvcc (the CUDA toolkit), cuobjdump and nvdisasm (on PATH, or `pip install nvidia-cuda-cuobjdump "
            f"nvidia-cuda-nvdisasm`); found nvcc: {nvcc}, cuobjdump: {cuobjdump}, nvdisasm: {nvdisasm}"
        )
        return 2
    prov = record.provenance("sass_counts", argv)
    versions = {"nvcc": tool_version(nvcc), "cuobjdump": tool_version(cuobjdump)}
    print(
        f"nvcc {versions['nvcc']}\ncuobjdump {versions['cuobjdump']}\n{a.arch}: kernels/ ({prov['kernel_text']})"
        + (f" against\n{old_dir} ({fingerprint(kernel_dir=old_dir)})" if old_dir else "")
    )
    rows = run(
        formats,
        old_dir=old_dir,
        nvcc=nvcc,
        cuobjdump=cuobjdump,
        nvdisasm=nvdisasm,
        arch=a.arch,
        jobs=a.jobs,
        launches=launches,
    )
    print_table(rows)
    rec = {
        "what": "registers, spills and static instruction counts of the tail's kernels as nvcc compiles them",
        **prov,
        **versions,
        "arch": a.arch,
        "shape": BONSAI,
        "launches": list(launches),
        "old_dir": a.old,  # as given: the fingerprint below says which text it held
        "old_kernel_text": fingerprint(kernel_dir=old_dir) if old_dir else None,
        "classes": {c: sorted(ops) for c, ops in CLASSES.items()},
        "rows": rows,
    }
    if not a.no_record:
        print()
        record.write(rec, a.out_dir, record.record_stem("sass_counts"), force=a.force)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.sass_counts"))
