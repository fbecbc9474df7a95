"""The tail's kernel sources: ``kernels/`` composed into what MLX compiles.

Each algorithm is written ONCE, as a kernel body (``kernels/*.body``) plus shared helpers
(``kernels/common.h``), in a C++ subset that means the same in Metal and in CUDA. The only
dialect-specific text is a thin prelude per dialect (``kernels/prelude_metal.h``,
``kernels/prelude_cuda.h``, :func:`prelude`): macros and inline functions for the thread and
group indices, group memory, barriers and SIMD/warp sums.

``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel`` take the composed ``(header, source)``
(:func:`compose`); :data:`KERNELS` names each kernel's inputs, outputs and template values,
in the order the launches pass them. :func:`cuda_translation_unit` rebuilds the CUDA file MLX
would hand NVRTC, so the CUDA text can be compiled with ``nvcc`` on a machine without a GPU.
:func:`compose_one_launch` composes the CUDA-only tail in one launch
(``kernels/tail_one_launch.body``): the three tail bodies, verbatim, as its phases.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from workbench import files
from workbench.fold import formats

#: Where the kernel sources live (the repository's ``kernels/``).
KERNEL_DIR = files.PROJECT_ROOT / "kernels"

#: The dialects, one prelude each.
DIALECTS: tuple[str, ...] = ("metal", "cuda")


@dataclass(frozen=True)
class DialectText:
    """How a dialect's composed text reaches MLX, and the limits the text must respect there:
    ``maker`` the ``mx.fast`` constructor's name; ``compact`` the header handed over as an
    included file and the source without comments (:func:`cuda_launch_text`: MLX's CUDA
    path hashes the whole text on every launch); ``group_memory_checked`` a launch is
    checked against Apple GPUs' threadgroup memory before it is built (a pipeline over it
    fails to build); ``grid_barriers`` groups may wait on each other (CUDA's residency;
    Metal promises no forward progress between threadgroups)."""

    maker: str
    compact: bool
    group_memory_checked: bool
    grid_barriers: bool


#: Each dialect's text facts (:class:`DialectText`); which backend runs which dialect is
#: ``workbench.kernels.run``'s to say.
DIALECT_TEXT: dict[str, DialectText] = {
    "metal": DialectText("metal_kernel", compact=False, group_memory_checked=True, grid_barriers=False),
    "cuda": DialectText("cuda_kernel", compact=True, group_memory_checked=False, grid_barriers=True),
}

#: The line that splits a prelude into its header part and its body part.
BODY_MARK = "//== body =="


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: MLX's name for it, its body file, inputs, outputs and template names."""

    name: str
    body: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    template: tuple[str, ...]
    doc: str


_DENSE_OR_Q4 = ("NT", "FMT", "SFMT", "GS", "QI")

#: The tail's kernels and the head launch's, by short name.
KERNELS: dict[str, KernelSpec] = {
    "wo_residual": KernelSpec(
        "fat_wo_residual",
        "wo_residual.body",
        ("x", "sdest", "table", "params", "w", "ws", "wb", "residual"),
        ("h",),
        _DENSE_OR_Q4 + ("WIDTH", "ROWS", "ROT", "M", "LOGP", "U", "PRE"),
        "h = residual + wo' (R x): the fold's rotation applied in group memory, then the first residual add",
    ),
    "ffn_gate_up": KernelSpec(
        "fat_ffn_gate_up",
        "ffn_gate_up.body",
        ("hin", "nw", "params", "wg", "wgs", "wgb", "wu", "wus", "wub"),
        ("act",),
        _DENSE_OR_Q4 + ("HID", "FFN", "U", "PRE"),
        "act = silu(gate n) * (up n), n = rms_norm(h) * ffn_norm (each group computes the norm)",
    ),
    "ffn_down": KernelSpec(
        "fat_ffn_down",
        "ffn_down.body",
        ("act", "hin", "wd", "wds", "wdb"),
        ("out",),
        _DENSE_OR_Q4 + ("HID", "FFN", "U", "DR"),
        "out = h + down act: the second residual add (DR rows a group)",
    ),
    "head_qkv": KernelSpec(
        "fat_head_qkv",
        "head_qkv.body",
        ("hid", "nw", "params", "sdest", "table", "q_w", "q_s", "q_b", "k_w", "k_s", "k_b", "v_w", "v_s", "v_b"),
        ("q_out", "k_out", "v_out"),
        _DENSE_OR_Q4 + ("HID", "NQ", "NK", "NV", "ROT", "M", "LOGP", "U", "PRE"),
        "q, k, v from R (rms_norm(hidden) * attn_norm): the one shared rotation applied once",
    ),
    "gdn_step": KernelSpec(
        "fat_gdn_step",
        "gdn_step.body",
        ("mixed", "z", "ba", "conv_state", "state", "conv_w", "a_log", "dt_bias", "o_norm", "params"),
        ("out", "conv_out", "state_out"),
        ("NT", "HK", "HV", "DK", "DV", "KW"),
        "a Gated DeltaNet layer's recurrent step (conv, silu, L2 norms, gates, gated delta rule, RMS norm, "
        "z gate): one group a value head",
    ),
}

