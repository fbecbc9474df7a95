"""Each failing case of a check as a self-contained reproducer, and that reproducer run again.

A reproducer is one safetensors file a failing case (every input scale of one seed of one
configuration): the seed, shape, dtype, fold, quantization and eps that regenerate the case's
stored weights (:mod:`workbench.check.blocks`, the check's own path), the inputs as handed
(``branch`` [n, branch], ``residual`` [n, hidden]), the implementation's ``output`` bits and the
float64 ``truth``, with the tolerances judged and the case's verdict. :func:`replay` runs a
subject (given again the same way) on the regenerated case and says whether the verdict and
the output bits are the same. Written atomically, never over a file (a taken name gets a
suffix), under a size cap checked before any case runs; nothing else is written.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import files, validate
from workbench.check import blocks
from workbench.check.calls import callers, run_block
from workbench.check.subjects import CallableSubject
from workbench.real_models.safetensors_header import check_safetensors_header
from workbench.studies.cases import case_arrays, check_shape, quant_spec
from workbench.tail.comparison import max_abs_error, nmse, worst_scaled_error

#: The largest reproducer written by default (bytes); a larger case is refused before the check runs.
DEFAULT_MAX_BYTES = 16 * 2**20

#: The metadata key that marks a file as a reproducer (its format's version).
MARK = "workbench_replay"


def reproducer_bytes(shape: tuple[int, int, int], n_scales: int) -> int:
    """The tensors' bytes of one case's reproducer: branch, residual, output (float32), truth (float64)."""
    h, b, _ = shape
    return n_scales * (b * 4 + h * 4 + h * 4 + h * 8)


@dataclass(frozen=True)
class ReplayDir:
    """Where a check writes its reproducers, and the cap on one file's size."""

    folder: Path
    max_bytes: int

    @classmethod
    def of(cls, folder: Any, max_bytes: Any) -> ReplayDir | None:
        """``replay_dir`` / ``replay_max_bytes`` checked (None: no reproducers)."""
        cap = int(validate.number("replay_max_bytes", max_bytes, minimum=1))
        if folder is None:
            return None
        if not isinstance(folder, (str, os.PathLike)) or not str(folder).strip():
            raise ValueError(f"replay_dir: must be a folder (a str or Path), got {validate.describe(folder)}")
        p = Path(folder)
        if p.exists() and not p.is_dir():
            raise ValueError(f"replay_dir: must be a folder, got {str(p)!r} (a file)")
        return cls(p, cap)

    def check_fits(self, shape: tuple[int, int, int], n_scales: int, fold: Any) -> None:
        """``ValueError`` naming ``replay_max_bytes`` when this configuration's reproducer would pass the cap."""
        if fold is not None and not isinstance(fold, (int, np.integer)):
            raise ValueError(f"replay_dir: reproducers take folds as None or block sizes, got {fold!r}")
        size = reproducer_bytes(shape, n_scales)
        if size > self.max_bytes:
            raise ValueError(
                f"replay_max_bytes: a reproducer of shape {tuple(shape)} at {n_scales} input scale(s) takes "
                f"{size} bytes, over the cap of {self.max_bytes}; raise the cap, or check fewer scales or a smaller "
                "shape"
            )


def case_metrics(out: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """Per row: ``worst``, ``max_abs``, ``nmse`` of ``out`` against ``truth`` (the check's columns)."""
    return {"worst": worst_scaled_error(out, truth), "max_abs": max_abs_error(out, truth), "nmse": nmse(out, truth)}


def case_failures(metrics: dict[str, np.ndarray], tolerances: dict[str, Any], scales: list[float]) -> list[str]:
    """What fails one case: each tolerance its rows fail (a NaN fails every one), in words."""
    out = []
    for name, (metric, limit) in tolerances.items():
        for j, v in enumerate(np.asarray(metrics[metric], dtype=np.float64)):
            if not v <= limit:
                out.append(f"the {name} tolerance ({metric} <= {limit:g}) at scale {scales[j]:g}: {metric} {v:.3g}")
    return out


def write_file(where: ReplayDir, stem: str, tensors: dict[str, np.ndarray], meta: dict[str, str]) -> Path:
    """``tensors`` (numpy, their dtypes kept) and ``meta`` as one safetensors file in ``where``,
    named after ``stem`` (made safe; a taken name gets a numbered suffix), written atomically."""
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch) / "case.safetensors"
        mx.save_safetensors(str(tmp), {k: mx.array(np.asarray(v)) for k, v in tensors.items()}, metadata=meta)
        data = tmp.read_bytes()
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem)
    for k in range(1000):
        target = where.folder / (f"{stem}.safetensors" if k == 0 else f"{stem}-{k + 1}.safetensors")
        try:
            return files.write_atomic(target, data, overwrite=False)
        except files.RecordExists:
            continue
    raise ValueError(f"replay_dir: {where.folder} already holds 1000 reproducers named {stem}*; name another folder")


def write_reproducer(
    where: ReplayDir, case: dict[str, Any], branch: np.ndarray, residual: np.ndarray, output: np.ndarray, truth: Any
) -> Path:
    """One case's reproducer in ``where`` (``case``: seed, shape, dtype, fold, quantize, eps,
    scales, tolerances, subject, form, name, failures); a taken name gets a numbered suffix."""
    tensors = {
        "branch": np.asarray(branch, np.float32),
        "residual": np.asarray(residual, np.float32),
        "output": np.asarray(output, np.float32),
        "truth": np.asarray(truth, np.float64),
    }
    meta = {MARK: "1", **{k: json.dumps(v) for k, v in case.items()}}
    h, b, f = case["shape"]
    stem = f"{case['form']}-{h}x{b}x{f}-{case['dtype']}-fold{case['fold']}-q{case['quant_label']}-seed{case['seed']}"
    return write_file(where, stem, tensors, meta)


