"""Reading input tables: one CSV reader whose every failure is one line naming the field,
and the checks pandas would otherwise hide."""

from __future__ import annotations

import csv
import itertools
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


#: How a data frame held in memory is named where a file path is expected (the Python API
#: hands its data frames to the in-process fit this way, without writing them out).
MEMORY = "memory:"
_FRAMES: dict[str, pd.DataFrame] = {}
_NAMES = itertools.count(1)


def remember(frame: pd.DataFrame) -> str:
    """A name for ``frame`` that :func:`read_table` reads as if it were a CSV file of it
    (until :func:`forget`)."""
    name = f"{MEMORY}{next(_NAMES)}"  # never reused: caches keyed by it cannot go stale
    _FRAMES[name] = frame
    return name


def forget(name: str) -> None:
    _FRAMES.pop(name, None)


def in_memory(path) -> bool:
    """``path`` names a data frame held by :func:`remember`."""
    return isinstance(path, str) and path.startswith(MEMORY)


def as_path(path: str) -> str:
    """``path`` made absolute, unless it names a data frame in memory."""
    import os

    return path if in_memory(path) else os.path.abspath(path)


def _from_memory(path: str, what: str, dtype=None) -> pd.DataFrame:
    """The remembered frame as ``read_csv`` with ``dtype`` would give its CSV file: the
    columns read as text are text (a float by its shortest decimal, which reads back to the
    same float; missing values stay missing unless every column is text, as ``read_csv``
    with ``keep_default_na=False`` would leave them)."""
    if path not in _FRAMES:
        raise InputError(f"{what}: no data frame {path} in memory")
    import numpy as np
    import pandas as pd

    df = _FRAMES[path].copy()
    df.columns = [str(c) for c in df.columns]
    for col in df.columns:  # what a CSV file cannot hold is read as its text
        kind = df[col].dtype.kind
        if kind == "f" and df[col].dtype.itemsize < 8:  # float32: its shortest decimal
            df[col] = df[col].astype(str).astype(np.float64)
        elif kind in "mMcV" or (kind == "O" and "complex" in pd.api.types.infer_dtype(df[col])):
            df[col] = df[col].astype(str)
    if dtype is str:  # every cell as text; a missing one empty (keep_default_na=False)
        df = df.astype(object).where(df.notna(), "").astype(str)
    elif isinstance(dtype, dict):
        for col in dtype:
            if col in df.columns:
                df[col] = df[col].where(df[col].isna(), df[col].astype(str))
    twice = sorted({c for c in df.columns if list(df.columns).count(c) > 1})
    if twice:
        raise InputError(f"{what}: column {twice[0]!r} appears twice in the data frame")
    if df.shape[0] == 0:
        raise InputError(f"{what}: the data frame has no rows")
    return df


def read_table(path: str, what: str, **read_csv) -> pd.DataFrame:
    """A CSV file, or the data frame a name of :func:`remember` stands for.  A missing,
    empty, unparsable or row-less file, or a column named twice, is an :class:`InputError`
    that starts with ``what``.

    Parameters
    ----------
    path : str
        The CSV file, or a name from :func:`remember`.
    what : str
        The setting that named the file.
    **read_csv
        Keyword arguments of ``pandas.read_csv`` (of these, only ``dtype`` applies to a
        data frame in memory).

    Returns
    -------
    pandas.DataFrame
        The table.
    """
    import pandas as pd

    if in_memory(path):
        return _from_memory(path, what, read_csv.get("dtype"))
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
    """The columns as a float matrix; a missing, non-numeric or infinite value is an
    :class:`InputError` naming its column and line.

    Parameters
    ----------
    df : pandas.DataFrame
        The table.
    columns : list of str
        The columns to read, in the matrix's order.
    what : str
        The setting an error starts with.

    Returns
    -------
    ndarray, shape (n, len(columns))
        The values, one row per row of ``df``.
    """
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
    """The first items of a list for a message, `` ...`` when there are more.

    Parameters
    ----------
    items : sequence
        The items.
    most : int, optional
        How many are shown at most.
    quote : bool, optional
        Each is shown by its ``repr`` (else by ``str``).

    Returns
    -------
    str
        The items shown, separated by commas.
    """
    shown = [repr(x) if quote else str(x) for x in list(items)[:most]]
    return ", ".join(shown) + (" ..." if len(items) > most else "")


def stripped_ids(ids: pd.Series, what: str) -> pd.Series:
    """The ids (a site or client column) without spaces around them; when any had some, a
    warning names the first and how many.

    Parameters
    ----------
    ids : pandas.Series
        The column.
    what : str
        The setting and column the warning names, e.g. ``data: column 'site'``.

    Returns
    -------
    pandas.Series
        The ids as text, stripped.
    """
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
