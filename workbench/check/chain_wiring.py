"""A chain wired: which tensor each link reads from where, and the cases a check draws for it.

A link reads each input from the latest earlier link that wrote it (or a name it accepts in
its place), else from the chain's inputs; each link after the first must read something the
link before it wrote, since a chain is launches that feed each other (two unconnected
launches are two checks, not a chain). A link may come again (a run of recurrent layers:
``tail,gdn_in,gdn,tail,gdn_in,gdn``): its k-th occurrence is labelled ``name@k``, with weights
and a recurrent state of its own (a layer's ``state`` inputs are never another layer's). The
cases draw every link's weights from a stream of
its own (the case's seed and the link's name), so a link's weights are the same in any chain it
is part of, and the chain's inputs from another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.chain_links import LINK_NAMES, LINKS, ChainDims, Link

#: The stream a case's draws come from: ``[seed, CHAIN_STREAM, k]`` (k: the link's index in
#: :data:`LINK_NAMES`, or ``len(LINK_NAMES)`` for the chain's inputs).
CHAIN_STREAM = 55


@dataclass(frozen=True)
class Wired:
    """One link of a chain: its ``position`` (0-based), the ``link``, ``sources`` (input ->
    (the earlier link's position or None for the chain's inputs, the tensor's name there)),
    ``shapes`` of its inputs and outputs, its weights' ``weight_shapes``, and its ``name`` in
    the chain (:func:`instance_labels`)."""

    position: int
    link: Link
    sources: dict[str, tuple[int | None, str]]
    shapes: dict[str, tuple[int, ...]]
    weight_shapes: dict[str, tuple[int, ...]]
    name: str = ""

    @property
    def label(self) -> str:
        """How messages name it: ``link 2 gdn_in (part gdn_in)``."""
        return f"link {self.position + 1} {self.name} (part {self.link.part})"


@dataclass(frozen=True)
class Chain:
    """The wired links in order, the chain's ``inputs`` (name -> shape) and its ``dims``."""

    links: tuple[Wired, ...]
    inputs: dict[str, tuple[int, ...]]
    dims: ChainDims

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.links)


def chain_names(links: Any) -> tuple[str, ...]:
    """``links`` (a comma-separated str or a sequence of names of :data:`LINK_NAMES`) as a
    tuple, or a ValueError naming ``chain``."""
    if isinstance(links, str):
        links = [t.strip() for t in links.split(",")]
    names = validate.sequence("chain", links, what=f"link names of {LINK_NAMES}")
    for n in names:
        validate.one_of("chain", n, LINK_NAMES)
    return tuple(names)


def instance_labels(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each link's label in the chain: its name, ``name@k`` for its k-th occurrence (k >= 2: a
    second recurrent layer of a run, ``gdn@2``, with weights and states of its own)."""
    return tuple(n if names[:i].count(n) == 0 else f"{n}@{names[:i].count(n) + 1}" for i, n in enumerate(names))


def wire(links: Any, dims: ChainDims | None = None) -> Chain:
    """The chain of ``links`` (names of :data:`LINK_NAMES`, in launch order) at ``dims``."""
    names = chain_names(links)
    labels = instance_labels(names)
    if dims is None:
        dims = ChainDims()
    elif not isinstance(dims, ChainDims):
        raise ValueError(f"dims: must be a ChainDims, got {validate.describe(dims)}")
    base = dims.tensor_shapes()
    written: dict[str, tuple[int, tuple[int, ...]]] = {}  # tensor -> (its writer's position, shape)
    inputs: dict[str, tuple[int, ...]] = {}
    out = []
    for i, name in enumerate(names):
        link = LINKS[name]
        sources: dict[str, tuple[int | None, str]] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for x in link.inputs:
            found = [(written[n][0], n) for n in (x, *link.accepts.get(x, ())) if n in written]
            if x in link.state:  # the layer's own state: a chain input of its own, never another layer's
                own = x if labels[i] == name else f"{x}{labels[i].removeprefix(name)}"
                sources[x], shapes[x] = (None, own), inputs.setdefault(own, base[x])
            elif found:
                pos, src = max(found)
                sources[x], shapes[x] = (pos, src), written[src][1]
            else:
                sources[x], shapes[x] = (None, x), inputs.setdefault(x, base[x])
        if i and not any(p == i - 1 for p, _ in sources.values()):
            raise ValueError(
                f"chain: link {i + 1} {labels[i]} reads nothing link {i} {labels[i - 1]} writes "
                f"(it reads {', '.join(link.inputs)}; {names[i - 1]} writes {', '.join(LINKS[names[i - 1]].outputs)})"
            )
        for y in link.outputs:
            shapes[y] = base[y]
        for y in link.outputs:
            written[y] = (i, shapes[y])
        out.append(Wired(i, link, sources, shapes, link.weights(dims, shapes), labels[i]))
    return Chain(tuple(out), inputs, dims)


@dataclass(frozen=True)
class ChainCase:
    """One case as a chain implementation is handed it: the chain's ``inputs`` (name ->
    float32 numpy), ``weights`` (link label -> its weights, name -> float32 numpy), the
    ``links`` in order, the ``dims`` (``eps``, ``k_heads`` ...) and the ``case``'s label."""

    inputs: dict[str, np.ndarray]
    weights: dict[str, dict[str, np.ndarray]]
    links: tuple[str, ...]
    dims: ChainDims
    case: str = ""


