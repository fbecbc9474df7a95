"""``tables.fit``: wide tables cut into whole-header blocks that fit the width."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.reports.tables import WIDTH, fit, wrap


def _wide(n_cols: int = 9) -> pd.DataFrame:
    cols = {f"llama.cpp NMSE {i}e-3 criterion": np.linspace(0, 1, 4) + i for i in range(n_cols)}
    return pd.DataFrame(cols, index=pd.Index(["bfloat16", "float16", "float32", "int8"], name="dtype")).round(3)


def test_every_line_fits_and_every_header_and_value_is_whole():
    df = _wide()
    text = fit(df)
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    for col in df.columns:
        assert text.count(col) == 1  # each header once, never cut across lines
    blocks = text.split("\n\n")
    assert len(blocks) > 1
    for block in blocks:  # every block keeps the row labels
        for label in df.index:
            assert label in block
    # The values read back, row by row across the blocks, equal the frame's.
    read: dict[str, list[float]] = {label: [] for label in df.index}
    for block in blocks:
        for line in block.splitlines()[2:]:  # below the header and the index-name line
            label, *values = line.split()
            read[label] += [float(v) for v in values]
    np.testing.assert_array_equal(np.array([read[label] for label in df.index]), df.to_numpy())


def test_a_narrow_table_is_to_string_unchanged():
    df = _wide(2)
    assert fit(df) == df.to_string()
    assert fit(df.reset_index(), index=False) == df.reset_index().to_string(index=False)


def test_without_index_the_first_column_labels_every_block():
    df = _wide().reset_index()
    blocks = fit(df, index=False).split("\n\n")
    assert len(blocks) > 1 and all(b.splitlines()[0].split()[0] == "dtype" for b in blocks)


def test_a_column_wider_than_the_width_is_printed_alone_not_cut():
    df = pd.DataFrame({"x": ["a" * 150], "y": [1]})
    text = fit(df)
    assert "a" * 150 in text


@pytest.mark.parametrize("width", [0, 19, 2.5, True])
def test_bad_width_names_the_parameter(width):
    with pytest.raises(ValueError, match="width: must be"):
        fit(_wide(), width=width)


def test_not_a_frame_is_refused():
    with pytest.raises(ValueError, match="df: must be a pandas DataFrame, got"):
        fit([[1, 2]])


def test_wrap_breaks_only_long_lines_and_keeps_every_word():
    long = "stage 1 -> host floor: " + " ".join(f"word{i}" for i in range(40))
    text = "short line\n" + long + "\n  indented " + "x " * 60
    out = wrap(text)
    assert all(len(line) <= WIDTH for line in out.splitlines())
    assert out.splitlines()[0] == "short line"
    assert out.split() == text.split()  # nothing dropped, nothing cut
    assert out.splitlines()[2].startswith("    word")  # a continuation is indented


def test_wrap_leaves_a_word_longer_than_the_width_whole():
    word = "y" * 130
    assert word in wrap("a " + word)


def test_wrap_refuses_a_non_string():
    with pytest.raises(ValueError, match="text: must be a string, got"):
        wrap(3)