#: The tail's launches, in the order one tail encodes them.
TAIL_KERNELS: tuple[str, ...] = ("wo_residual", "ffn_gate_up", "ffn_down")


def check_dialect(dialect: str) -> None:
    dialect_text(dialect)


def dialect_text(dialect: str) -> DialectText:
    """``dialect``'s :class:`DialectText`, or ValueError naming the dialects."""
    found = DIALECT_TEXT.get(dialect) if isinstance(dialect, str) else None
    if found is None:
        raise ValueError(f"dialect must be one of {DIALECTS}; got {dialect!r}")
    return found


def _check_kernel(kernel: str) -> KernelSpec:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {tuple(KERNELS)}; got {kernel!r}")
    return KERNELS[kernel]


def _folder(kernel_dir: str | Path | None) -> Path:
    """The folder sources are read from: ``kernel_dir`` resolved, or :data:`KERNEL_DIR`."""
    return KERNEL_DIR if kernel_dir is None else Path(kernel_dir).resolve()


@lru_cache(maxsize=256)
def _read(folder: Path, filename: str) -> str:
    path = folder / filename
    if not path.is_file():
        raise FileNotFoundError(f"kernel source {filename!r} not found in {folder}")
    return path.read_text()


def read(filename: str, *, kernel_dir: str | Path | None = None) -> str:
    """The text of ``filename`` in ``kernel_dir`` (default: the repository's ``kernels/``).

    Read once per (folder, file name): a benchmark may compose another folder's sources
    (an older copy of ``kernels/``) beside the current ones in one process.
    """
    return _read(_folder(kernel_dir), filename)


def prelude(dialect: str, *, kernel_dir: str | Path | None = None) -> tuple[str, str]:
    """``(header_part, body_part)`` of the dialect's prelude (from ``kernel_dir``, default ``kernels/``).

    The prelude is split at its ``//== body ==`` line: the first part goes into the kernel's
    ``header`` (before MLX's generated signature), the second is prepended to each body (in
    Metal the thread-index attributes reach the kernel only when the body names them).
    """
    check_dialect(dialect)
    lines = read(f"prelude_{dialect}.h", kernel_dir=kernel_dir).splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.strip() == BODY_MARK]
    if len(marks) != 1:
        raise ValueError(f"prelude_{dialect}.h must contain the line {BODY_MARK!r} exactly once")
    return "".join(lines[: marks[0]]), "".join(lines[marks[0] + 1 :])


def compose(dialect: str, kernel: str, *, kernel_dir: str | Path | None = None) -> tuple[str, str]:
    """``(header, source)`` for ``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel``.

    header = the prelude's header part + common.h; source = the prelude's body part +
    the kernel's body, all read from ``kernel_dir`` (default: the repository's
    ``kernels/``). Nothing else differs between the dialects.
    """
    spec = _check_kernel(kernel)
    head, body_part = prelude(dialect, kernel_dir=kernel_dir)
    common = read("common.h", kernel_dir=kernel_dir)
    header = f"// ---- prelude ({dialect}) ----\n{head}\n// ---- common.h ----\n{common}\n"
    source = f"{body_part}\n  // ---- {spec.body} ----\n{read(spec.body, kernel_dir=kernel_dir)}"
    return header, source


