"""A measured wait price filed in the wait-price ledger, the one way every bench command does it.

``bench.wait_price`` and ``bench.split_price`` both add what they measured to the ledger
(``workbench.waits.ledger``): one function, so each checks, refuses and says what it filed
and what it replaced the same way, and a refusal is the command's usage error (``--add``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from workbench.waits import LEDGER_PATH, add_price


def add_to_ledger(
    p: argparse.ArgumentParser, entry: dict[str, Any], ledger: str | Path | None, force: bool
) -> dict[str, Any] | None:
    """Put ``entry`` into the wait-price ledger (``wait_ledger.add_price``: checked, under a lock),
    say so, and say what it replaced; a refusal is ``p``'s usage error naming ``--add``."""
    try:
        old = add_price(entry, ledger, replace=force)
    except ValueError as err:
        p.error(f"--add: {err}" + ("" if force else " (--force replaces it)"))
    print(f"added {entry['id']}: {entry['ms']:.4f} ms to {ledger or LEDGER_PATH}")
    if old is not None:
        print(
            f"replaced {old['id']}: {old['ms']:.4f} ms, measured {old.get('date')} "
            f"by {old.get('command', old.get('source'))}"
        )
    return old
