"""Importing mlx-lm (and through it transformers and tokenizers) without transformers' advice.

Without PyTorch, ``import transformers`` logs "PyTorch was not found..." to stderr: true,
and beside the point here (the workbench uses only its tokenizers; mlx-lm runs the
models), yet a notebook shows it as an error-coloured output. Every import of mlx-lm or
transformers in ``real_models`` goes through :func:`without_transformers_advice`, inside
the function that needs it, so ``import workbench`` stays light.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["without_transformers_advice"]


@contextlib.contextmanager
def without_transformers_advice() -> Iterator[None]:
    """Import mlx-lm / transformers without transformers' import-time advice.

    Without PyTorch, ``import transformers`` logs "PyTorch was not found. Models won't be
    available..." to stderr: true, and beside the point here (the workbench uses only its
    tokenizers; mlx-lm runs the models), yet a notebook would show it as an error-coloured
    output. transformers skips its advisory messages while ``TRANSFORMERS_NO_ADVISORY_WARNINGS``
    is set; it is set for the import only and put back after, so the caller's environment
    and transformers' later warnings are untouched.
    """
    key = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