def mlx_name(kernel: str, *, kernel_dir: str | Path | None = None) -> str:
    """A name to give MLX for ``kernel`` composed from ``kernel_dir``.

    MLX keys its compiled custom kernels by name and template values only (in the
    process, and for CUDA also on disk under ``MLX_PTX_CACHE_DIR``), so two sources under
    one name would both run whichever was compiled first. The repository's own kernels
    keep their plain name (``KERNELS[kernel].name``); another folder's get a digest of
    their composed text appended, which differs whenever the text does.
    """
    spec = _check_kernel(kernel)
    if kernel_dir is None or _folder(kernel_dir) == KERNEL_DIR:
        return spec.name
    text = "".join("".join(compose(d, kernel, kernel_dir=kernel_dir)) for d in DIALECTS)
    return f"{spec.name}_{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def source_files(*, kernel_dir: str | Path | None = None) -> tuple[str, ...]:
    """The files whose text is the kernels, sorted: the preludes, ``common.h`` and every
    ``*.body`` in ``kernel_dir`` (default: the repository's ``kernels/``); not its README
    or the Metal emulation's runtime."""
    folder = _folder(kernel_dir)
    return tuple(sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in (".h", ".body")))


def fingerprint(*, kernel_dir: str | Path | None = None) -> str:
    """12 hex digits of SHA-256 over the kernels' text (:func:`source_files`, each file's
    name and bytes, read now). Every bench record carries it (``bench.common.record.provenance``:
    ``kernel_text``), so a sanitizer run or a timing can be matched with the text it ran:
    a clean run of other text says nothing about this one."""
    folder = _folder(kernel_dir)
    digest = hashlib.sha256()
    for name in source_files(kernel_dir=folder):
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


#: One token of C-family text that :func:`compact` must see whole: a string or character
#: literal (a ``//`` inside one is not a comment), a comment, or any other character.
_C_TOKEN = re.compile(r""""(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|//[^\n]*|/\*.*?\*/|[^"'/]+|.""", re.S)


def compact(text: str) -> str:
    """``text`` (C, C++, CUDA or Metal) with its comments, indentation, trailing spaces and
    blank lines taken out: the same tokens, in the same order, one line of code where there
    was one (so a preprocessor directive stays on a line of its own).

    Why: MLX 0.32's CUDA custom kernel rebuilds the whole source string on every call and
    hashes it on every evaluation of every launch (``mlx/backend/cuda/custom_kernel.cpp``:
    ``build_kernel`` in the call, ``std::hash<std::string>`` of the source in ``eval_gpu``),
    so a decode step pays for the source's length once a launch, on the host. The composed
    kernels are about half comments; the CUDA launches hand MLX this form of
    :func:`compose`'s and :func:`compose_one_launch`'s text (:func:`cuda_launch_text`). A
    blank line after a line that ends in a backslash is kept: it ends a macro.
    """
    out: list[str] = []
    for tok in _C_TOKEN.findall(text):
        if tok.startswith("//"):
            continue
        if tok.startswith("/*"):
            out.append(" " if "\n" not in tok else "\n")  # a comment separates tokens; a multi-line one, lines
            continue
        out.append(tok)
    lines: list[str] = []
    for line in "".join(out).split("\n"):
        line = line.strip()
        if line or (lines and lines[-1].endswith("\\")):
            lines.append(line)
    return "\n".join(lines) + "\n"


