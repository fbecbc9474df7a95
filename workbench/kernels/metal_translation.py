"""MLX's generated Metal source made a C++ translation unit clang compiles for the emulator.

The complete Metal source MLX generates for a launch is C++ apart from two pieces of syntax,
so mechanical rewrites (:func:`translation_unit`) make it compile as C++17 against the
stand-in ``<metal_stdlib>``: a function-scope ``threadgroup T name[N];`` becomes a reference
to the group's array the emulator allocates (C++ has no automatic variables in another
address space); MLX's instantiation line loses its two attribute lists (C++ allows none
there); and bfloat loses its address spaces (the stand-in's bfloat is a class, see
:func:`_bfloat_default_space`). Then an ``extern "C"`` entry is appended that calls the
kernel with the launch's buffers and the thread's ids, by the names in MLX's generated
signature (:func:`signature`). Text only: no compiler, no process state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: Metal's thread attributes (MSL spec 5.2.3.6) -> the C expressions of the emulator's
#: per-thread ids, x, y and z (``runtime.c``, ``start_group``, says how each is counted).
_ATTRIBUTES: dict[str, tuple[str, str, str]] = {
    "thread_position_in_threadgroup": ("t->tpitg[0]", "t->tpitg[1]", "t->tpitg[2]"),
    "threadgroup_position_in_grid": ("t->tgpig[0]", "t->tgpig[1]", "t->tgpig[2]"),
    "threadgroups_per_grid": ("t->tpg[0]", "t->tpg[1]", "t->tpg[2]"),
    "threads_per_threadgroup": ("t->tptg[0]", "t->tptg[1]", "t->tptg[2]"),
    "dispatch_threads_per_threadgroup": ("t->dtptg[0]", "t->dtptg[1]", "t->dtptg[2]"),
    "thread_position_in_grid": ("t->tpig[0]", "t->tpig[1]", "t->tpig[2]"),
    "threads_per_grid": ("t->tpgrid[0]", "t->tpgrid[1]", "t->tpgrid[2]"),
    "thread_index_in_simdgroup": ("t->simd_lane", "0u", "0u"),
    "simdgroup_index_in_threadgroup": ("t->simd_group", "0u", "0u"),
    "simdgroups_per_threadgroup": ("t->nsimd", "0u", "0u"),
    "threads_per_simdgroup": ("32u", "0u", "0u"),
    "thread_execution_width": ("32u", "0u", "0u"),
    "thread_index_in_threadgroup": ("t->tindex", "0u", "0u"),
}


class MetalCompileError(ValueError):
    """The Metal source does not compile against the stand-in header (clang's message attached)."""


#: Metal built-ins the stand-in header does not emulate, each refused by name before clang
#: runs (:func:`refuse_not_emulated`), so a valid kernel is never told it is the user's
#: mistake. kernels/README.md ("Metal on the CPU") lists what is emulated.
NOT_EMULATED: tuple[str, ...] = (
    "simd_and",
    "simd_or",
    "simd_xor",
    "simd_shuffle_rotate_up",
    "simd_shuffle_rotate_down",
    "simd_shuffle_and_fill_up",
    "simd_shuffle_and_fill_down",
    "simd_prefix_inclusive_product",
    "simd_prefix_exclusive_product",
    "quad_sum",
    "quad_shuffle",
    "quad_shuffle_xor",
    "quad_broadcast",
    "simdgroup_matrix",
    "simdgroup_load",
    "simdgroup_store",
    "simdgroup_multiply_accumulate",
    "texture1d",
    "texture2d",
    "texture3d",
    "sampler",
    "atomic_thread_fence",
)

_NOT_EMULATED = re.compile(r"\b(" + "|".join(NOT_EMULATED) + r")\b")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def refuse_not_emulated(source: str) -> None:
    """Raise :class:`MetalCompileError` naming the first built-in of :data:`NOT_EMULATED` the
    source uses (comments aside), and its line."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), source)
    m = _NOT_EMULATED.search(text)
    if m is not None:
        line = text.count("\n", 0, m.start()) + 1
        raise MetalCompileError(
            f"`{m.group(1)}` (line {line}) is a Metal built-in not emulated by the workbench; "
            "kernels/README.md, 'Metal on the CPU', lists what is"
        )


_INSTANTIATION = re.compile(r"template\s*\[\[host_name\([^)]*\)\]\]\s*\[\[kernel\]\]\s*decltype")
_KERNEL = re.compile(r"\[\[kernel\]\]\s*void\s+(\w+)\s*\((.*?)\)\s*\{", re.S)
_PARAM = re.compile(r"^(?P<type>.+?)\s*(?P<name>\w+)\s*\[\[(?P<attr>\w+)(?:\((?P<index>\d+)\))?\]\]$", re.S)


def _group_memory_rewrite(body: str, qualifiers: Sequence[str]) -> str:
    """Rewrite 1: each ``threadgroup T name[N]...;`` statement -> a reference to the
    group's array from the emulator (``qualifiers``: ``threadgroup`` and every macro the
    source defines as it)."""
    pattern = re.compile(
        r"^(?P<indent>[ \t]*)(?:"
        + "|".join(map(re.escape, qualifiers))
        + r")\s+(?P<type>[\w:<>, ]+?)\s+(?P<name>\w+)\s*(?P<dims>(?:\[[^\]\n]+\])+)\s*;",
        re.M,
    )

    def sub(m: re.Match[str]) -> str:
        t, n, d = m.group("type"), m.group("name"), m.group("dims")
        a = f"metal_emulation_array_{n}"  # a typedef: `float4 (` would call float4's constructor macro
        space = "" if re.fullmatch(r"(?:const\s+)?(?:bfloat16_t|bfloat)", t) else "threadgroup "  # rewrite 3
        return (
            f"{m.group('indent')}typedef {t} {a}{d}; {space}{a}& {n} = *({space}{a}*)"
            f'metal_emulation_threadgroup_alloc(sizeof({a}), alignof({t}), "{n}");'
        )

    return pattern.sub(sub, body)


@dataclass(frozen=True)
class Param:
    """One parameter of MLX's generated kernel signature."""

    type: str
    name: str
    attribute: str
    buffer: int | None


