"""The tables of a study: mean and SD per cell and method, the papers' ``mean (sd)``
layout, and the results in grid order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .design import Study, cell_label


def summarize(results: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """Mean and SD over replications per cell and method (the papers' tables).

    Each replication's value is first averaged over its rows (e.g. sites: the mean AUC over
    institutions), ignoring missing values.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results: the design keys, ``method``, ``rep`` and the metrics.
    keys : sequence of str
        The design keys.
    metrics : sequence of str
        The columns summarized.

    Returns
    -------
    pandas.DataFrame
        ``n_reps``, ``<metric>_mean`` and ``<metric>_sd`` (ddof 1) per ``keys`` +
        ``method``, in the results' order (grid order: :func:`order_results`).
    """
    if results.empty:
        return pd.DataFrame(columns=[*keys, "method", "n_reps"])
    by_rep = list(keys) + ["method", "rep"]
    per_rep = results.groupby(by_rep, sort=False, dropna=False)[list(metrics)].mean()
    per_rep = per_rep.reset_index()
    grouped = per_rep.groupby(list(keys) + ["method"], sort=False, dropna=False)
    out = grouped.size().rename("n_reps").to_frame()
    for m in metrics:
        out[f"{m}_mean"] = grouped[m].mean()
        out[f"{m}_sd"] = grouped[m].std(ddof=1)
    return out.reset_index()


def summary_table(summary: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]):
    """The papers' layout: one row per cell, one column per metric and method holding
    ``mean (sd)`` to 4 significant digits.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`summarize`'s table.
    keys : sequence of str
        The design keys.
    metrics : sequence of str
        The metrics summarized.

    Returns
    -------
    pandas.DataFrame
        The design keys, then a column per metric and method: named by the method for one
        metric, ``<metric>:<method>`` for several.
    """
    if summary.empty:
        return pd.DataFrame(columns=list(keys))

    def cell(mean, sd) -> str:
        if not np.isfinite(mean):
            return ""
        fmt = ".4g"
        return f"{mean:{fmt}}" + (f" ({sd:{fmt}})" if np.isfinite(sd) else "")

    methods = list(dict.fromkeys(summary["method"]))
    frame = summary.assign(
        **{
            f"_{m}": [
                cell(a, b) for a, b in zip(summary[f"{m}_mean"], summary[f"{m}_sd"], strict=True)
            ]
            for m in metrics
        }
    )
    wide = frame.pivot_table(
        index=list(keys),
        columns="method",
        values=[f"_{m}" for m in metrics],
        aggfunc="first",
        sort=False,
    )
    cols = [(f"_{m}", meth) for m in metrics for meth in methods if (f"_{m}", meth) in wide.columns]
    wide = wide[cols]
    wide.columns = [meth if len(metrics) == 1 else f"{m[1:]}:{meth}" for m, meth in cols]
    return wide.reset_index()


def order_results(results: pd.DataFrame, cells: list[dict], keys: Sequence[str]) -> pd.DataFrame:
    """Rows in grid order (cells of this config first, others after), then rep.

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results.
    cells : list of dict
        The config's cells, in grid order.
    keys : sequence of str
        The design keys.

    Returns
    -------
    pandas.DataFrame
        The rows reordered (stable within a cell and rep), with a fresh index.
    """
    if results.empty:
        return results
    rank = {cell_label(c): k for k, c in enumerate(cells)}
    frame = results[list(keys)].drop_duplicates()
    labels = [
        cell_label(dict(zip(keys, row, strict=True))) for row in frame.itertuples(index=False)
    ]
    frame = frame.assign(_cell=[rank.get(lb, len(rank)) for lb in labels])
    results = results.assign(_pos=np.arange(len(results))).merge(frame, on=list(keys), how="left")
    results = results.sort_values(["_cell", "rep", "_pos"], kind="stable")
    return results.drop(columns=["_cell", "_pos"]).reset_index(drop=True)


def normalize_types(results: pd.DataFrame, study: Study) -> pd.DataFrame:
    """Design columns as their declared types (CSV round trips turn 50 into 50.0 when a
    column is empty somewhere).

    Parameters
    ----------
    results : pandas.DataFrame
        The study's results; changed in place.
    study : Study
        The study (its design keys and their types): ``int`` keys become ``int64``.

    Returns
    -------
    pandas.DataFrame
        ``results``.
    """
    for k in study.keys:
        if k in results.columns and study.types[k] is int:
            results[k] = results[k].astype("int64")
    return results
