"""Gated DeltaNet steps a user might write, importable by path for the command's tests, and a
dump written by docs/DUMP_LAYOUT.md's own writer block (run as printed there)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tests.test_check_gdn import METAL_BODY, METAL_HEADER, mlx_lm_step, numpy_step
from workbench.check.gdn_cases import token_run
from workbench.check.gdn_faults import bfloat16_round
from workbench.check.gdn_subjects import StepInputs
from workbench.kernels.gdn_step import GdnShape

ROOT = Path(__file__).resolve().parent.parent

#: The options of a small, quick run (one geometry, one gate regime, no fault models).
QUICK = ["--geometries", "2/6/32/32/4", "--gates", "typical", "--faults", "none"]

__all__ = [
    "METAL_BODY",
    "METAL_HEADER",
    "QUICK",
    "bf16_state",
    "correct",
    "correct_mlx",
    "hangs_once",
    "write_documented_dump",
]


def correct(step):
    """A float32 step in numpy from the formulas."""
    return numpy_step(step)


#: mlx-lm's own recurrence (``gated_delta_ops``) around the conv, norms and gate, handed MLX arrays.
correct_mlx = mlx_lm_step("ops")


def bf16_state(step):
    """The ollama bug: the state kept as bfloat16 between tokens (in a float32 buffer)."""
    o, c, st = numpy_step(step)
    return o, c, bfloat16_round(st)


def documented_block() -> str:
    """The writer block of docs/DUMP_LAYOUT.md's step section, as printed there."""
    doc = (ROOT / "docs" / "DUMP_LAYOUT.md").read_text()
    section = doc[doc.index("## The Gated DeltaNet step") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def write_documented_dump(path: Path, step=correct, *, seed: int = 0, sequences: int = 4, tokens: int = 12) -> Path:
    """A dump at ``path`` written by the documented block, ``step`` (one sequence's, as the
    command's callables are) playing the engine over a batch of ``sequences``."""
    shape = GdnShape(2, 6, 32, 32, 4)
    r = token_run(shape, range(seed, seed + sequences), tokens, scale=1.0, gate="near_one", state_scale=1.0)
    w = r.weights
    layer = {"conv_w": w.conv_w[0], "a_log": w.a_log[0], "dt_bias": w.dt_bias[0], "o_norm": w.o_norm[0]}

    def engine_step(mixed, z, b, a, conv, st):
        res = [
            step(StepInputs(mixed[i], z[i], b[i], a[i], conv[i], st[i], *layer.values(), w.eps, w.k_heads))
            for i in range(len(mixed))
        ]
        return tuple(np.stack([x[j] for x in res]) for j in range(3))

    names = {**layer, "mixed": r.mixed, "z": r.z, "b": r.b, "a": r.a, "conv_state": r.conv_state, "state": r.state}
    code = documented_block().replace('"gdn_layer03.safetensors"', repr(str(path)))
    exec(code, {**names, "engine_step": engine_step})
    return path


def hangs_once(step):
    """A correct step that stalls on the second token of its first run (for ``--time-limit``)."""
    import time

    if step.token == 1 and step.case.endswith("seed 0"):
        time.sleep(1.0)
    return numpy_step(step)