@dataclass(frozen=True)
class Replay:
    """A reproducer run again: the verdict then and now, whether the output bits are the same."""

    file: Path
    case: str
    failures_then: list[str]
    failures_now: list[str]
    same_bits: bool
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures_now and not self.problems

    @property
    def same_verdict(self) -> bool:
        return self.failures_then == self.failures_now

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        then = "FAIL" if self.failures_then else "PASS"
        lines = [f"{verdict}: replay of {self.file.name} ({self.case})", *("  - " + r for r in self.failures_now)]
        lines += ["  problem: " + p for p in self.problems]
        lines.append(
            f"same verdict as written ({then}): {'yes' if self.same_verdict else 'NO'}; "
            f"same output bits: {'yes' if self.same_bits else 'NO'}"
        )
        return "\n".join(lines)


def read_file(path: Any, names: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A reproducer's case (metadata) and its tensors ``names`` (numpy); ``ValueError`` naming
    ``replay`` for anything else."""
    if not isinstance(path, (str, os.PathLike)) or not Path(path).is_file():
        raise ValueError(f"replay: must be a reproducer file a check wrote, got {validate.describe(path)} (not a file)")
    p = Path(path)
    try:
        check_safetensors_header(p)
        t, meta = mx.load(str(p), return_metadata=True)
    except Exception as e:
        raise ValueError(f"replay: {p.name} is not a readable safetensors file: {e}") from None
    meta = dict(meta or {})
    if meta.get(MARK) != "1":
        raise ValueError(
            f"replay: {p.name} is not a reproducer (no {MARK!r} metadata); a check's replay_dir holds them"
        )
    try:
        case = {k: json.loads(v) for k, v in meta.items() if k != MARK}
        arrays = {k: np.array(t[k]) for k in names}
    except (KeyError, ValueError) as e:
        raise ValueError(f"replay: {p.name} is an incomplete reproducer ({e})") from None
    return case, arrays


#: The metadata value that marks a reproducer of the recurrent step (``step_reproducer.PART``).
STEP_PART = "gdn"


def read_reproducer(path: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A tail reproducer's case (metadata) and tensors; ``ValueError`` naming ``replay`` for
    anything else (a step's reproducer is replayed by ``--part gdn``)."""
    case, _ = read_file(path, ())
    if case.get("part") == STEP_PART:
        raise ValueError(
            f"replay: {Path(path).name} is a reproducer of the recurrent step (written by --part gdn): replay it "
            "with --part gdn and the step (workbench.check.step_replay.replay_step)"
        )
    return read_file(path, ("branch", "residual", "output", "truth"))


def replay(path: Any, subject: Any, *, time_limit: float = 30.0) -> Replay:
    """Run ``subject`` (a callable or a form of :mod:`workbench.check.subjects`, as the check was
    given it) again on the case of the reproducer ``path``: the case regenerated from its seed
    (its inputs verified against the stored ones), the same tolerances judged."""
    case, arrays = read_reproducer(path)
    if not hasattr(subject, "calls"):
        if not callable(subject):
            raise ValueError(
                f"subject: must be a callable or a form of workbench.check, got {validate.describe(subject)}"
            )
        subject = CallableSubject(subject)
    form = getattr(subject, "kind", "callable")
    if form != case["form"]:
        raise ValueError(f"subject: {Path(path).name} was written by a check of a {case['form']}, got a {form}")
    seconds = validate.number("time_limit", time_limit, minimum=0, exclusive_minimum=True)
    shape = check_shape(case["shape"])
    _, spec = quant_spec(case["quantize"])
    config = {"dtype": case["dtype"], "fold": case["fold"], "spec": spec, "eps": float(case["eps"])}
    c = case_arrays(shape, [int(case["seed"])])
    st = blocks.stored_block(c, **config)
    scales = [float(s) for s in case["scales"]]
    scale_arr = np.array(scales, dtype=np.float32)
    B = c.branch[:, None, :] * scale_arr[None, :, None]
    R = c.residual[:, None, :] * scale_arr[None, :, None]
    if not (np.array_equal(B[0], arrays["branch"]) and np.array_equal(R[0], arrays["residual"])):
        raise ValueError(
            f"replay: {Path(path).name}'s inputs are not those its seed regenerates (written by another version?)"
        )
    truth = blocks.truth(st, B, R)
    sc = blocks.case(st, 0, B[0], R[0], case["name"])
    problems: list[str] = []
    calls = callers(subject, seconds)
    try:
        held = [B, R, truth]
        runs = run_block(subject, calls, [sc], c, scales=scales, problems=problems, held=held, rerun=False, **config)
    finally:
        calls.close()
    out = runs.first[0]
    tolerances = {k: tuple(v) for k, v in case["tolerances"].items()}
    now = case_failures(case_metrics(out, truth[0]), tolerances, scales)
    same_bits = np.array_equal(out.view(np.uint32), arrays["output"].astype(np.float32).view(np.uint32))
    return Replay(Path(path), case["name"], list(case["failures"]), now, bool(same_bits), problems)