def signature(source: str) -> tuple[str, list[Param], str]:
    """``(kernel name, parameters, template arguments)`` of the generated Metal source."""
    m = _KERNEL.search(source)
    if m is None:
        raise MetalCompileError(
            "the source has no `[[kernel]] void name(...)` signature (is it MLX's generated source?)"
        )
    params = []
    for text in _split_params(m.group(2)):
        p = _PARAM.match(text.strip())
        if p is None:
            raise MetalCompileError(f"cannot read the kernel parameter {text.strip()!r}")
        index = p.group("index")
        params.append(
            Param(p.group("type").strip(), p.group("name"), p.group("attr"), None if index is None else int(index))
        )
    inst = re.search(r"decltype\(\s*" + re.escape(m.group(1)) + r"\s*<(.*?)>\s*\)", source, re.S)
    return m.group(1), params, "" if inst is None else inst.group(1)


def _split_params(text: str) -> list[str]:
    """The signature's parameters: split at the commas outside brackets."""
    out: list[str] = []
    depth, cur = 0, []
    for ch in text:
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        depth += ch in "<(["
        depth -= ch in ">)]"
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def _entry(name: str, params: list[Param], targs: str) -> str:
    """The ``extern "C"`` entry the emulator calls for each thread."""
    args = []
    for p in params:
        if p.attribute == "buffer":
            if p.type.endswith("&"):
                args.append(f"*({p.type[:-1].strip()}*)b[{p.buffer}]")
            else:
                args.append(f"({p.type})b[{p.buffer}]")
        elif p.attribute in _ATTRIBUTES:
            x, y, z = _ATTRIBUTES[p.attribute]
            if p.type.endswith("3"):
                args.append(f"{p.type}({x}, {y}, {z})")
            elif p.type.endswith("2"):
                args.append(f"{p.type}({x}, {y})")
            else:
                args.append(f"({p.type})({x})")
        else:
            raise MetalCompileError(f"the kernel parameter attribute [[{p.attribute}]] is not emulated")
    call = f"{name}<{targs}>" if targs else name
    return (
        "\nstruct metal_emulation_ids {\n  unsigned tpitg[3], tgpig[3], tpg[3];\n"
        "  unsigned simd_lane, simd_group, tptg[3];\n  unsigned tpig[3], tpgrid[3], tindex, nsimd, dtptg[3];\n};\n"
        'extern "C" void metal_emulation_entry(void* const* b, const metal_emulation_ids* t) {\n'
        f"  {call}(\n    " + ",\n    ".join(args) + ");\n}\n"
    )


def _bfloat_default_space(source: str, qualifiers: Sequence[str]) -> str:
    """Rewrite 3: ``device bfloat16_t`` -> ``bfloat16_t`` (and ``constant``, ``threadgroup``, and
    every macro the source defines as ``threadgroup``), ``const`` kept: the stand-in's bfloat
    is a class, whose member functions clang cannot call on an object in another address
    space, so bfloat buffers, pointers and arrays stay in the default one (kernels/README.md,
    "Metal on the CPU"; rewrite 1 has already made a group's bfloat array shared)."""
    spaces = "|".join(map(re.escape, ("device", "constant", *qualifiers)))
    pattern = re.compile(rf"\b(?:{spaces})\s+((?:const\s+)?)(bfloat16_t|bfloat)\b")
    return pattern.sub(r"\1\2", source)


def translation_unit(source: str) -> str:
    """The C++ file clang compiles for MLX's generated Metal ``source``: the stand-in
    header, the source with the three rewrites, and the emulator's entry."""
    refuse_not_emulated(source)
    qualifiers = ["threadgroup"] + re.findall(r"^\s*#\s*define\s+(\w+)\s+threadgroup\s*$", source, re.M)
    name = signature(source)[0]
    start = source.index("[[kernel]] void " + name)
    body = source[:start] + _group_memory_rewrite(source[start:], qualifiers)
    body = _bfloat_default_space(_INSTANTIATION.sub("template decltype", body), qualifiers)
    name, params, targs = signature(body)
    return '#include <metal_stdlib>\n#line 1 "metal_source"\n' + body + "\n" + _entry(name, params, targs)