def header_folder() -> Path:
    """Where :func:`cuda_launch_text` keeps the CUDA headers it writes: a folder of this
    user's in the system's temporary folder (the files are derived from ``kernels/`` and
    rewritten whenever they are missing; nothing else is kept there)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"workbench-cuda-headers-{uid}"


def cuda_launch_text(header: str, source: str) -> tuple[str, str]:
    """What a CUDA launch hands ``mx.fast.cuda_kernel`` for a composed ``(header, source)``:
    the source without comments (:func:`compact`), and for the header one line,
    ``#include "<file>"``, naming a file that holds the header without comments.

    Why: MLX 0.32's CUDA custom kernel hashes its whole text on every launch (see
    :func:`compact`), about 0.2 us a kB on the H200's host (``experiments.launch_host_cost``),
    and the header (the prelude and ``common.h``) is most of the text. NVRTC reads the file
    once, when MLX first compiles the kernel. The file is named by a digest of its text, so
    two texts never share a name, MLX's compiled-module cache (keyed by the text, include line
    and all) never serves an old header, and a file already there with the same text is
    kept as it is. Raises ``ValueError`` if the folder's path cannot be written in an
    ``#include`` line (a double quote or a line break in it).
    """
    text = compact(header)
    folder = header_folder()
    if any(c in str(folder) for c in '"\n\r'):
        raise ValueError(
            f"the CUDA header folder {str(folder)!r} has a character an #include line cannot hold; "
            "set TMPDIR to a folder whose path has no double quote or line break"
        )
    path = folder / f"kernels_{hashlib.sha256(text.encode()).hexdigest()[:16]}.cuh"
    try:
        same = path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):  # missing, unreadable or not text: written anew
        same = False
    if not same:
        files.write_atomic(path, text)
    return f'#include "{path}"\n', compact(source)


#: MLX 0.32's names for the CUDA types of array dtypes (``dtype_to_cuda_type``).
CUDA_TYPES: dict[str, str] = {
    "float32": "float",
    "bfloat16": "__nv_bfloat16",
    "float16": "__half",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int32": "int32_t",
    "uint32": "uint32_t",
}


def _template_line(name: str, value: object) -> str:
    if isinstance(value, bool):
        return f"  constexpr bool {name} = {'true' if value else 'false'};\n"
    if isinstance(value, int):
        return f"  constexpr int {name} = {value};\n"
    return f"  using {name} = {CUDA_TYPES[str(value)]};\n"


# -- the tail in one launch (CUDA only) -----------------------------------------------


#: The one-launch tail's body: the three tail phases between grid-wide barriers.
ONE_LAUNCH_BODY = "tail_one_launch.body"

#: MLX's name for the one-launch tail (composed from the repository's kernels).
ONE_LAUNCH_NAME = "fat_tail_one_launch"


#: The one launch's epilogue that also writes the next layer's input norm (:func:`compose_one_launch`).
NEXT_NORM_BODY = "next_norm.body"

#: The line of ``tail_one_launch.body`` that the epilogue replaces (and that is dropped without it).
NEXT_NORM_MARK = "//== epilogue next_norm =="


def _one_launch_name(next_norm: bool) -> str:
    return ONE_LAUNCH_NAME + ("_next_norm" if next_norm else "")


def one_launch_mlx_name(*, kernel_dir: str | Path | None = None, next_norm: bool = False) -> str:
    """:data:`ONE_LAUNCH_NAME` for the repository's kernels (``_next_norm`` appended for the
    launch with the next norm's epilogue); another folder's one launch gets a digest of its
    composed text appended, as :func:`mlx_name` names another folder's launches (MLX keys
    compiled kernels by name and template values only)."""
    base = _one_launch_name(next_norm)
    if kernel_dir is None or _folder(kernel_dir) == KERNEL_DIR:
        return base
    text = "".join(compose_one_launch(kernel_dir=kernel_dir, next_norm=next_norm))
    return f"{base}_{hashlib.sha256(text.encode()).hexdigest()[:10]}"


#: Each phase of the one-launch tail: its launch, and the prefix its template values take
#: in the one launch (``WO_FMT`` is wo's ``FMT``; inside the phase it is bound to ``FMT``).
ONE_LAUNCH_PHASES: tuple[tuple[str, str], ...] = (("wo_residual", "WO_"), ("ffn_gate_up", "GU_"), ("ffn_down", "DN_"))

#: What the phases pass each other through the launch's own memory (``work``), not as
#: inputs or outputs: h (wo's output, read by gate_up and down as ``hin``) and act.
_ONE_LAUNCH_INTERNAL = frozenset({"h", "hin", "act"})


def one_launch_inputs(*, next_norm: bool = False) -> tuple[str, ...]:
    """The one-launch tail's inputs, in the order its launch passes them: the three
    launches' inputs (each once, h and act left out: they live in ``work``), with
    ``next_norm`` the next norm's ``next_nw``, then ``work`` and ``after``."""
    names: list[str] = []
    for kernel, _ in ONE_LAUNCH_PHASES:
        names += [n for n in KERNELS[kernel].inputs if n not in _ONE_LAUNCH_INTERNAL and n not in names]
    if next_norm:
        names.append("next_nw")
    return (*names, "work", "after")


def one_launch_outputs(*, next_norm: bool = False) -> tuple[str, ...]:
    """The one-launch tail's outputs: ``out``, and with ``next_norm`` also ``nxt`` (the next
    layer's input norm of ``out``, ``next_norm.body``)."""
    return ("out", "nxt") if next_norm else ("out",)


