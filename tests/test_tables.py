"""The one CSV reader of both methods: every failure is one line that starts with the setting
that named the file."""

from __future__ import annotations

import pytest

from strategies.datasets.tables import read_table
from strategies.errors import InputError


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "data: file not found"),
        ("", "data: file is empty"),
        ("y,x1\n", "data: file has no rows"),
        ("y,x1,x1\n0,1,2\n", "data: column 'x1' appears twice"),
        ('y,x1\n0,"1\n', "data: cannot parse"),
    ],
)
def test_each_failure_names_the_setting(tmp_path, content, words):
    path = tmp_path / "d.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as err:
        read_table(str(path), "data")
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_a_directory_is_named_as_such(tmp_path):
    with pytest.raises(InputError, match="sites: a directory, not a file"):
        read_table(str(tmp_path), "sites")


def test_a_good_file_is_read(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,x1\n0,1.5\n1,2.5\n")
    df = read_table(str(path), "data")
    assert list(df.columns) == ["y", "x1"] and df["x1"].sum() == 4.0


def test_messages_show_plain_values_and_file_lines():
    """Messages print numbers as numbers (no numpy repr), call inf infinite, and count rows
    as the file's lines (the header is line 1)."""
    import numpy as np

    from strategies.errors import bad_cell, file_line, plain

    assert [plain(v) for v in (np.int64(2), np.float64(3.0), 0.5, np.float64("nan"))] == [
        "2",
        "3",
        "0.5",
        "NaN",
    ]
    assert (plain(np.inf), plain(-np.inf), plain("a b"), plain(True)) == (
        "infinite",
        "-infinite",
        "'a b'",
        "True",
    )
    assert file_line(0) == "line 2 of the file"
    assert (
        bad_cell("x1", "abc", 7)
        == "column 'x1' has a non-numeric value ('abc') at line 9 of the file"
    )
    assert bad_cell("x1", " inf", 0) == "column 'x1' has an infinite value at line 2 of the file"
    assert bad_cell("x1", "-Infinity", 1).startswith("column 'x1' has an infinite value")
    for missing in ("", " ", "NA", "nan", "?", None, float("nan")):
        assert bad_cell("y", missing, 3) == "column 'y' has a missing value at line 5 of the file"


def test_warnings_name_the_first_few_and_say_how_many(caplog):
    """The small-fold warning names at most eight sites and says how many there are."""
    from conftest import flwr_warnings

    from strategies.datasets.tables import named
    from strategies.stats.tuning import warn_small_folds

    assert named(["a", "b"]) == "a, b"
    assert named(list("abcdefghij"), quote=True).endswith("'h' ...")
    _, warned = flwr_warnings(
        caplog, lambda: warn_small_folds([f"S{k}" for k in range(10)], "site", "rows", "AUCs")
    )
    assert warned == [
        "cv: 10 site(s) have fewer than 10 validation rows per fold (S0, S1, S2, S3, S4, S5, "
        "S6, S7 ...); their fold AUCs are noisy (the pooled criterion takes all folds together)"
    ]
    assert flwr_warnings(caplog, lambda: warn_small_folds([], "site", "rows", "AUCs"))[1] == []
