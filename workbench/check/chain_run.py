"""Check a chain of parts as the engine launches them: the user's chain against the chained
float64 truth, each link's error beside the workbench's float32 reference chain's.

The truth runs each link's float64 oracle on the truth's own previous outputs; the reference
runs each link's float32 reference on the reference's previous outputs; the subject is either
ONE implementation (a callable handed a :class:`~workbench.check.chain_wiring.ChainCase`,
returning every link's outputs) or one callable a link, run in sequence, each handed the
user's previous link's outputs (a :class:`~workbench.check.chain_wiring.LinkCase`), so an
error compounds down the chain as it does in the engine, and the reference's compounds the
same way. A link's error on a case is the worst scaled error ``|x - y| / max(|y|, 1)`` over
its output tensors against the truth's (float64); the paired sign test
(:mod:`workbench.check.verdict`) asks, link by link, whether the subject's errors are those of
a correct float32 chain beside the reference's on the same cases (level ``ALPHA`` over the
links and scales together), and the first link that fails is named: the links after it read
its error, so they may fail for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check.chain_forms import link_callable
from workbench.check.chain_links import ChainDims
from workbench.check.chain_report import ChainReport
from workbench.check.chain_wiring import (
    Chain,
    ChainCase,
    LinkCase,
    Wired,
    check_case,
    draw_case,
    link_inputs,
    wire,
)
from workbench.check.gdn_cases import GATES
from workbench.check.stored import as_numpy
from workbench.check.subjects import SubjectError
from workbench.studies.cases import check_seeds

#: The input scales of the chain's inputs swept by default: at 0.01 an RMS norm's eps is
#: of the size of the mean square (eps outside the root shows), at 1 it is not.
CHAIN_SCALES: tuple[float, ...] = (0.01, 1.0)

#: The recurrent state's magnitudes swept by default (a running sequence's).
CHAIN_STATE_SCALES: tuple[float, ...] = (1.0,)

#: The step's gate regime by default (``gdn_cases.GATES``).
CHAIN_GATES: tuple[str, ...] = ("typical",)

#: Marks a link the workbench's float32 reference runs in a chain given a callable a link.
REFERENCE = "reference"


def _fresh(a: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Copies handed to the user's code: what it writes in place cannot reach the truth."""
    return {k: np.array(v, np.float32) for k, v in a.items()}


def returned_outputs(w: Wired, value: Any) -> dict[str, np.ndarray]:
    """``value`` (a tuple in the link's output order, a mapping by name, or for one output
    the array alone) as float32 numpy by name, or a :class:`SubjectError` naming the link,
    its part and the tensor that is missing, not an array, of the wrong shape or dtype."""
    names = w.link.outputs
    if isinstance(value, Mapping):
        extra = sorted(set(map(str, value)) - set(names))
        missing = [n for n in names if n not in value]
        if extra or missing:
            raise SubjectError(
                f"{w.label}: returned tensors {sorted(map(str, value))}, expected exactly {list(names)}"
                + (f" (missing {missing})" if missing else "")
                + (f" (not this link's: {extra})" if extra else "")
            )
        items = [value[n] for n in names]
    elif isinstance(value, (tuple, list)):
        if len(value) != len(names):
            raise SubjectError(f"{w.label}: returned {len(value)} tensors, expected {len(names)}: {', '.join(names)}")
        items = list(value)
    elif len(names) == 1:
        items = [value]
    else:
        raise SubjectError(f"{w.label}: returned {validate.describe(value)}, expected ({', '.join(names)})")
    out = {}
    for n, v in zip(names, items):
        a = as_numpy(v)
        dtype = str(getattr(v, "dtype", "")).removeprefix("mlx.core.").removeprefix("torch.")
        if a is None:
            raise SubjectError(f"{w.label}, tensor {n}: returned {validate.describe(v)}, not an array")
        if tuple(a.shape) != w.shapes[n]:
            raise SubjectError(f"{w.label}, tensor {n}: returned shape {tuple(a.shape)}, expected {w.shapes[n]}")
        if dtype != "float32":
            raise SubjectError(f"{w.label}, tensor {n}: returned dtype {dtype}, expected float32")
        out[n] = a
    return out


def _shown(f: Any) -> str:
    """How the report names what ran a link: a function's name, a form's ``name``."""
    if f is None:
        return REFERENCE
    return str(getattr(f, "__name__", None) or getattr(f, "name", None) or type(f).__name__)