def one_launch_template() -> tuple[str, ...]:
    """The one-launch tail's template names: NT, HID, FFN, SYNC_AT, BARRIER_LIMIT_MS, then
    every phase's own template values (NT aside) under its prefix."""
    names = ["NT", "HID", "FFN", "SYNC_AT", "BARRIER_LIMIT_MS"]
    for kernel, prefix in ONE_LAUNCH_PHASES:
        names += [prefix + t for t in KERNELS[kernel].template if t != "NT"]
    return tuple(names)


def _phase(kernel: str, prefix: str, kernel_dir: str | Path | None) -> str:
    """One phase of the one-launch tail: the launch's body in a scope of its own, its
    template values bound to the names the body uses, h read as ``hin``; ffn_down's body
    (one group's DR rows) in a loop over the row groups this group takes."""
    spec = KERNELS[kernel]
    binds = "".join(f"  constexpr auto {t} = {prefix}{t};\n" for t in spec.template if t != "NT")
    body = read(spec.body, kernel_dir=kernel_dir)
    hin = "  const float* hin = h;\n" if "hin" in spec.inputs else ""
    if kernel == "ffn_down":
        body = (
            "  for (int row_group = gid; row_group < HID / DR; row_group += ngroups) {\n"
            "  const int gid = row_group;  // the body's group index: the row group it takes\n"
            f"{body}  }}\n"
        )
    return f"  {{  // ---- phase: {spec.body} ----\n{hin}{binds}{body}  }}\n"


def compose_one_launch(*, kernel_dir: str | Path | None = None, next_norm: bool = False) -> tuple[str, str]:
    """``(header, source)`` of the one-launch tail for ``mx.fast.cuda_kernel``: CUDA's
    prelude and common.h as for the three launches; the body is ``tail_one_launch.body``
    with each ``//== phase NAME ==`` line replaced by that launch's body (:func:`_phase`),
    and its ``//== epilogue next_norm ==`` line by ``next_norm.body`` where ``next_norm``
    (the launch then also takes ``next_nw`` and writes ``nxt``: :func:`one_launch_inputs`),
    else dropped. CUDA only: Metal promises no forward progress between threadgroups, so a
    grid barrier could wait forever there (kernels/README.md)."""
    head, body_part = prelude("cuda", kernel_dir=kernel_dir)
    common = read("common.h", kernel_dir=kernel_dir)
    header = f"// ---- prelude (cuda) ----\n{head}\n// ---- common.h ----\n{common}\n"
    lines = []
    marked = False
    for line in read(ONE_LAUNCH_BODY, kernel_dir=kernel_dir).splitlines(keepends=True):
        m = line.strip()
        if m == NEXT_NORM_MARK:
            marked = True
            if next_norm:
                lines.append(
                    f"  {{  // ---- epilogue: {NEXT_NORM_BODY} ----\n"
                    f"{read(NEXT_NORM_BODY, kernel_dir=kernel_dir)}  }}\n"
                )
        elif m.startswith("//== phase ") and m.endswith(" =="):
            kernel = m[len("//== phase ") : -3].strip()
            prefix = dict(ONE_LAUNCH_PHASES).get(kernel)
            if prefix is None:
                raise ValueError(
                    f"{ONE_LAUNCH_BODY}: unknown phase {kernel!r}; the phases are {[k for k, _ in ONE_LAUNCH_PHASES]}"
                )
            lines.append(_phase(kernel, prefix, kernel_dir))
        else:
            lines.append(line)
    if next_norm and not marked:
        raise ValueError(
            f"{ONE_LAUNCH_BODY}: has no {NEXT_NORM_MARK!r} line, so this kernel folder's one launch "
            "cannot carry the next norm; use next_norm=False"
        )
    return header, f"{body_part}\n  // ---- {ONE_LAUNCH_BODY} ----\n{''.join(lines)}"


def _translation_unit(
    name: str,
    header: str,
    source: str,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    input_dtypes: dict[str, str],
    template_names: tuple[str, ...],
    template: dict[str, object],
) -> str:
    missing = [n for n in inputs if n not in input_dtypes]
    if missing:
        raise ValueError(f"input_dtypes must name every input of {name}; missing {missing}")
    absent = [t for t in template_names if t not in template]
    if absent:
        raise ValueError(f"template must give every template value of {name}; missing {absent}")
    args = [f"    const {CUDA_TYPES[input_dtypes[n]]}* {n}" for n in inputs]
    args += [f"    float* {n}" for n in outputs]
    consts = "".join(_template_line(k, template[k]) for k in template_names)
    return (
        "#include <cstdint>\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cooperative_groups.h>\n"
        f"{header}namespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n"
        f"__global__ void custom_kernel_{name}(\n" + ",\n".join(args) + ") {\n"
        f"{consts}\n{source}\n}}\n\n}} // namespace mlx::core::cu\n"
    )


