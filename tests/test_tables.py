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
