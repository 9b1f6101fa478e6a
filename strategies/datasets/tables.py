"""Checks on input tables that pandas would otherwise hide."""

from __future__ import annotations

import csv


def repeated_columns(path: str) -> list[str]:
    """Column names that appear more than once in the header of the CSV file ``path``
    (pandas renames the second ``x`` to ``x.1`` and reads on)."""
    try:
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
            header = next(csv.reader(fh), [])
    except OSError:
        return []
    names = [name.strip() for name in header]
    return sorted({name for name in names if names.count(name) > 1})
