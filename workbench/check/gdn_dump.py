"""An engine's dump of a Gated DeltaNet step over a run of tokens, read and judged.

One safetensors file a layer's run (docs/DUMP_LAYOUT.md, with a numpy writer): the layer's
weights ``conv_w`` [K, C], ``a_log`` and ``dt_bias`` [Hv], ``o_norm`` [Dv]; for S sequences
of T tokens the inputs ``mixed`` [S, T, C], ``z`` [S, T, Hv Dv], ``b`` and ``a`` [S, T, Hv];
the states before the first token ``conv_state`` [S, K-1, C] and ``state`` [S, Hv, Dv, Dk];
what the engine gave a token, ``out`` [S, T, Hv Dv], ``conv_state_out`` [S, T, K-1, C] and
``state_out`` [S, T, Hv, Dv, Dk]. Metadata ``eps`` (required), ``k_heads`` (optional: Hk,
else read from C = 2 Hk Dk + Hv Dv), ``model`` and ``layer``. The float64 truth and the
workbench's float32 reference re-run the dumped inputs from the dumped initial states, so
the engine's error is judged token by token as the recurrent check judges a step
(:func:`check_step_dump`). The files are only read; every problem names the file and key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from workbench import validate
from workbench.check import verdict as verdict_mod
from workbench.check.dump import DumpError, dump_files
from workbench.check.gdn_faults import GDN_FAULTS, StepWeights
from workbench.check.gdn_report import StepReport, condition_frame
from workbench.check.gdn_subjects import StepInputs
from workbench.kernels.gdn_step import GdnShape

#: The tensors of a step's dump: the weights, the inputs a token, the initial states, what the engine gave.
WEIGHTS = ("conv_w", "a_log", "dt_bias", "o_norm")
INPUTS = ("mixed", "z", "b", "a")
STATES = ("conv_state", "state")
RESULTS = ("out", "conv_state_out", "state_out")
TENSORS = WEIGHTS + INPUTS + STATES + RESULTS


@dataclass(frozen=True)
class DumpedRun:
    """One file: ``shape``, the weights (one set, as dumped), inputs and initial states, the
    engine's results (``tensors``: name -> float32 array, names of :data:`TENSORS`), ``eps``
    and the metadata."""

    path: Path
    shape: GdnShape
    tensors: dict[str, np.ndarray]
    eps: float
    meta: dict[str, str]

    @property
    def sequences(self) -> int:
        return int(self.tensors["mixed"].shape[0])

    @property
    def tokens(self) -> int:
        return int(self.tensors["mixed"].shape[1])


def _tensor(path: Path, t: Mapping[str, Any], name: str, ndim: int, what: str) -> np.ndarray:
    if name not in t:
        raise DumpError(f"{path.name}: tensor {name!r} is missing ({what})")
    a = t[name]
    if not mx.issubdtype(a.dtype, mx.floating):
        raise DumpError(f"{path.name}: tensor {name!r} has dtype {a.dtype}, expected a float dtype ({what})")
    if a.ndim != ndim:
        raise DumpError(f"{path.name}: tensor {name!r} has shape {tuple(a.shape)}, expected {what}")
    return np.array(a.astype(mx.float32))


def _geometry(path: Path, ts: dict[str, np.ndarray], meta: Mapping[str, str]) -> GdnShape:
    kw, c = ts["conv_w"].shape
    hv, dv = len(ts["a_log"]), len(ts["o_norm"])
    dk = ts["state"].shape[-1]
    if kw < 2:
        raise DumpError(f"{path.name}: tensor 'conv_w' has shape {ts['conv_w'].shape}, expected [K, C] with K >= 2")
    hk2 = c - hv * dv
    if dk < 1 or hk2 <= 0 or hk2 % (2 * dk) or hv % (hk2 // (2 * dk)):
        raise DumpError(
            f"{path.name}: tensor 'conv_w' has {c} channels; with Hv {hv} ('a_log'), Dv {dv} ('o_norm') and Dk {dk} "
            "('state') the layout needs C = 2 Hk Dk + Hv Dv, Hv a multiple of Hk"
        )
    hk = hk2 // (2 * dk)
    if "k_heads" in meta and meta["k_heads"] != str(hk):
        raise DumpError(f"{path.name}: metadata 'k_heads' is {meta['k_heads']!r}, but the tensors' widths give Hk {hk}")
    return GdnShape(hk, hv, dk, dv, kw)


def read_run(path: str | Path) -> DumpedRun:
    """One dump file, checked against the layout (:class:`~workbench.check.dump.DumpError`
    names the file and the tensor or metadata key)."""
    path = Path(path)
    try:  # the header checked against the file before MLX reads it, as the tail's reader does
        from workbench.real_models.safetensors_header import check_safetensors_header

        check_safetensors_header(path)
        t, meta = mx.load(str(path), return_metadata=True)
        meta = dict(meta or {})
    except Exception as e:
        raise DumpError(f"{path.name}: not a readable safetensors file: {e}") from None
    if "eps" not in meta:
        raise DumpError(f"{path.name}: metadata 'eps' is missing (the RMS norm's eps, a number)")
    try:
        eps = float(meta["eps"])
    except ValueError:
        eps = math.nan
    if not (math.isfinite(eps) and eps > 0):
        raise DumpError(f"{path.name}: metadata 'eps' must be a finite number > 0, got {meta['eps']!r}")
    dims = {"conv_w": (2, "[K, C]"), "a_log": (1, "[Hv]"), "dt_bias": (1, "[Hv]"), "o_norm": (1, "[Dv]")}
    dims |= {"state": (4, "[S, Hv, Dv, Dk]"), "mixed": (3, "[S, T, C]")}
    ts = {k: _tensor(path, t, k, n, w) for k, (n, w) in dims.items()}
    s = _geometry(path, ts, meta)
    n, tokens = ts["mixed"].shape[:2]
    want = {
        "conv_w": (s.kw, s.channels),
        "a_log": (s.hv,),
        "dt_bias": (s.hv,),
        "o_norm": (s.dv,),
        "mixed": (n, tokens, s.channels),
        "z": (n, tokens, s.vd),
        "b": (n, tokens, s.hv),
        "a": (n, tokens, s.hv),
        "conv_state": (n, s.kw - 1, s.channels),
        "state": (n, s.hv, s.dv, s.dk),
        "out": (n, tokens, s.vd),
        "conv_state_out": (n, tokens, s.kw - 1, s.channels),
        "state_out": (n, tokens, s.hv, s.dv, s.dk),
    }
    if n < 1 or tokens < 1:
        raise DumpError(f"{path.name}: tensor 'mixed' has shape {ts['mixed'].shape}: no sequence or no token")
    for k, shape in want.items():
        if k not in ts:
            ts[k] = _tensor(path, t, k, len(shape), "[" + ", ".join(map(str, shape)) + "]")
        if ts[k].shape != shape:
            raise DumpError(f"{path.name}: tensor {k!r} has shape {ts[k].shape}, expected {shape}")
        if k not in RESULTS and not np.isfinite(ts[k]).all():
            raise DumpError(f"{path.name}: tensor {k!r} is not finite (NaN or inf): the truth cannot start from it")
    return DumpedRun(path, s, ts, eps, meta)


class DumpedSteps:
    """The engine's dumped results replayed as a step: sequence ``i``'s call returns its token's
    ``out``, ``conv_state_out`` and ``state_out`` whatever it is handed (the check compares them
    with the truth re-run from the dumped inputs and initial states)."""

    kind = "dump"

    def __init__(self, run: DumpedRun, labels: Sequence[str]) -> None:
        self.name = run.path.name
        self._run, self._index = run, {lab: i for i, lab in enumerate(labels)}

    def layer(self, shape: GdnShape, consts: Mapping[str, np.ndarray], eps: float) -> Callable[[StepInputs], Any]:
        t = self._run.tensors

        def call(step: StepInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            i, k = self._index[step.case], step.token
            return t["out"][i, k], t["conv_state_out"][i, k], t["state_out"][i, k]

        return call


def _horizons(horizons: Any) -> list[int]:
    return sorted({validate.integer("horizons", h, minimum=1) for h in validate.sequence("horizons", horizons)})


def _failing_files(rep: StepReport, unread: list[str], user: float | None) -> str | None:
    """The files whose runs fail (past the reference rule or the user's tolerance, or no usable
    result), and the unreadable ones: every failing file by name, in one reason."""
    last = rep.horizons[-1]
    worst, ref = rep.curves["worst"][:, :last].max(axis=1), rep.curves["ref_worst"][:, :last].max(axis=1)
    bad = ~(worst <= verdict_mod.RATIO * ref) | (~(worst <= user) if user is not None else False)
    files = rep.runs["file"].to_numpy()
    named = [f"{f} ({int(bad[files == f].sum())} of {int((files == f).sum())} runs)" for f in dict.fromkeys(files[bad])]
    named += [p.split(": ", 1)[0] + " (not read)" for p in unread]
    return f"failing files: {', '.join(named)}" if named else None


def check_step_dump(
    path: Any,
    *,
    horizons: Sequence[int] = (1, 16, 256, 4096),
    tolerance: float | None = None,
    flake_rate: float = 1e-3,
    faults: Sequence[str] = tuple(GDN_FAULTS),
) -> StepReport:
    """Check the runs an engine dumped (a file, or a folder of ``*.safetensors``): each file's
    sequences against the float64 truth and the float32 reference re-run from its inputs and
    initial states, the fault models beside them; a verdict at each of ``horizons`` (the
    run's length always among them). Every file must hold runs of one length (the first
    read file's); a file that does not follow the layout is named and the others checked."""
    from workbench.check.gdn_cases import TokenRun
    from workbench.check.gdn_run import run_condition

    user = None if tolerance is None else validate.number("tolerance", tolerance, minimum=0)
    flake_rate = validate.number("flake_rate", flake_rate, minimum=0, exclusive_minimum=True, maximum=0.5)
    flt = validate.sequence("faults", faults, what=f"fault names of {tuple(GDN_FAULTS)}", non_empty=False)
    for f in flt:
        validate.one_of("faults", f, tuple(GDN_FAULTS))
    given = _horizons(horizons)
    frames, problems, unread, tokens = [], [], [], None
    for file in dump_files(path):
        try:
            run = read_run(file)
            if tokens is not None and run.tokens != tokens:
                raise DumpError(
                    f"{file.name}: tensor 'mixed' holds {run.tokens} tokens, the first file read {tokens}: "
                    "one check compares runs of one length"
                )
        except DumpError as e:
            unread.append(str(e))
            continue
        tokens, s, ts, n = run.tokens, run.shape, run.tensors, run.sequences
        w = StepWeights(*(np.repeat(ts[k][None], n, axis=0) for k in WEIGHTS), eps=run.eps, k_heads=s.hk)
        tr = TokenRun(s, np.arange(n), w, *(ts[k] for k in INPUTS), *(ts[k] for k in STATES))
        labels = [f"file {file.name} sequence {i}" for i in range(n)]
        err = run_condition(DumpedSteps(run, labels), tr, labels, flt, problems)
        geo = f"{s.hk}/{s.hv}/{s.dk}/{s.dv}/{s.kw}"
        frames.append(condition_frame({"file": file.name, "geometry": geo}, np.arange(n), err))
    if not frames:
        raise ValueError(f"path: no dump file could be read: {'; '.join(unread) or 'none found'}")
    tokens = tokens or 1
    hs = [*(h for h in given if h < tokens), tokens]
    rep = StepReport.build(str(path), "dump", frames, hs, unread + problems, user, flake_rate)
    if not rep.passed:
        named = _failing_files(rep, unread, user)
        if named:
            rep.reasons.append(named)
    return rep
