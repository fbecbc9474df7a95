"""The surfaces of a check that cannot be fooled (the kernel forms' and the step's worker
processes, the step's guards and reproducers, the outputs' coverage) answer bad input with a
ValueError naming the parameter, what was given and what is allowed; counted in the robustness
tally (``tests/test_robustness_surfaces.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

STEP = {
    "geometries": [(2, 6, 32, 32, 4)],
    "seeds": range(1),
    "tokens": 2,
    "gates": ["typical"],
    "scales": [1.0],
    "state_scales": [1.0],
    "faults": (),
}


def _a_step_reproducer(folder: Path) -> Path:
    from tests.check_user_steps import bf16_state
    from workbench.check import check_step

    made = folder / "made"
    if not made.is_dir():
        check_step(bf16_state, replay_dir=made, **STEP)
    return sorted(made.iterdir())[0]


def _altered(folder: Path) -> Path:
    """A step reproducer whose first token's input no longer is what its seed makes."""
    src = _a_step_reproducer(folder)
    tensors, meta = mx.load(str(src), return_metadata=True)
    tensors = dict(tensors)
    tensors["mixed"] = tensors["mixed"] + 1.0
    out = folder / "altered.safetensors"
    mx.save_safetensors(str(out), tensors, metadata=meta)
    return out


def _plain(folder: Path) -> Path:
    out = folder / "plain.safetensors"
    mx.save_safetensors(str(out), {"x": mx.zeros(3)})
    return out


def cases(folder: Path) -> list[tuple[str, Callable[[], Any], str]]:
    """(label, call, the regex its error must START with)."""
    from tests.test_check_gdn import numpy_step
    from tests.test_check_source import LAUNCH
    from workbench.check import KernelsFolderSubject, SourceSubject, check_step
    from workbench.check.replay import replay
    from workbench.check.step_replay import replay_step
    from workbench.kernels import covered_launch, never_written
    from workbench.kernels.source import KERNEL_DIR

    a_file = folder / "a_file.txt"
    a_file.write_text("not a folder")
    ones = np.ones(4, np.float32)

    def lam(s):
        return numpy_step(s)

    return [
        ("SourceSubject(process='yes')", lambda: SourceSubject(LAUNCH, process="yes"), "process: must be True or"),
        ("KernelsFolderSubject(process=1)", lambda: KernelsFolderSubject(KERNEL_DIR, process=1), "process: must be"),
        ("check_step(rerun='yes')", lambda: check_step(numpy_step, rerun="yes", **STEP), "rerun: must be True or"),
        ("check_step(process='yes')", lambda: check_step(numpy_step, process="yes", **STEP), "process: must be True"),
        ("check_step(lambda, process=True)", lambda: check_step(lam, process=True, **STEP), "process: True needs"),
        ("check_step(time_limit=0)", lambda: check_step(numpy_step, time_limit=0, **STEP), "time_limit: must be"),
        ("check_step(time_limit='30')", lambda: check_step(numpy_step, time_limit="30", **STEP), "time_limit: must"),
        (
            "check_step(replay_dir=a file)",
            lambda: check_step(numpy_step, replay_dir=a_file, **STEP),
            "replay_dir: must",
        ),
        ("check_step(replay_dir=3)", lambda: check_step(numpy_step, replay_dir=3, **STEP), "replay_dir: must be"),
        (
            "check_step(replay_max_bytes=0)",
            lambda: check_step(numpy_step, replay_dir=folder, replay_max_bytes=0, **STEP),
            "replay_max_bytes: must be",
        ),
        (
            "check_step(replay_max_bytes too small)",
            lambda: check_step(numpy_step, replay_dir=folder, replay_max_bytes=100, **STEP),
            "replay_max_bytes: a reproducer of geometry 2/6/32/32/4 over 2 tokens",
        ),
        (
            "replay_step(absent file)",
            lambda: replay_step(folder / "absent", numpy_step),
            "replay: must be a reproducer",
        ),
        ("replay_step(None)", lambda: replay_step(None, numpy_step), "replay: must be a reproducer"),
        (
            "replay_step(plain safetensors)",
            lambda: replay_step(_plain(folder), numpy_step),
            "replay: plain.safetensors",
        ),
        (
            "replay_step(subject 42)",
            lambda: replay_step(_a_step_reproducer(folder), 42),
            "subject: must be a step callable or form, got 42",
        ),
        (
            "replay_step(a kernels folder for a callable's)",
            lambda: replay_step(_a_step_reproducer(folder), _folder_step()),
            "subject: .* was written by a check of a callable, got a kernels folder",
        ),
        (
            "replay_step(altered inputs)",
            lambda: replay_step(_altered(folder), numpy_step),
            r"replay: altered.safetensors's inputs are not those its seed regenerates",
        ),
        (
            "replay(a step's file, the tail's)",
            lambda: replay(_a_step_reproducer(folder), lambda c: c),
            "replay: .* is a reproducer of the recurrent step",
        ),
        ("never_written(shapes differ)", lambda: never_written(ones, ones[:2]), "sentinel_filled: must have the shape"),
        ("covered_launch(names short)", lambda: covered_launch(lambda f: [ones, ones], ["out"]), "names: must name"),
    ]


def _folder_step():
    from workbench.check import KernelsFolderStep
    from workbench.kernels.source import KERNEL_DIR

    return KernelsFolderStep(KERNEL_DIR)


def refused_as(call: Callable[[], Any], start: str) -> str:
    """``clear`` when ``call()`` raises a ValueError whose message starts with ``start`` (a regex)."""
    try:
        call()
    except ValueError as err:
        return "clear" if re.match(start, str(err)) else f"unclear: {err}"
    except Exception as err:  # any other type escaping is the failure reported
        return f"leaked {type(err).__name__}: {err}"
    return "accepted"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("integrity")


def test_every_new_surface_refuses_bad_input_naming_the_parameter(folder):
    got = {label: refused_as(call, start) for label, call, start in cases(folder)}
    bad = {k: v for k, v in got.items() if v != "clear"}
    assert len(got) >= 20 and not bad, bad
