"""Communities and Crime with US states as institutions: the one reader both methods use
(GrAUC-PFL: the 0/1 outcome ``high_crime``; RowFed: continuous responses)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError
from . import dataset_path
from .tables import read_table

if TYPE_CHECKING:
    import pandas as pd

#: Columns that are never predictors: identifiers, folds and labels derived from the
#: crime rate (``high_crime``, ``>0.06black``).
NOT_PREDICTORS = (
    "communityname",
    "community",
    "communityCode",
    "county",
    "countyCode",
    "state",
    "fold",
    "high_crime",
    ">0.06black",
)


def crime_states(df: pd.DataFrame) -> np.ndarray:
    """State FIPS code per row, from the one-hot ``state_<FIPS>`` columns (or a ``state``
    column of FIPS codes)."""
    state_cols = [c for c in df.columns if str(c).startswith("state_")]
    if state_cols:
        onehot = df[state_cols].to_numpy()
        bad = np.flatnonzero(onehot.sum(axis=1) != 1)
        if len(bad):
            raise InputError(f"data: state_* columns: row {bad[0] + 2} is not in exactly one state")
        codes = np.array([int(str(c).split("_", 1)[1]) for c in state_cols])
        return codes[onehot.argmax(axis=1)]
    if "state" in df.columns:
        try:
            return df["state"].to_numpy(dtype=np.int64)
        except (TypeError, ValueError):
            raise InputError("data: column 'state' must hold FIPS codes (integers)") from None
    raise InputError("data: needs one-hot state_<FIPS> columns or a 'state' column")


def crime_table(path: str = "") -> tuple[pd.DataFrame, np.ndarray]:
    """The table and each row's state FIPS code.

    ``path``: the normalized copy (one-hot ``state_<FIPS>`` columns) or a file with a
    ``state`` column such as the UCI unnormalized data with its column names; ``?`` is
    read as missing.  Empty: the normalized copy shipped with the package.
    """
    path = path or dataset_path("communities_crime.csv")
    df = read_table(path, "data", na_values="?", dtype={"communityname": str})
    return df, crime_states(df)


def crime_predictors(df: pd.DataFrame, drop: Iterable[str]) -> list[str]:
    """The default predictors: every numeric column but :data:`NOT_PREDICTORS`, the state
    columns and ``drop``.

    Parameters
    ----------
    df : pandas.DataFrame
        The table (:func:`crime_table`).
    drop : iterable of str
        Columns left out besides: the outcome or responses, and what the user excludes.

    Returns
    -------
    list of str
        The predictor columns, in the table's order.
    """
    skip = {*NOT_PREDICTORS, *drop}
    return [
        c
        for c in df.select_dtypes(include="number").columns
        if c not in skip and not str(c).startswith("state_")
    ]


__all__ = ["NOT_PREDICTORS", "crime_predictors", "crime_states", "crime_table"]