def _subject(subject: Any, chain: Chain) -> tuple[str, Any, list[str]]:
    """``("one", fn, [])`` for one implementation, ``("links", [fn or None a link], names)``
    for one a link (a part's form made the link's callable: :mod:`workbench.check.chain_forms`)."""
    names = chain.names
    bases = tuple(w.link.name for w in chain.links)
    if callable(subject) and not isinstance(subject, (Mapping, Sequence)):
        return "one", subject, []
    if isinstance(subject, Mapping):
        # a link's name gives every occurrence of it; a label (gdn@2) one occurrence, first
        unknown = sorted(set(map(str, subject)) - set(names) - set(bases))
        if unknown:
            raise ValueError(f"subject: names links {unknown} not in the chain {list(names)}")
        subject = [subject[n] if n in subject else subject.get(b) for n, b in zip(names, bases)]
    if isinstance(subject, Sequence) and not isinstance(subject, str):
        if len(subject) != len(names):
            raise ValueError(
                f"subject: one callable (or None) a link, {len(names)} for {list(names)}, got {len(subject)}"
            )
        fns = [None if f is None else link_callable(b, f, chain.dims) for b, f in zip(bases, subject)]
        return "links", fns, [_shown(f) for f in subject]
    raise ValueError(
        "subject: must be a callable (ChainCase -> every link's outputs), or one callable (or None: the "
        f"reference) a link, as a sequence or a mapping by link name, got {validate.describe(subject)}"
    )


def chained_outputs(chain: Chain, case: ChainCase, *, truth: bool) -> list[dict[str, np.ndarray]]:
    """Every link's outputs on ``case``: the float64 oracles chained (``truth``) or the float32
    references; a case that is not the chain's is a ValueError naming link, part and tensor."""
    if not isinstance(chain, Chain):
        raise ValueError(f"chain: must be a Chain (workbench.check.wire), got {validate.describe(chain)}")
    check_case(chain, case)
    x: Mapping[str, np.ndarray] = {k: v.astype(np.float64) for k, v in case.inputs.items()} if truth else case.inputs
    outs: list[dict[str, np.ndarray]] = []
    for w in chain.links:
        run = w.link.oracle if truth else w.link.reference
        got = run(case.weights[w.name], link_inputs(w, x, outs), chain.dims)
        outs.append(dict(zip(w.link.outputs, got)))
    return outs


def _evaluated(value: Any) -> Any:
    """``value`` with every MLX array in it (a link's outputs, nested one or two deep)
    evaluated: MLX records a graph on the calling thread's stream, so the worker that made
    it evaluates it, and the check's thread reads finished arrays."""
    leaves, todo = [], [value]
    for _ in range(3):
        nxt = []
        for v in todo:
            if isinstance(v, mx.array):
                leaves.append(v)
            elif isinstance(v, Mapping):
                nxt += list(v.values())
            elif isinstance(v, (tuple, list)):
                nxt += list(v)
        todo = nxt
    if leaves:
        mx.eval(*leaves)
    return value


def _call(caller: Callable[..., Any] | None, fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)`` (under the time limit when ``caller`` is a ``LimitedCaller``), evaluated;
    a call past the limit raises ``TimeoutError``, the user's own error is raised as is."""
    if caller is None:
        return _evaluated(fn(arg))
    o = caller(lambda: _evaluated(fn(arg)))
    if o.timed_out:
        raise TimeoutError(f"took over {caller.seconds:g} s (time_limit)")
    if o.error is not None:
        raise o.error
    return o.value


def _subject_run(
    chain: Chain, case: ChainCase, kind: str, fn: Any, problems: list[str], caller: Any = None
) -> list[dict | None]:
    """The subject's outputs a link (None for a link that gave nothing usable, and, in a
    chain a link, for every link after it: it has nothing to read)."""
    outs: list[dict | None] = [None] * len(chain.links)
    where = f"case {case.case}"
    if kind == "one":
        try:
            given = ChainCase(_fresh(case.inputs), {k: _fresh(v) for k, v in case.weights.items()}, *_rest(case))
            value = _call(caller, fn, given)
        except Exception as e:
            problems.append(f"chain {','.join(chain.names)}, {where}: raised {type(e).__name__}: {e}")
            return outs
        if isinstance(value, Mapping):
            if sorted(map(str, value)) != sorted(chain.names):
                problems.append(
                    f"chain {','.join(chain.names)}, {where}: returned links {sorted(map(str, value))}, "
                    f"expected one entry a link: {list(chain.names)}"
                )
                return outs
            values = [value[n] for n in chain.names]
        elif isinstance(value, (tuple, list)) and len(value) == len(chain.links):
            values = list(value)
        else:
            problems.append(
                f"chain {','.join(chain.names)}, {where}: returned {validate.describe(value)}, expected "
                f"one entry a link ({', '.join(chain.names)}), by name or in order"
            )
            return outs
        for i, w in enumerate(chain.links):
            try:
                outs[i] = returned_outputs(w, values[i])
            except SubjectError as e:
                problems.append(f"{e}, {where}")
        return outs
    for i, w in enumerate(chain.links):
        x = link_inputs(w, case.inputs, outs)
        try:
            if fn[i] is None:
                got = w.link.reference(case.weights[w.name], x, chain.dims)
                outs[i] = dict(zip(w.link.outputs, got))
            else:
                lc = LinkCase(w.name, _fresh(x), _fresh(case.weights[w.name]), chain.dims, case.case)
                outs[i] = returned_outputs(w, _call(caller, fn[i], lc))
        except SubjectError as e:
            problems.append(f"{e}, {where}")
            break
        except Exception as e:
            problems.append(f"{w.label}, {where}: raised {type(e).__name__}: {e}")
            break
    return outs


