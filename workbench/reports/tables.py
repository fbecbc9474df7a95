"""Tables as text that fits a reading width.

A notebook prints its tables as text, because strict nbval compares text exactly and a
text table reads the same in JupyterLab, in the HTML report and in a terminal. A wide
``DataFrame.to_string()`` is one line per row however wide, and a browser or terminal
then wraps it mid-header (``llama.cpp NM`` / ``SE 5e-3``), which nobody can read.
``fit`` cuts the columns into blocks that each fit the width, repeating the row labels
in every block, so every header stays whole and every row keeps its label.
"""

from __future__ import annotations

import textwrap

import pandas as pd

from workbench.validate import describe, integer

#: The width every table a notebook prints must fit (the notebooks' tests hold it).
WIDTH = 100


def fit(df: pd.DataFrame, *, width: int = WIDTH, index: bool = True, float_format=None) -> str:
    """``df`` as text, its columns cut into blocks no wider than ``width`` characters.

    Each block is ``df[cols].to_string(...)``, so values print exactly as pandas prints
    them (round them first, or pass ``float_format``). With ``index=False`` the first
    column is repeated as the row label in every block. A single column too wide for
    ``width`` is printed alone (it is never cut); blocks are separated by a blank line.
    """
    integer("width", width, minimum=20)
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: must be a pandas DataFrame, got {describe(df)}")
    columns = list(df.columns)
    label: list = []
    if not index:
        if not columns:
            return df.to_string(index=False)
        label, columns = columns[:1], columns[1:]
        if not columns:
            return df.to_string(index=False, float_format=float_format)

    def render(cols: list) -> str:
        return df[label + cols].to_string(index=index, float_format=float_format)

    def fits(text: str) -> bool:
        return max(len(line) for line in text.splitlines()) <= width

    blocks: list[str] = []
    current: list = []
    for col in columns:
        if current and not fits(render(current + [col])):
            blocks.append(render(current))
            current = []
        current.append(col)
    if current or not blocks:
        blocks.append(render(current))
    return "\n\n".join(blocks)


def wrap(text: str, *, width: int = WIDTH, indent: str = "    ") -> str:
    """``text`` with every line longer than ``width`` broken at spaces, continuations indented.

    For the sentences a notebook prints (a rule's explanation, a record's header): lines
    already short enough, and the line breaks ``text`` has, are kept as they are; a word
    longer than the width is left whole rather than cut.
    """
    integer("width", width, minimum=20)
    if not isinstance(text, str):
        raise ValueError(f"text: must be a string, got {describe(text)}")
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        out.append(
            textwrap.fill(
                line,
                width,
                initial_indent="",
                subsequent_indent=lead + indent,
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)
