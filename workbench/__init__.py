"""The fused-attention-tail workbench.

A Python/MLX reimplementation and study of frink-models' fused attention tail: a decoder
engine's attention-layer tail, ``out = residual + ffn(rms_norm(residual + wo(branch)))``,
run as one GPU submission, with a block-Hadamard fold on ``wo``, and the rules that
refuse the layers the fusion cannot serve.

The names a user reaches for first are importable from here::

    from workbench import HadamardFold, TailWeights, compare, fused_tail, host_tail, load_model

Each lives in a module named after its concept (``workbench.fold.rotation``, ``workbench.tail``,
...); docs/LAYOUT.md is the map. Importing this package imports none of them: a name's
module is imported when the name is first used, so ``import workbench`` costs little beside
MLX and numpy, and never loads pandas or matplotlib (tables and figures import those when
they are made).
"""

import importlib
import importlib.util
from typing import Any

#: Where each public name lives. A name's home module is imported when the name is first
#: read (``from workbench import host_tail`` or ``workbench.host_tail``), not when the package
#: is: the parts together take longer to import than MLX and numpy, and most programs use a few.
_HOMES: dict[str, str] = {
    "BackendUnavailable": "workbench.backends",
    "available_backends": "workbench.backends",
    "CheckReport": "workbench.check.run",
    "check_kernel": "workbench.check.run",
    "REFERENCE_TOLERANCES": "workbench.studies.calibration",
    "Tolerance": "workbench.studies.calibration",
    "calibrate_by": "workbench.studies.calibration",
    "calibrate_tolerance": "workbench.studies.calibration",
    "catch_rates": "workbench.studies.calibration",
    "Comparison": "workbench.tail.comparison",
    "compare": "workbench.tail.comparison",
    "FoldSite": "workbench.fold.rotation",
    "HadamardFold": "workbench.fold.rotation",
    "SEED_TOL": "workbench.tail.frink_case",
    "seed_case": "workbench.tail.frink_case",
    "ModelConfig": "workbench.models.config",
    "list_models": "workbench.models.loader",
    "load_model": "workbench.models.loader",
    "Refusal": "workbench.models.refusals",
    "eligible": "workbench.models.refusals",
    "explain": "workbench.models.refusals",
    "refusal_table": "workbench.models.refusals",
    "mutation_sweep": "workbench.studies.sweeps",
    "sweep": "workbench.studies.sweeps",
    "TailRefused": "workbench.tail.weights",
    "TailWeights": "workbench.tail.weights",
    "random_inputs": "workbench.tail.weights",
    "fused_tail": "workbench.tail.paths",
    "host_tail": "workbench.tail.paths",
    "unfused_tail": "workbench.tail.paths",
    "three_way_table": "workbench.studies.three_way",
    "count_waits": "workbench.waits.measurement",
    "load_plan": "workbench.waits.plan",
    "wait_table": "workbench.waits.plan",
    "waits_per_token": "workbench.waits.plan",
    "QUANT_FORMATS": "workbench.fold.weights",
    "WeightMatrix": "workbench.fold.weights",
    "metal_kernel": "workbench.kernels.metal_drop_in",
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its home module on first use (and kept as an attribute);
    a part of the package (``workbench.tail``), imported when first read as an attribute."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__version__ = "0.1.0"

__all__ = [
    # the fold and the weights it folds into
    "HadamardFold",
    "FoldSite",
    "WeightMatrix",
    "QUANT_FORMATS",
    # real models and the refusal rules
    "ModelConfig",
    "load_model",
    "list_models",
    "Refusal",
    "eligible",
    "refusal_table",
    "explain",
    # the tail, its three paths, and comparing them
    "TailWeights",
    "TailRefused",
    "random_inputs",
    "host_tail",
    "unfused_tail",
    "fused_tail",
    "BackendUnavailable",
    "available_backends",
    "metal_kernel",
    "Comparison",
    "compare",
    "three_way_table",
    "seed_case",
    "SEED_TOL",
    # error distributions and tolerances
    "sweep",
    "mutation_sweep",
    "Tolerance",
    "calibrate_tolerance",
    "calibrate_by",
    "catch_rates",
    "REFERENCE_TOLERANCES",
    # a user's own tail checked against the oracle
    "check_kernel",
    "CheckReport",
    # waits: counted, planned, priced
    "count_waits",
    "load_plan",
    "waits_per_token",
    "wait_table",
]
