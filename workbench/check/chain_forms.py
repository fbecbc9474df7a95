"""A part's own forms as a chain's links: the user's kernels run where the engine runs them.

A chain given one callable a link may give a link, in place of a function of a
:class:`~workbench.check.chain_wiring.LinkCase`, any form its part's check takes: for the
``tail``, a :class:`~workbench.check.subjects.KernelsFolderSubject` or a
:class:`~workbench.check.subjects.SourceSubject`; for the ``gdn`` step, a
:class:`~workbench.check.gdn_subjects.CallableStep`, ``KernelsFolderStep`` or ``StepSource``;
for the ``head``, a :class:`~workbench.check.head_subjects.CallableHead` or ``HeadSource``
(the chain's head is the model's shape, which the workbench's head launch, and so a head
kernels folder, does not compute). :func:`link_callable` turns the form into the link's
callable, handing it what its part's check hands it (a ``TailWeights`` and the rows, a
``StepInputs``, a ``HeadInputs``), so one kernel text is judged the same way alone and in
a chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.chain_links import ChainDims
from workbench.check.chain_wiring import LinkCase

#: link -> the forms of its part a chain takes (as messages name them).
LINK_FORMS: dict[str, str] = {
    "tail": "a function of a LinkCase, a KernelsFolderSubject or a SourceSubject",
    "gdn_in": "a function of a LinkCase",
    "gdn": "a function of a LinkCase, a CallableStep, a KernelsFolderStep or a StepSource",
    "head": "a function of a LinkCase, a CallableHead or a HeadSource",
}


def _tail(form: Any) -> Callable[[LinkCase], Any]:
    from workbench.tail.weights import TailWeights

    def call(c: LinkCase) -> Any:
        w = c.weights
        tw = TailWeights.from_arrays(*(w[k] for k in ("wo", "ffn_norm", "gate", "up", "down")), eps=c.dims.eps)
        b, r = c.inputs["branch"], c.inputs["residual"]
        if hasattr(form, "run_one"):  # a source: one row a launch
            return np.asarray(form.run_one(tw, b, r), np.float32).reshape(-1)
        return np.asarray(form.run(tw, b[None], r[None]), np.float32)[0]

    return call


def _gdn(form: Any) -> Callable[[LinkCase], Any]:
    from workbench.check.gdn_subjects import StepInputs
    from workbench.kernels.gdn_step import GdnShape

    def call(c: LinkCase) -> Any:
        d, x, w = c.dims, c.inputs, c.weights
        consts = {k: w[k] for k in ("conv_w", "a_log", "dt_bias", "o_norm")}
        shape = GdnShape(d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.conv)
        ins = (x["mixed"], x["z"], x["b"], x["a"], x["conv_state"], x["state"])
        step = StepInputs(*ins, *consts.values(), d.eps, d.k_heads, c.case, 0)
        return form.layer(shape, consts, d.eps)(step)

    return call


def _head(form: Any, dims: ChainDims) -> Callable[[LinkCase], Any]:
    from workbench.check.head_cases import HeadInputs

    spec = dims.head_spec()
    run = form.prepare(spec)  # a form that cannot run the model's head says so here, before any case

    def call(c: LinkCase) -> Any:
        w = c.weights
        ws = (w["attn_norm"], w["q_w"], w["k_w"], w["v_w"], None, None, None, w["q_norm"], w["k_norm"])
        return run(HeadInputs(c.inputs["hidden"], *ws, None, c.dims.position, spec, c.case))

    return call


def link_callable(link: str, form: Any, dims: ChainDims) -> Callable[[LinkCase], Any]:
    """``form`` as link ``link``'s callable (a function is kept as it is), or a ValueError
    naming the link and the forms it takes."""
    if callable(form):
        return form
    kinds = {"tail": ("run", "run_one"), "gdn": ("layer",), "head": ("prepare",)}.get(link, ())
    if not any(hasattr(form, k) for k in kinds):
        raise ValueError(f"subject: link {link}: must be {LINK_FORMS[link]} (or None), got {validate.describe(form)}")
    if link == "tail":
        return _tail(form)
    if link == "gdn":
        return _gdn(form)
    return _head(form, dims)
