"""The fused-attention-tail workbench.

A Python/MLX reimplementation and study of frink-models' fused attention tail: a decoder
engine's attention-layer tail, ``out = residual + ffn(rms_norm(residual + wo(branch)))``,
run as one GPU submission, with a block-Hadamard fold on ``wo``, and the rules that
refuse the layers the fusion cannot serve.

The names a user reaches for first are importable from here::

    from workbench import HadamardFold, TailWeights, compare, fused_tail, host_tail, load_model

Each lives in a module named after its concept; docs/LAYOUT.md is the map. A name's module is
imported when the name is first used (:func:`public_names`, which every part's ``__init__``
uses the same way), so ``import workbench`` costs little beside MLX and numpy and never loads
pandas or matplotlib (tables and figures import those when they are made).
"""

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def public_names(
    package: str, homes: Mapping[str, Iterable[str]], namespaces: Iterable[str] = ()
) -> tuple[dict[str, str], Callable[[str], Any], Callable[[], list[str]]]:
    """A package's public names, imported on first use: the one mechanism every ``__init__`` here uses.

    ``homes`` maps a module of ``package`` (relative: ``"fold.rotation"``) to the names it gives;
    ``namespaces`` are submodules that are public names themselves. Returns the table (name ->
    home module; the package's ``__all__`` is its keys) and the package's ``__getattr__`` and
    ``__dir__``: a name's home is imported when the name is first read and the value kept as the
    package's attribute; any other name that is a submodule is imported when read as an attribute.
    """
    table: dict[str, str] = {}
    for module, names in homes.items():
        for name in names:
            if name in table:
                raise ValueError(f"{package}: {name!r} is listed twice")
            table[name] = f"{package}.{module}"
    for name in namespaces:
        if name in table:
            raise ValueError(f"{package}: {name!r} is listed twice")
        table[name] = f"{package}.{name}"

    def __getattr__(name: str) -> Any:
        home = table.get(name)
        if home == f"{package}.{name}":
            value = importlib.import_module(home)
        elif home is not None:
            value = getattr(importlib.import_module(home), name)
        elif not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return table, __getattr__, __dir__


#: Where each public name lives: the one list. A name's home module is imported when the name
#: is first read (``from workbench import host_tail`` or ``workbench.host_tail``), not when the
#: package is: the parts together take longer to import than MLX and numpy, and most programs use a few.
_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        # the fold and the weights it folds into
        "fold.rotation": ("HadamardFold", "FoldSite"),
        "fold.weights": ("WeightMatrix", "QUANT_FORMATS"),
        # real models and the refusal rules
        "models.config": ("ModelConfig",),
        "models.loader": ("load_model", "list_models"),
        "models.refusals": ("Refusal", "eligible", "refusal_table", "explain"),
        # the tail, its three paths, and comparing them
        "tail.weights": ("TailWeights", "TailRefused", "random_inputs"),
        "tail.paths": ("host_tail", "unfused_tail", "fused_tail"),
        "backends": ("BackendUnavailable", "available_backends"),
        "kernels.metal_drop_in": ("metal_kernel",),
        "tail.comparison": ("Comparison", "compare"),
        "studies.three_way": ("three_way_table",),
        "tail.frink_case": ("seed_case", "SEED_TOL"),
        # error distributions and tolerances
        "studies.sweeps": ("sweep", "mutation_sweep"),
        "studies.calibration": (
            "Tolerance",
            "calibrate_tolerance",
            "calibrate_by",
            "catch_rates",
            "REFERENCE_TOLERANCES",
        ),
        # a user's own tail checked against the oracle
        "check.run": ("check_kernel", "CheckReport"),
        # waits: counted, planned, priced
        "waits.measurement": ("count_waits",),
        "waits.plan": ("load_plan", "waits_per_token", "wait_table"),
    },
)

__version__ = "0.1.0"

__all__ = list(_HOMES)
