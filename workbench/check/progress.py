"""A check's progress: cases done of the total, with a rate and an estimate of the time left.

A check at a shipped shape runs for minutes to hours; without a count a user cannot tell a
slow run from a hung one. tqdm's bar says cases done, cases a second and the time left, in a
terminal (on stderr, so a record or a piped verdict on stdout stays clean) and in a notebook
(``tqdm.auto``: a widget there). Off by default in the API (a library call prints nothing
unasked; a notebook's committed outputs stay stable) and on in the command (``--quiet``: off).
"""

from __future__ import annotations

from typing import Any


class Progress:
    """Counts cases done of ``total``; ``show``: draw a bar (else only count)."""

    def __init__(self, total: int, *, show: bool, what: str = "cases"):
        self.total, self.done = int(total), 0
        self.bar: Any = None
        if show:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, unit=" " + what, desc="check", dynamic_ncols=True, smoothing=0.1)

    def add(self, n: int) -> None:
        """``n`` more cases done."""
        self.done += int(n)
        if self.bar is not None:
            self.bar.update(int(n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