def _rest(case: ChainCase) -> tuple:
    return case.links, case.dims, case.case


def scaled_error(x: np.ndarray | None, y: np.ndarray) -> float:
    """``max |x - y| / max(|y|, 1)`` in float64 (NaN when ``x`` is missing or not finite)."""
    if x is None:
        return float("nan")
    d = np.abs(np.asarray(x, np.float64) - y) / np.maximum(np.abs(y), 1.0)
    return float(d.max()) if np.isfinite(d).all() else float("nan")


def link_errors(chain: Chain, outs: Sequence[Mapping[str, np.ndarray] | None], truth: Sequence[Mapping]) -> list[dict]:
    """A link's scaled error a tensor (``outs``: each link's outputs, or None) against the truth's."""
    return [
        {n: scaled_error(None if o is None else o[n], t[n]) for n in w.link.outputs}
        for w, o, t in zip(chain.links, outs, truth)
    ]


def _conditions(scales: Any, gates: Any, state_scales: Any) -> list[tuple[float, str, float]]:
    sc = [
        float(validate.number("scales", s, minimum=0, exclusive_minimum=True))
        for s in validate.sequence("scales", scales, what="positive numbers")
    ]
    gs = validate.sequence("gates", gates, what=f"gate regimes of {tuple(GATES)}")
    for g in gs:
        validate.one_of("gates", g, tuple(GATES))
    ss = [
        float(validate.number("state_scales", s, minimum=0))
        for s in validate.sequence("state_scales", state_scales, what="numbers >= 0")
    ]
    return [(s, g, st) for s in sc for g in gs for st in ss]


def check_chain(
    subject: Callable[[ChainCase], Any] | Sequence[Any] | Mapping[str, Any] | None,
    links: Any = ("tail", "gdn_in", "gdn"),
    *,
    dims: ChainDims | None = None,
    seeds: Iterable[int] = range(30),
    scales: Sequence[float] = CHAIN_SCALES,
    gates: Sequence[str] = CHAIN_GATES,
    state_scales: Sequence[float] = CHAIN_STATE_SCALES,
    tolerance: float | None = None,
    time_limit: float | None = 30.0,
    name: str = "",
) -> ChainReport:
    """Check ``subject`` as the chain ``links`` (names of ``chain_links.LINK_NAMES`` in launch
    order, or a comma-separated str) at ``dims`` (a tiny config by default), a case per seed
    and condition (``scales`` of the chain's inputs x ``gates`` of the step's constants x
    ``state_scales`` of the recurrent state).

    ``subject``: ONE implementation, ``fn(ChainCase) -> {link: outputs}`` (or a list in link
    order; a link's outputs a tuple in its order, a mapping by tensor name, or for the tail
    the array alone); or one callable a link, ``fn(LinkCase) -> outputs``, as a list or a
    mapping by link name (None or a link left out: the workbench's float32 reference runs it);
    None: only the reference. ``tolerance``: the user's own limit on every link's worst error;
    ``time_limit``: seconds one call of the user's may take (None: no limit), a call past it
    reported as that case's problem, the check going on."""
    chain = wire(links, dims)
    kind, fn, given = ("none", None, []) if subject is None else _subject(subject, chain)
    conds = _conditions(scales, gates, state_scales)
    seed_arr = check_seeds(seeds)
    user = None if tolerance is None else float(validate.number("tolerance", tolerance, minimum=0))
    caller = None
    if time_limit is not None:
        from workbench.check.time_limit import LimitedCaller

        caller = LimitedCaller(validate.number("time_limit", time_limit, minimum=0, exclusive_minimum=True))
    rows, sub_err, ref_err, problems = [], [], [], []
    for scale, gate, st in conds:
        for s in seed_arr:
            label = f"scale {scale:g} gate {gate} state {st:g} seed {int(s)}"
            case = draw_case(chain, int(s), scale=scale, gate=gate, state_scale=st, label=label)
            truth = chained_outputs(chain, case, truth=True)
            ref_err.append(link_errors(chain, chained_outputs(chain, case, truth=False), truth))
            if fn is not None:
                sub_err.append(link_errors(chain, _subject_run(chain, case, kind, fn, problems, caller), truth))
            rows.append({"scale": scale, "gate": gate, "state_scale": st, "seed": int(s)})
    mx.clear_cache()
    shown = name or ("" if fn is None else getattr(fn, "__qualname__", "chain" if kind == "one" else "links"))
    return ChainReport.build(chain, shown, kind, given, rows, sub_err, ref_err, problems, user)
