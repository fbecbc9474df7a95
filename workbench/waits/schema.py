"""What the plan's file and the ledger's file share: strict JSON, and the name of a wait.

Both files are read strictly, so a typo is an error, not a number: an object has every
required key and no unknown one, text is a non-empty string, and every error names the
file, the place in it and the field (:func:`where`). A wait is named by its *split kind*,
the kinds of submission on either side of it (``"<end>[>host]|<start>"``): the plan counts
a token's waits by kind and the ledger prices them by kind, so both check the name here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.validate import describe

#: The kind of the token's last wait (the host reads the logits and picks the next token).
FINAL_SPLIT = "logits|host"

#: The pieces a split kind names on either side of a wait.
SPLIT_PIECES = ("layer", "qkv", "attention", "wo", "ffn", "logits")

#: The marker of a split after which the host reads the result (the unfused or refused
#: tail's x after wo and after the FFN; Q/K/V for the host's attention).
HOST_READ = ">host"


def where(source: str, *parts: str) -> str:
    """A place in a file, for an error: ``"<file>: stages[2] ('fuse'): rules"``."""
    return ": ".join((source, *parts))


def read_json(path: Path, what: str) -> Any:
    """``path`` parsed, or a ValueError naming the file (missing, empty, not JSON)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"path: {what} file {path} does not exist") from None
    except OSError as err:
        raise ValueError(f"path: cannot read {what} file {path} ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"path: {what} file {path} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"path: {what} file {path} is not valid JSON ({err}); it holds {len(text)} characters"
        ) from None


def strict_object(name: str, obj: Any, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping[str, Any]:
    """``obj`` as a mapping with every required key and no unknown one, or a ValueError naming them."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"{name}: must be a JSON object, got {describe(obj)}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ValueError(f"{name}: lacks {missing}; required: {list(required)}")
    unknown = sorted(str(k) for k in obj if k not in required and k not in optional)
    if unknown:
        raise ValueError(f"{name}: unknown keys {unknown}; allowed: {sorted([*required, *optional])}")
    return obj


def text(name: str, value: Any, *, nullable: bool = False) -> str | None:
    """``value`` if it is a non-empty string (or None, when ``nullable``), else a ValueError naming ``name``."""
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value.strip():
        allowed = "a non-empty string" + (" or null" if nullable else "")
        raise ValueError(f"{name}: must be {allowed}, got {describe(value)}")
    return value


def texts(name: str, value: Any) -> tuple[str, ...]:
    """``value``, a list of non-empty strings, as a tuple; else a ValueError naming ``name`` (and the item)."""
    if not isinstance(value, list):
        raise ValueError(f"{name}: must be a list of strings, got {describe(value)}")
    return tuple(text(f"{name}[{i}]", v) for i, v in enumerate(value))


def check_split_kind(name: str, kind: Any) -> str:
    """``kind`` if it is a split kind (``"<piece>[>host]|<piece>"`` or :data:`FINAL_SPLIT`),
    else a ValueError naming ``name``."""
    if isinstance(kind, str) and (kind == FINAL_SPLIT or kind.count("|") == 1):
        end, start = kind.split("|")
        end = end[: -len(HOST_READ)] if end.endswith(HOST_READ) else end
        if kind == FINAL_SPLIT or (end in SPLIT_PIECES and start in SPLIT_PIECES):
            return kind
    raise ValueError(
        f"{name}: must be a split kind '<end>[{HOST_READ}]|<start>' with pieces in {SPLIT_PIECES}, "
        f"or {FINAL_SPLIT!r}; got {describe(kind)}"
    )
