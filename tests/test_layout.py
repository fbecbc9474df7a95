"""The package's floors: which module may import which, and no import circle.

Each module of ``workbench`` sits on a floor and imports, at its top, only modules on
lower floors (the README's layout section is the same map in prose). Imports inside a
function or under ``if TYPE_CHECKING:`` are not part of the map: the moved-name
forwarders (``tail``, ``waits`` and ``backends`` set ``__getattr__`` from
``moved_names.forwarder``, which keeps names reachable where they lived before the
package was split) import upward lazily on purpose, and ``kernel_launch`` names
``TailLaunch`` for type checkers only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"

#: floor -> the modules on it, bottom first.
FLOORS: dict[int, tuple[str, ...]] = {
    -1: ("validate",),  # argument checks: the one message form, usable by every module, the bottom included
    0: ("hadamard", "kernel_source", "moved_names", "records", "sanitizer_coverage", "launch_bounds", "kernel_versions"),  # numbers, kernel text, old names' new homes, files written atomically, what compute-sanitizer found clean, what bounds each launch, two kernel texts side by side
    1: ("backends", "fold", "model", "metal_emulation"),  # which devices exist; the rotation; real models' configs; Metal source on the CPU
    2: ("weights", "refusals", "cuda_device"),  # matrices that carry a fold; the rules over a config; the GPU's SM count
    3: ("kernel_launch",),  # the kernels' launches for weights
    4: ("gdn_kernel", "one_launch"),  # a Gated DeltaNet step as one launch; the tail as one CUDA launch
    5: ("tail",),  # the tail's weights, math, three paths and one launch builder
    6: ("frink_case", "wait_measurement", "checkpoint", "decode_matvec"),  # the engine's test case; counting and timing waits; real checkpoints in; a decode step's matvecs, MLX ops or kernels
    7: ("comparison", "sweep_cases", "reference_model"),  # comparing a result with its reference; drawing cases; mlx-lm's model with a checkpoint
    8: ("exact_oracle", "three_way", "sweeps", "calibration", "waits", "real_model"),  # studies built on the tail; a real model end to end
    9: ("schedule", "metal_check"),  # a decode step executed stage by stage of the plan; Metal emulated beside graph and oracle
    10: ("plots", "tables"),  # figures and text tables, from anything
}
FLOOR_OF = {m: f for f, mods in FLOORS.items() for m in mods}


def top_level_imports(path: Path) -> set[str]:
    """The workbench modules ``path`` imports at module level (not in functions, not for type checkers)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("workbench"):
                if sub.module == "workbench":
                    found.update(a.name for a in sub.names)
                else:
                    found.add(sub.module.split(".")[1])
            elif isinstance(sub, ast.Import):
                found.update(a.name.split(".")[1] for a in sub.names if a.name.startswith("workbench."))
    return found


MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def test_every_module_has_a_floor():
    assert sorted(FLOOR_OF) == MODULES


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imports_only_lower_floors(module):
    for dep in top_level_imports(PACKAGE / f"{module}.py"):
        assert FLOOR_OF[dep] < FLOOR_OF[module], f"{module} (floor {FLOOR_OF[module]}) imports {dep} (floor {FLOOR_OF[dep]})"


def test_the_import_graph_has_no_circle():
    # Implied by the floors; checked on its own so a failure says which circle.
    graph = {m: top_level_imports(PACKAGE / f"{m}.py") for m in MODULES}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, "import circle: " + " -> ".join(path + (m,))
        if m in done:
            return
        for dep in graph[m]:
            visit(dep, path + (m,))
        done.add(m)

    for m in MODULES:
        visit(m, ())
