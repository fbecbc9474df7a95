"""Each link's fault models run inside a chain: is the chain caught, and is the faulty link the
one named first?

A fault in one link reaches every link after it, so a chain's check is only as useful as its
naming: the first failing link must be the faulty one, not a later link that reads its error,
and not an earlier one. :func:`chain_fault_table` runs each fault model of each link (the
part's own: ``check.faults`` for the tail, ``check.gdn_faults`` for the step,
``check.head_math`` for the head; two of the input norm's own for ``gdn_in``) as that link's
callable, every other link the workbench's float32 reference, through :func:`check_chain`,
and reports a row a fault: caught or not, and the link named first. A fault that only shows
on inputs the chain never hands its link (eps outside a norm's root, where the norm's input
is O(1) whatever the chain's input scale) is reported not caught, which is the truth of
that chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.chain_links import LINKS, ChainDims
from workbench.check.chain_wiring import LinkCase, chain_names, instance_labels

#: The input norm's own faults (the ``gdn_in`` link has no part of its own to take them from).
GDN_IN_FAULTS: dict[str, str] = {
    "eps_outside_root": "the input RMS norm divides by sqrt(mean x^2) + eps instead of sqrt(mean x^2 + eps)",
    "norm_weight_plus_one": "the input norm's weight read as zero-centred (1 + w), the stored convention applied twice",
}


def link_faults(link: str, dims: ChainDims | None = None) -> dict[str, str]:
    """Fault name -> what it does, for ``link`` at ``dims`` (those that change its arithmetic)."""
    validate.one_of("link", link, tuple(LINKS))
    if link == "tail":
        from workbench.check.faults import FAULTS
        from workbench.tail.faults import TAIL_FAULTS

        return {k: v for k, v in FAULTS.items() if TAIL_FAULTS[k].needs is None}  # dense, unfolded wo
    if link == "gdn":
        from workbench.check.gdn_faults import GDN_FAULTS

        return dict(GDN_FAULTS)
    if link == "head":
        from workbench.check.head_math import HEAD_FAULTS, applies

        spec = (dims or ChainDims()).head_spec()
        return {k: v for k, v in HEAD_FAULTS.items() if applies(k, spec)}
    return dict(GDN_IN_FAULTS)


def _tail(fault: str) -> Callable[[LinkCase], Any]:
    from workbench.check.faults import faulty_tail
    from workbench.check.stored import stored_case
    from workbench.tail.weights import TailWeights

    def call(c: LinkCase) -> Any:
        w = c.weights
        tw = TailWeights.from_arrays(*(w[k] for k in ("wo", "ffn_norm", "gate", "up", "down")), eps=c.dims.eps)
        sc = stored_case(tw, c.inputs["branch"], c.inputs["residual"], c.case)
        return np.asarray(faulty_tail(sc, fault), np.float32)

    return call


def _gdn(fault: str) -> Callable[[LinkCase], Any]:
    from workbench.check.gdn_faults import BlockStep, StepWeights

    def call(c: LinkCase) -> Any:
        d, x, w = c.dims, c.inputs, c.weights
        sw = StepWeights(*(w[k][None] for k in ("conv_w", "a_log", "dt_bias", "o_norm")), eps=d.eps, k_heads=d.k_heads)
        ins = (x[k][None] for k in ("mixed", "z", "b", "a", "conv_state", "state"))
        step = BlockStep(sw, *ins, fault=fault)
        for _ in step.chunks():
            pass
        return tuple(np.asarray(t[0], np.float32) for t in step.result())

    return call


def _head(fault: str) -> Callable[[LinkCase], Any]:
    from workbench.check.head_math import HeadWeights, head_block

    def call(c: LinkCase) -> Any:
        w = c.weights
        one = {k: w[k][None] for k in ("attn_norm", "q_w", "k_w", "v_w", "q_norm", "k_norm")}
        hw = HeadWeights(**one, q_b=None, k_b=None, v_b=None)
        got = head_block(c.dims.head_spec(), hw, c.inputs["hidden"][None], np.array([c.dims.position]), fault=fault)
        return tuple(got[k][0] for k in ("q", "k", "v", "gate"))

    return call


def _gdn_in(fault: str) -> Callable[[LinkCase], Any]:
    def call(c: LinkCase) -> Any:
        w, h, eps = c.weights, c.inputs["hidden"], np.float32(c.dims.eps)
        norm = w["input_norm"] + np.float32(1) if fault == "norm_weight_plus_one" else w["input_norm"]
        ms = (h * h).mean()
        n = h / (np.sqrt(ms) + eps) * norm if fault == "eps_outside_root" else h / np.sqrt(ms + eps) * norm
        return tuple(w[k] @ n for k in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))

    return call


def faulty_link(link: str, fault: str, dims: ChainDims | None = None) -> Callable[[LinkCase], Any]:
    """Link ``link`` in float32 with fault model ``fault`` (a name of :func:`link_faults`), as a
    chain's callable a link."""
    validate.one_of("fault", fault, tuple(link_faults(link, dims)))
    return {"tail": _tail, "gdn": _gdn, "head": _head, "gdn_in": _gdn_in}[link](fault)


def chain_fault_table(links: Any = ("tail", "gdn_in", "gdn"), *, dims: ChainDims | None = None, **check: Any) -> Any:
    """A row a (link, fault) of the chain ``links``: the fault run as that link (the others the
    reference), whether the chain fails, the link named first, and whether that is the faulty
    one. ``check``: :func:`check_chain`'s other arguments (seeds, scales, gates, ...)."""
    import pandas as pd

    from workbench.check.chain_run import check_chain

    names = chain_names(links)
    rows = []
    for label, link in zip(instance_labels(names), names):
        for fault in link_faults(link, dims):
            rep = check_chain({label: faulty_link(link, fault, dims)}, names, dims=dims, **check)
            rows.append(
                {
                    "link": label,
                    "fault": fault,
                    "caught": not rep.passed,
                    "first failing": rep.first_failing or "-",
                    "named right": rep.first_failing == label,
                    "past ratio": dict(zip(rep.links, (r["past ratio"] for r in rep.rows())))[label],
                    "cases": len(rep.cases),
                }
            )
    return pd.DataFrame(rows)