@dataclass(frozen=True)
class LinkCase:
    """One link's call, when a chain is given as one callable a link: ``link`` its label,
    ``inputs`` (what the user's previous link returned, or the chain's inputs), ``weights``,
    ``dims`` and the ``case``'s label."""

    link: str
    inputs: dict[str, np.ndarray]
    weights: dict[str, np.ndarray]
    dims: ChainDims
    case: str = ""


def _scale_of(chain: Chain, name: str, scale: float, state_scale: float) -> float:
    """The magnitude a chain input is drawn at: the recurrent state at ``state_scale``; the
    conv state as the conv's inputs are (``scale`` when they are the chain's inputs, else
    O(1), the projections' scale); every other activation at ``scale``."""
    name = name.split("@")[0]  # a later layer's own state is drawn as the first's
    if name == "state":
        return state_scale
    if name == "conv_state":
        return scale if "mixed" in chain.inputs else 1.0
    return scale


def draw_case(chain: Chain, seed: int, *, scale: float, gate: str, state_scale: float, label: str) -> ChainCase:
    """The case of ``seed`` at one condition: every link's weights (gate regime ``gate`` for
    the step's constants) and the chain's inputs, float32."""
    weights = {}
    for w in chain.links:
        key = [int(seed), CHAIN_STREAM, LINK_NAMES.index(w.link.name)]
        k = w.name.partition("@")[2]  # a link's k-th occurrence draws from a stream of its own
        rng = np.random.default_rng(key + [int(k)] if k else key)
        weights[w.name] = w.link.draw(rng, chain.dims, w.shapes, gate)
    rng = np.random.default_rng([int(seed), CHAIN_STREAM, len(LINK_NAMES)])
    inputs = {
        k: (rng.standard_normal(s) * _scale_of(chain, k, scale, state_scale)).astype(np.float32)
        for k, s in chain.inputs.items()
    }
    return ChainCase(inputs, weights, chain.names, chain.dims, label)


def link_inputs(w: Wired, chain_inputs: Mapping[str, Any], outputs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What link ``w`` reads: from ``outputs`` (each earlier link's, by position) or the chain's inputs."""
    return {x: chain_inputs[n] if p is None else outputs[p][n] for x, (p, n) in w.sources.items()}


def _tensor(where: str, name: str, value: Any, want: tuple[int, ...]) -> None:
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        raise ValueError(f"case: {where}, tensor {name}: must be a float numpy array, got {validate.describe(value)}")
    if tuple(value.shape) != tuple(want):
        raise ValueError(f"case: {where}, tensor {name}: shape {tuple(value.shape)}, expected {tuple(want)}")


def check_case(chain: Chain, case: Any) -> ChainCase:
    """``case`` if it is a case of ``chain`` (its links, every chain input and every link's
    weights there, each of the shape the wiring gives), else a ValueError naming the link, its
    part and the tensor."""
    if not isinstance(case, ChainCase):
        raise ValueError(f"case: must be a ChainCase, got {validate.describe(case)}")
    if tuple(case.links) != chain.names:
        raise ValueError(f"case: its links {list(case.links)} are not the chain's {list(chain.names)}")
    if not isinstance(case.inputs, dict) or not isinstance(case.weights, dict):
        raise ValueError("case: inputs and weights must be dicts (tensor name -> array; link -> its weights)")
    for name, shape in chain.inputs.items():
        if name not in case.inputs:
            raise ValueError(f"case: the chain's input {name!r} is missing (it has {sorted(case.inputs)})")
        _tensor("the chain's inputs", name, case.inputs[name], shape)
    for w in chain.links:
        got = case.weights.get(w.name)
        if not isinstance(got, dict):
            raise ValueError(f"case: {w.label}: its weights are missing, got {validate.describe(got)}")
        for name, shape in w.weight_shapes.items():
            if name not in got:
                raise ValueError(f"case: {w.label}, tensor {name}: missing (its weights have {sorted(got)})")
            _tensor(w.label, name, got[name], shape)
    return case
