"""What a ``python -m experiments.launch_host_cost`` record says: the host's cost of one
``mx.fast.cuda_kernel`` launch, by what the launch carries (its text's length, its inputs,
whether ``mx.compile`` traced the call), beside an ordinary MLX op's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.reports.records import check as check_record
from workbench.validate import describe

__all__ = ["cost_table", "us_per_kb"]


def cost_table(rec: Mapping) -> Any:
    """A ``pandas.DataFrame``, one row a variant: ``variant``, ``inputs``, ``pad_kb`` (kB of
    text before the kernel), ``compiled``, ``build_us`` / ``encode_us`` / ``host_us`` a launch
    (medians over the chains) and ``x_op`` (host time over the plain add's, ``ops``)."""
    import pandas as pd

    rec = check_record(rec, "launch_host_cost")
    variants = rec["variants"]
    if not isinstance(variants, Mapping) or "ops" not in variants:
        raise ValueError(
            f"rec['variants']: must map variants to their costs, 'ops' among them, got {describe(variants)}"
        )
    op = float(variants["ops"]["host_us_per_launch"])
    return pd.DataFrame(
        [
            {
                "variant": name,
                "inputs": v["inputs"],
                "pad_kb": v["pad_kb"],
                "compiled": v["compiled"],
                "build_us": v["build_us_per_launch"],
                "encode_us": v["encode_us_per_launch"],
                "host_us": v["host_us_per_launch"],
                "x_op": v["host_us_per_launch"] / op,
                "exact": v["check_passed"],
            }
            for name, v in variants.items()
        ]
    )


def us_per_kb(rec: Mapping) -> float:
    """The host's cost of a launch's text, us a kB: the slope from the two-input kernel with
    no padding to the same kernel behind the most padding."""
    t = cost_table(rec).set_index("variant")
    plain = t[(t.inputs == 2) & ~t.compiled.astype(bool)]
    lo, hi = plain.pad_kb.idxmin(), plain.pad_kb.idxmax()
    return float((plain.host_us[hi] - plain.host_us[lo]) / (plain.pad_kb[hi] - plain.pad_kb[lo]))