def input_dtypes(names: tuple[str, ...] | list[str], fmt: int, sfmt: int) -> dict[str, str]:
    """The MLX dtype of each named kernel input for weights of kernel code ``fmt``
    (``workbench.fold.formats``: a ``Format``'s ``code``) with scales of code ``sfmt``
    (``formats.SCALE_CODES``), as the launches pass them: weights float32, bfloat16 or
    uint32 words; scales and affine biases in their format (uint8 for E8M0 and E4M3); the
    fp4 formats' absent biases and every dense format's scales a float32 dummy; ``sdest``
    int32, ``table`` int8, the rest float32. For a standalone translation unit
    (:func:`cuda_translation_unit`), which names each input's type."""
    import re

    codes = sorted({f.code for f in formats.KERNEL_FORMATS})
    if isinstance(fmt, bool) or fmt not in codes:
        raise ValueError(f"fmt: must be a kernel format code {codes} (a Format's code), got {fmt!r}")
    fmt_ = formats.by_code(fmt)[0]  # formats sharing a code share how their arrays are stored
    scales = {
        formats.SCALE_CODES["float32"]: "float32",
        formats.SCALE_CODES["bfloat16"]: "bfloat16",
        formats.SCALE_CODES["e8m0"]: "uint8",
        formats.SCALE_CODES["e4m3"]: "uint8",
    }
    if sfmt not in scales:
        raise ValueError(f"sfmt: must be a scale code of formats.SCALE_CODES {formats.SCALE_CODES}, got {sfmt!r}")
    weight = fmt_.name if not fmt_.quantized else "uint32"
    biased = fmt_.mode == "affine"  # the microscaling formats carry no biases
    out = {}
    for n in names:
        if n in ("w", "wg", "wu", "wd", "q_w", "k_w", "v_w"):
            out[n] = weight
        elif n in ("ws", "wgs", "wus", "wds") or re.fullmatch(r"[qkv]_s", n):
            out[n] = scales[sfmt] if fmt_.quantized else "float32"
        elif n in ("wb", "wgb", "wub", "wdb") or re.fullmatch(r"[qkv]_b", n):
            out[n] = scales[sfmt] if biased else "float32"
        else:
            out[n] = {"sdest": "int32", "table": "int8"}.get(n, "float32")
    return out


def one_launch_translation_unit(
    input_dtypes: dict[str, str],
    template: dict[str, object],
    *,
    kernel_dir: str | Path | None = None,
    next_norm: bool = False,
) -> str:
    """The CUDA file MLX would compile for the one-launch tail, standalone (for ``nvcc -c``):
    as :func:`cuda_translation_unit` for the three launches (``next_norm``: with the next
    norm's epilogue, its input and output)."""
    header, source = compose_one_launch(kernel_dir=kernel_dir, next_norm=next_norm)
    return _translation_unit(
        _one_launch_name(next_norm),
        header,
        source,
        one_launch_inputs(next_norm=next_norm),
        one_launch_outputs(next_norm=next_norm),
        input_dtypes,
        one_launch_template(),
        template,
    )


def cuda_translation_unit(
    kernel: str, input_dtypes: dict[str, str], template: dict[str, object], *, kernel_dir: str | Path | None = None
) -> str:
    """The CUDA file MLX would compile for ``kernel``, standalone (for ``nvcc -c`` on a machine without a GPU).

    MLX's default header includes its own ``utils.cuh``; here ``<cuda_bf16.h>``,
    ``<cuda_fp16.h>`` and ``<cstdint>`` stand in for it. The signature (const inputs,
    then outputs) and the template constants are written as MLX 0.32's CUDA
    ``build_kernel`` writes them. ``input_dtypes`` maps each input to a dtype name
    (``float32``, ``bfloat16``, ``int8``, ...); outputs are float32. ``kernel_dir``: as for
    :func:`compose`.
    """
    spec = _check_kernel(kernel)
    header, source = compose("cuda", kernel, kernel_dir=kernel_dir)
    return _translation_unit(
        spec.name, header, source, spec.inputs, spec.outputs, input_dtypes, spec.template, template
    )
