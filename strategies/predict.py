"""Scoring new rows with a fitted model, for both methods: each row by its own site's
coefficients, read back from the ``coefficients.csv`` a fit wrote.

- GrAUC-PFL: the risk score ``x^T beta_z`` of the row's site ``z`` (input scale; a ranking,
  so no intercept).  Output columns ``row, site, score``.
- RowFed: the predicted responses ``b_m + Theta_m^T x`` of the row's client ``m``
  (``b_m`` the fitted intercept, zero without one).  Output ``row, client, <responses>``.

``row`` is the input's data row number (1 = the first row after the header).  Bad input is
an :class:`~strategies.errors.InputError` naming the field, and nothing is written.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from .datasets.tables import numeric_columns, read_table
from .errors import InputError, bad_cell

#: The label of RowFed's intercept row in its ``coefficients.csv``.
INTERCEPT = "(intercept)"


@dataclass(frozen=True)
class FittedModel:
    """Per-site linear predictors: ``outputs[k] = intercept[z, k] + x @ coef[z, :, k]``."""

    site_column: str
    sites: tuple[str, ...]
    features: tuple[str, ...]
    outputs: tuple[str, ...]
    coef: np.ndarray  # (Z, p, K)
    intercept: np.ndarray  # (Z, K)


def _coefficients_file(model_dir: str) -> str:
    if not os.path.isdir(model_dir):
        raise InputError(f"model: not a directory: {model_dir}")
    path = os.path.join(model_dir, "coefficients.csv")
    if not os.path.isfile(path):
        raise InputError(f"model: no coefficients.csv in {model_dir} (the fit's --out)")
    return path


def read_grauc_model(model_dir: str) -> FittedModel:
    """A GrAUC-PFL fit's ``coefficients.csv``: ``site`` and one column per feature."""
    path = _coefficients_file(model_dir)
    frame = read_table(path, "model", dtype={"site": str})
    if frame.columns[0] != "site" or frame.shape[1] < 2:
        raise InputError(f"model: {path} is not a GrAUC-PFL coefficients file (site, features)")
    features = tuple(str(c) for c in frame.columns[1:])
    beta = numeric_columns(frame, list(features), "model")
    z = len(frame)
    return FittedModel(
        "site", tuple(frame["site"]), features, ("score",), beta[:, :, None], np.zeros((z, 1))
    )


def read_rowfed_model(model_dir: str) -> FittedModel:
    """A RowFed fit's ``coefficients.csv``: ``client, feature`` and one column per
    response; an ``(intercept)`` row per client when one was fitted."""
    path = _coefficients_file(model_dir)
    frame = read_table(path, "model", dtype={"client": str, "feature": str})
    if list(frame.columns[:2]) != ["client", "feature"] or frame.shape[1] < 3:
        raise InputError(f"model: {path} is not a RowFed coefficients file (client, feature, ...)")
    outputs = tuple(str(c) for c in frame.columns[2:])
    values = numeric_columns(frame, list(outputs), "model")
    sites = tuple(dict.fromkeys(frame["client"]))
    is_b = (frame["feature"] == INTERCEPT).to_numpy()
    features = tuple(dict.fromkeys(frame.loc[~is_b, "feature"]))
    coef = np.zeros((len(sites), len(features), len(outputs)))
    intercept = np.zeros((len(sites), len(outputs)))
    site_at = {s: k for k, s in enumerate(sites)}
    feature_at = {f: j for j, f in enumerate(features)}
    for row, (client, feature) in enumerate(zip(frame["client"], frame["feature"], strict=True)):
        if is_b[row]:
            intercept[site_at[client]] = values[row]
        else:
            coef[site_at[client], feature_at[feature]] = values[row]
    if len(frame) - is_b.sum() != len(sites) * len(features):
        raise InputError(f"model: {path} does not list every feature once per client")
    return FittedModel("client", sites, features, outputs, coef, intercept)


def predict(model: FittedModel, data_path: str, ignore: tuple[str, ...] = ()):
    """The outputs for every row of the CSV ``data_path`` (a ``model.site_column`` column
    and the model's features, in any order; columns in ``ignore`` are skipped when there,
    e.g. an outcome).  Returns a ``pandas.DataFrame``: ``row``, the site, the outputs."""
    import pandas as pd

    col = model.site_column
    frame = read_table(data_path, "data", dtype={col: str})
    frame.columns = [str(c).strip() for c in frame.columns]
    if col not in frame.columns:
        raise InputError(f"data: no {col!r} column (each row's {col} picks its coefficients)")
    if frame[col].isna().any():
        row = int(np.flatnonzero(frame[col].isna().to_numpy())[0])
        raise InputError(f"data: {bad_cell(col, None, row)}")
    sites = frame[col].astype(str).str.strip()
    unknown = [s for s in dict.fromkeys(sites) if s not in model.sites]
    if unknown:
        known = ", ".join(model.sites[:8]) + (" ..." if len(model.sites) > 8 else "")
        raise InputError(f"{col}: {unknown[0]!r} is not a {col} of the model ({known})")
    given = [c for c in frame.columns if c != col and c not in ignore]
    missing = [f for f in model.features if f not in given]
    if missing:
        raise InputError(f"features: missing from the data: {', '.join(missing[:5])}")
    extra = [c for c in given if c not in model.features]
    if extra:
        raise InputError(f"features: not in the model: {', '.join(extra[:5])}")
    x = numeric_columns(frame, list(model.features), "data")  # the model's order
    site_at = {s: k for k, s in enumerate(model.sites)}
    z = sites.map(site_at).to_numpy()
    out = model.intercept[z] + np.einsum("np,npk->nk", x, model.coef[z])
    result = pd.DataFrame(out, columns=list(model.outputs))
    result.insert(0, col, sites.to_numpy())
    result.insert(0, "row", np.arange(1, len(frame) + 1))
    return result


def write_csv_atomic(frame, out_path: str) -> str:
    """``frame`` to ``out_path`` through a temporary file beside it (no half-written file);
    returns the absolute path."""
    out_path = os.path.abspath(out_path)
    parent = os.path.dirname(out_path)
    if not os.path.isdir(parent):
        raise InputError(f"out: parent directory does not exist: {parent}")
    if os.path.isdir(out_path):
        raise InputError(f"out: a directory, not a file: {out_path}")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".csv", dir=parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            frame.to_csv(fh, index=False)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out_path


def add_predict_parser(sub, what: str) -> None:
    """The ``predict`` subcommand of a method's command line (:func:`cmd_predict`)."""
    p = sub.add_parser("predict", help=f"{what} for new rows from a fitted model")
    p.add_argument("--model", required=True, help="the fit's output directory")
    p.add_argument("--data", required=True, help="CSV: the site column and the features")
    p.add_argument("--out", required=True, help="CSV to write")


def cmd_predict(args, read_model, ignore_outputs: bool) -> int:
    """``predict``: read the model, score the data, write ``--out``; prints one line."""
    model = read_model(args.model)
    ignore = ("y",) if not ignore_outputs else model.outputs
    result = predict(model, args.data, ignore)
    path = write_csv_atomic(result, args.out)
    n = result[model.site_column].nunique()
    entity = model.site_column + ("" if n == 1 else "s")  # site(s), or RowFed's client(s)
    print(f"predicted {len(result)} rows for {n} {entity}; wrote {path}")
    return 0
