"""The fused-attention-tail workbench.

A Python/MLX reimplementation and study of frink-models' fused attention tail: a decoder
engine's attention-layer tail, ``out = residual + ffn(rms_norm(residual + wo(branch)))``,
run as one GPU submission, with a block-Hadamard fold on ``wo``, and the rules that
refuse the layers the fusion cannot serve.

The names a user reaches for first are importable from here::

    from workbench import HadamardFold, TailWeights, compare, fused_tail, host_tail, load_model

Each lives in a module named after its concept (``workbench.fold.rotation``, ``workbench.tail``,
...); docs/LAYOUT.md is the map. Importing this package loads numpy and MLX,
never pandas or matplotlib (tables and figures import those when they are made).
"""

from workbench.backends import BackendUnavailable, available_backends
from workbench.check.run import CheckReport, check_kernel
from workbench.studies.calibration import (
    REFERENCE_TOLERANCES,
    Tolerance,
    calibrate_by,
    calibrate_tolerance,
    catch_rates,
)
from workbench.tail.comparison import Comparison, compare
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.tail.frink_case import SEED_TOL, seed_case
from workbench.models.config import ModelConfig
from workbench.models.loader import list_models, load_model
from workbench.models.refusals import Refusal, eligible, explain, refusal_table
from workbench.studies.sweeps import mutation_sweep, sweep
from workbench.tail.weights import TailRefused, TailWeights, random_inputs
from workbench.tail.paths import fused_tail, host_tail, unfused_tail
from workbench.studies.three_way import three_way_table
from workbench.waits.measurement import count_waits
from workbench.waits.plan import load_plan, wait_table, waits_per_token
from workbench.fold.weights import QUANT_FORMATS, WeightMatrix
from workbench.kernels.metal_drop_in import metal_kernel

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
