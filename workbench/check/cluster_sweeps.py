"""The error sweeps (:mod:`workbench.studies.sweeps`) on a Dask cluster: one task a shape and
block of :data:`~workbench.studies.cases.CASE_BLOCK` seeds (what a sweep holds at once, and
the unit its batched graph runs over, so each row is the serial sweep's row bit for bit), the
tables merged in the serial sweep's order: shape, configuration, mutation, seed.

The calibration then runs on the merged table as on the serial one
(``studies.calibration.calibrate_by``, ``catch_rates``): a fit over every case's error is
cheap beside the sweep; the sweep is what a cluster is for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from workbench import validate
from workbench.check.cluster import checked_client, show_progress
from workbench.check.cluster_worker import run_study_shard
from workbench.studies.cases import CASE_BLOCK, check_seeds, check_shape

#: The columns that say which configuration a sweep's row is, before ``seed``.
GROUP_COLUMNS: tuple[str, ...] = (
    "hidden",
    "branch",
    "ffn",
    "wo_outliers",
    "dtype",
    "fold",
    "quant",
    "backend",
    "mutation",
)


def merged_sweep(groups: list[list[Any]]):
    """One table from the blocks' tables of each shape (``groups``: a list a shape, in order,
    of its blocks' tables in seed order): a shape's rows put in the serial order
    (configuration and mutation as the first block has them, then seed); categories remade
    over the whole table, as the serial sweep makes them."""
    import pandas as pd

    first = groups[0][0]
    cats = [c for c in first.columns if isinstance(first[c].dtype, pd.CategoricalDtype)]
    keys = [c for c in GROUP_COLUMNS if c in first.columns]
    parts = []
    for tables in groups:
        df = pd.concat([t.astype(dict.fromkeys(cats, object)) for t in tables], ignore_index=True)
        lead = tables[0].astype(dict.fromkeys(cats, object))
        rank = {k: i for i, k in enumerate(dict.fromkeys(zip(*(lead[c] for c in keys))))}
        df["_rank"] = [rank[k] for k in zip(*(df[c] for c in keys))]
        parts.append(df.sort_values(["_rank", "seed"], kind="stable").drop(columns="_rank"))
    out = pd.concat(parts, ignore_index=True)
    for c in cats:
        out[c] = out[c].astype("category")
    return out


def _on_cluster(client: Any, study: Any, shapes: Any, seeds: Any, progress: bool | None, options: dict[str, Any]):
    client = checked_client(client)
    seed_arr = np.unique(check_seeds(seeds))
    shapes = [check_shape(s) for s in validate.sequence("shapes", shapes, what="(hidden, branch, ffn) triples")]
    blocks = np.unique(seed_arr // CASE_BLOCK)
    futures = []
    for shp in shapes:
        for blk in blocks:
            part = [int(s) for s in seed_arr[seed_arr // CASE_BLOCK == blk]]
            task = {**options, "shapes": [shp], "seeds": part, "progress": False}
            futures.append(client.submit(run_study_shard, study, task, pure=False, retries=0))
    show_progress(client, futures, progress)
    tables = [f.result().result for f in futures]
    n = len(blocks)
    return merged_sweep([tables[k * n : (k + 1) * n] for k in range(len(shapes))])


def sweep_on_cluster(
    client: Any,
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    progress: bool | None = None,
    **options: Any,
):
    """``studies.sweep(shapes=, seeds=, **options)`` on ``client``'s workers, a task a shape and
    block of seeds: the same table bit for bit. ``progress``: Dask's progress over the tasks
    (``None``: where stderr is a terminal)."""
    from workbench.studies.sweeps import sweep

    return _on_cluster(client, sweep, shapes, seeds, progress, options)


def mutation_sweep_on_cluster(
    client: Any,
    *,
    shapes: Sequence[Sequence[int]],
    seeds: Iterable[int],
    progress: bool | None = None,
    **options: Any,
):
    """``studies.mutation_sweep(shapes=, seeds=, **options)`` on ``client``'s workers, as
    :func:`sweep_on_cluster`: the same table bit for bit."""
    from workbench.studies.sweeps import mutation_sweep

    return _on_cluster(client, mutation_sweep, shapes, seeds, progress, options)
