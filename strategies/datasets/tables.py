"""Reading input tables: one CSV reader whose every failure is one line naming the field,
and the checks pandas would otherwise hide."""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING

from ..errors import InputError, bad_cell

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


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


def read_table(path: str, what: str, **read_csv) -> pd.DataFrame:
    """The CSV file ``path`` (``pandas.read_csv`` with ``read_csv``).  A missing, empty,
    unparsable or row-less file, or a column named twice, is an :class:`InputError` that
    starts with ``what`` (the setting that named the file)."""
    import pandas as pd

    try:
        df = pd.read_csv(path, **read_csv)
    except FileNotFoundError:
        raise InputError(f"{what}: file not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{what}: a directory, not a file: {path}") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{what}: file is empty: {path}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{what}: cannot parse {path}: {first}") from None
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if df.shape[0] == 0:
        raise InputError(f"{what}: file has no rows: {path}")
    twice = repeated_columns(path)
    if twice:
        raise InputError(f"{what}: column {twice[0]!r} appears twice in {path}")
    return df


def numeric_columns(df: pd.DataFrame, columns: list[str], what: str) -> np.ndarray:
    """The columns as a float matrix; a missing or non-numeric value names its column."""
    import numpy as np
    import pandas as pd

    out = np.empty((df.shape[0], len(columns)))
    for k, col in enumerate(columns):
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raw = df[col].iloc[row]
            raise InputError(f"{what}: {bad_cell(col, raw, row)}")
        out[:, k] = values.to_numpy(dtype=float)
    return out


def warn(message: str) -> None:
    """One warning line on the run's log (stderr), as Flower's own."""
    from logging import WARNING

    from flwr.common import log

    log(WARNING, "%s", message)


def named(items, most: int = 8, quote: bool = False) -> str:
    """The first ``most`` of ``items`` for a message, `` ...`` when there are more."""
    shown = [repr(x) if quote else str(x) for x in list(items)[:most]]
    return ", ".join(shown) + (" ..." if len(items) > most else "")


def stripped_ids(ids: pd.Series, what: str) -> pd.Series:
    """The ids (a site or client column) without spaces around them; when any had some, a
    warning names the first and how many (``what``: the setting and column, e.g. ``data:
    column 'site'``)."""
    text = ids.astype(str)
    out = text.str.strip()
    changed = text.ne(out).to_numpy()
    if changed.any():
        first = text[changed].iloc[0]
        warn(
            f"{what}: {int(changed.sum())} id(s) have spaces around them (e.g. {first!r}); "
            f"read as {first.strip()!r}"
        )
    return out
