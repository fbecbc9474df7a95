"""The float32 reference's trajectory in a recurrent-step check, stepped on a thread of its own.

Why a thread: a token's reference (``decode.layers.recurrent_step``, MLX ops) costs about what
the float64 truth does (2.7 and 2.2 ms at Bonsai-27B's recurrent geometry on the project's
2-core CPU) and needs nothing of the truth's, so on a second core it runs while the check's
thread steps the truth. ``mx.async_eval`` from the check's own thread overlapped less: it
returns only once at most a few of the graph's tasks are outstanding (measured: it held that
thread about 1 ms of the reference's 2.7), and the graph's making stayed on it. MLX's streams
belong to the thread that makes them, so the reference's arrays are made, stepped and
evaluated on its thread alone; the check reads the evaluated results in place (numpy views
of MLX's memory, never written).

A token's step is handed over after the subject's calls and waited for before the next
token's (:meth:`ReferenceRun.result`): the subject is never called while the reference runs,
so no subject's time includes the check's. The arithmetic is the same ops on the same
inputs as on any other thread, so the same bits (``tests/test_check_gdn_overlap.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from workbench.check.gdn_cases import TokenRun
from workbench.check.gdn_lane import Lane
from workbench.decode.layers import recurrent_step


class ReferenceRun:
    """The float32 reference (``gdn``: ``"ops"`` or ``"fast"``) over ``run``'s sequences, both
    states fed back, on ``lane``'s thread: :meth:`step` hands token t to it, :meth:`result`
    waits for it."""

    def __init__(self, run: TokenRun, gdn: str, lane: Lane) -> None:
        self.run, self.gdn, self.lane = run, gdn, lane
        self._last: Any = None
        self.lane.run(self._setup)
        self.lane.result()

    def _setup(self) -> None:
        r, w = self.run, self.run.weights
        self.consts = [mx.array(a) for a in (w.conv_w, w.a_log, w.dt_bias, w.o_norm)]
        self.conv, self.state = mx.array(r.conv_state), mx.array(r.state)

    def _step(self, t: int, then: Callable[..., Any] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r, w = self.run, self.run.weights
        ba = mx.array(np.concatenate([r.b[:, t], r.a[:, t]], axis=1))
        o, self.conv, self.state = recurrent_step(
            mx.array(r.mixed[:, t]),
            mx.array(r.z[:, t]),
            ba,
            self.conv,
            self.state,
            *self.consts,
            k_heads=w.k_heads,
            eps=w.eps,
            gdn=self.gdn,
        )
        mx.eval(o, self.conv, self.state)
        out = np.asarray(o), np.asarray(self.conv), np.asarray(self.state)
        if then is not None:
            then(*out)
        return out

    def step(self, t: int, then: Callable[..., Any] | None = None) -> None:
        """Token ``t``'s step, on the thread (the tokens in order, each once); ``then(out,
        conv_state, state)`` runs there after it (the check hands the state to its comparison)."""
        self._last = None
        self.lane.run(lambda: self._step(t, then))

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The last step's ``(out [S, Hv Dv], conv_state' [S, K-1, C], state' [S, Hv, Dv, Dk])``
        as float32 numpy views, waited for (asked again, the same arrays); its error raised here."""
        if self._last is None:
            self._last = self.lane.result()
        return self._last
