"""Scoring new rows with a fitted model, for both methods: each row by its own site's
coefficients, read back from the ``coefficients.csv`` a fit wrote.

- GrAUC-PFL: the risk score ``x^T beta_z`` of the row's site ``z`` (input scale; a ranking,
  so no intercept).  Output columns ``row, site, score``.
- RowFed: the predicted responses ``b_m + Theta_m^T x`` of the row's client ``m``
  (``b_m`` the fitted intercept, zero without one).  Output ``row, client, <responses>``.

``row`` is the input's data row number (1 = the first row after the header).  Bad input is
an :class:`~strategies.errors.InputError` naming the field, and nothing is written.

A site that was not in the federation (a new hospital) can be scored where its method knows
where the sites are (GrAUC-PFL): its coefficients are made from the fitted sites' by one of
:data:`NEW_SITE_RULES` (docs/methods.md 3.13); the method supplies the neighbours and their
weights, :func:`fused_center` and :func:`combine` make the coefficients.  Such a site's
rows are marked ``extrapolated`` in the output.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..datasets.tables import numeric_columns, read_table
from ..errors import InputError, bad_cell

#: The label of RowFed's intercept row in its ``coefficients.csv``.
INTERCEPT = "(intercept)"

#: How a site outside the federation gets its coefficients (docs/methods.md 3.13):
#: ``nearest`` (the default: best on average over the left-out-site study,
#: docs/studies.md), the nearest fitted site's; ``graph``, the fitted penalty's own answer
#: for a site without rows joined to the fit's graph (a weighted median of its graph
#: neighbours); ``inverse-distance``, the mean of the :data:`IDW_NEIGHBOURS` nearest sites'
#: weighted by ``1 / distance``.
NEW_SITE_RULES = ("nearest", "graph", "inverse-distance")
IDW_NEIGHBOURS = 3


@dataclass(frozen=True)
class FittedModel:
    """Per-site linear predictors: ``outputs[k] = intercept[z, k] + x @ coef[z, :, k]``."""

    site_column: str
    sites: tuple[str, ...]
    features: tuple[str, ...]
    outputs: tuple[str, ...]
    coef: np.ndarray  # (Z, p, K)
    intercept: np.ndarray  # (Z, K)
    new_sites: tuple[str, ...] = ()  # sites outside the federation, appended (extrapolated)

    def with_new_sites(self, sites: Sequence[str], coef: np.ndarray) -> FittedModel:
        """This model with ``sites`` (not fitted) appended.

        Parameters
        ----------
        sites : sequence of str
            The sites outside the federation.
        coef : ndarray, shape (n, p)
            Their coefficients: a single output, no intercept.

        Returns
        -------
        FittedModel
            A new model, the sites also in its ``new_sites``.
        """
        coef = np.asarray(coef, dtype=float).reshape(len(sites), len(self.features), 1)
        return FittedModel(
            self.site_column,
            self.sites + tuple(sites),
            self.features,
            self.outputs,
            np.concatenate([self.coef, coef]),
            np.concatenate([self.intercept, np.zeros((len(sites), self.intercept.shape[1]))]),
            self.new_sites + tuple(sites),
        )


@dataclass(frozen=True)
class Borrowed:
    """Where a new site's coefficients came from: the fitted sites (indices into the
    model's ``sites``), their distances in km and the weights the rule gave them."""

    site: str
    sources: tuple[int, ...]
    distance_km: tuple[float, ...]
    weights: tuple[float, ...]


def weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Column-wise minimizer of ``sum_u w_u |b - values[u]|``: the weighted median; where
    the minimizers form an interval (the weight below a value is exactly half), its
    midpoint.

    Parameters
    ----------
    values : ndarray, shape (N, d)
        The values.
    weights : ndarray, shape (N,)
        Their weights, positive.

    Returns
    -------
    ndarray, shape (d,)
        The weighted median of each column.
    """
    values = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    order = np.argsort(values, axis=0, kind="stable")
    v = np.take_along_axis(values, order, axis=0)
    cum = np.cumsum(w[order], axis=0)
    half = 0.5 * w.sum()
    tol = 1e-12 * w.sum()
    i = np.argmax(cum >= half - tol, axis=0)  # the first value with half the weight below
    cols = np.arange(v.shape[1])
    lo = v[i, cols]
    tie = np.abs(cum[i, cols] - half) <= tol
    hi = v[np.minimum(i + 1, len(v) - 1), cols]
    return np.where(tie, 0.5 * (lo + hi), lo)


def geometric_median(
    values: np.ndarray, weights: np.ndarray, tol: float = 1e-12, max_iter: int = 10_000
) -> np.ndarray:
    """Minimizer of ``sum_u w_u ||b - values[u]||_2`` (Weiszfeld's iteration, with the
    optimality test at a data point: ``values[j]`` is the answer when the weighted unit
    vectors toward the others sum to at most ``w_j``).

    Parameters
    ----------
    values : ndarray, shape (N, d)
        The points.
    weights : ndarray, shape (N,)
        Their weights, positive.
    tol : float, optional
        The iteration stops when a step is at most ``tol max(1, max|values|)``.
    max_iter : int, optional
        The most iterations.

    Returns
    -------
    ndarray, shape (d,)
        The geometric median (the last iterate after ``max_iter``).
    """
    values = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    for j in range(len(values)):  # a data point is optimal when the pull of the rest is weak
        diff = values - values[j]
        norm = np.linalg.norm(diff, axis=1)
        away = norm > 0
        pull = (w[away, None] * diff[away] / norm[away, None]).sum(axis=0)
        if np.linalg.norm(pull) <= w[~away].sum() * (1 + 1e-12):
            return values[j].copy()
    b = (w[:, None] * values).sum(axis=0) / w.sum()
    scale = max(1.0, float(np.abs(values).max()))
    for _ in range(max_iter):
        dist = np.maximum(np.linalg.norm(values - b, axis=1), 1e-300)
        a = w / dist
        new = (a[:, None] * values).sum(axis=0) / a.sum()
        if np.linalg.norm(new - b) <= tol * scale:
            return new
        b = new
    return b


def fused_center(values: np.ndarray, weights: np.ndarray, penalty: str = "l1") -> np.ndarray:
    """``argmin_b sum_u w_u ||b - values[u]||`` (the fused penalty's answer for a site with
    no rows joined to the sites ``u``).

    Parameters
    ----------
    values : ndarray, shape (N, d)
        The sites' coefficients.
    weights : ndarray, shape (N,)
        Their weights, positive.
    penalty : {"l1", "group"}, optional
        ``group``: the :func:`geometric_median` of whole vectors; otherwise the
        :func:`weighted_median` coordinate by coordinate.

    Returns
    -------
    ndarray, shape (d,)
        The minimizer.
    """
    if penalty == "group":
        return geometric_median(values, weights)
    return weighted_median(values, weights)


def combine(
    values: np.ndarray, weights: np.ndarray, rule: str, penalty: str = "l1", scale=None
) -> np.ndarray:
    """A new site's coefficients from its neighbours' coefficients and the rule's weights.

    Parameters
    ----------
    values : ndarray, shape (N, p)
        The neighbours' coefficients.
    weights : ndarray, shape (N,)
        The rule's weights.
    rule : {"nearest", "graph", "inverse-distance"}
        ``graph``: :func:`fused_center`; otherwise the weighted mean.
    penalty : {"l1", "group"}, optional
        The fit's penalty, for ``graph``.
    scale : ndarray, shape (p,), optional
        For ``graph``: the center is taken of ``values * scale`` (the fit's working scale,
        where the penalty is not coordinate-wise) and divided back; default 1.

    Returns
    -------
    ndarray, shape (p,)
        The new site's coefficients.
    """
    if rule not in NEW_SITE_RULES:
        raise InputError(f"new-site-rule: must be one of {', '.join(NEW_SITE_RULES)}, got {rule!r}")
    values = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    if rule != "graph":
        return (w[:, None] * values).sum(axis=0) / w.sum()
    s = np.ones(values.shape[1]) if scale is None else np.asarray(scale, dtype=float)
    return fused_center(values * s, w, penalty) / s


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


def predict(model: FittedModel, data_path: str, ignore: tuple[str, ...] = (), every_row: str = ""):
    """The outputs for every row of a CSV.

    Parameters
    ----------
    model : FittedModel
        The model.
    data_path : str
        The CSV: a ``model.site_column`` column and the model's features, in any order.
    ignore : tuple of str, optional
        Columns skipped when there, e.g. an outcome.
    every_row : str, optional
        Without the site column, every row is this site's (when given).

    Returns
    -------
    pandas.DataFrame
        ``row``, the site, the outputs, and ``extrapolated`` when the model has sites
        outside the federation.
    """
    import pandas as pd

    col = model.site_column
    frame = read_table(data_path, "data", dtype={col: str})
    frame.columns = [str(c).strip() for c in frame.columns]
    if col not in frame.columns and every_row:
        frame.insert(0, col, every_row)
    if col not in frame.columns:
        raise InputError(f"data: no {col!r} column (each row's {col} picks its coefficients)")
    if frame[col].isna().any():
        row = int(np.flatnonzero(frame[col].isna().to_numpy())[0])
        raise InputError(f"data: {bad_cell(col, None, row)}")
    sites = frame[col].astype(str).str.strip()
    unknown = [s for s in dict.fromkeys(sites) if s not in model.sites]
    if unknown:
        known = ", ".join(model.sites[:8]) + (" ..." if len(model.sites) > 8 else "")
        hint = ""
        if col == "site":  # GrAUC-PFL's predict can place it
            hint = "; a site outside the federation needs its location (--site, --lat, --lon "
            hint += "or --sites)"
        raise InputError(f"{col}: {unknown[0]!r} is not a {col} of the model ({known}){hint}")
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
    if model.new_sites:
        result["extrapolated"] = sites.isin(model.new_sites).to_numpy()
    return result


def write_csv_atomic(frame, out_path: str) -> str:
    """``frame`` to ``out_path`` through a temporary file beside it (no half-written file).

    Parameters
    ----------
    frame : pandas.DataFrame
        The table, written without its index.
    out_path : str
        The file.

    Returns
    -------
    str
        The absolute path.
    """
    return write_bytes_atomic(frame.to_csv(index=False).encode(), out_path)


def write_bytes_atomic(content: bytes, out_path: str) -> str:
    """``content`` to the file ``out_path`` through a temporary file beside it.

    Parameters
    ----------
    content : bytes
        What to write.
    out_path : str
        The file; its directory must exist.

    Returns
    -------
    str
        The absolute path.
    """
    out_path = os.path.abspath(out_path)
    parent = os.path.dirname(out_path)
    if not os.path.isdir(parent):
        raise InputError(f"out: parent directory does not exist: {parent}")
    if os.path.isdir(out_path):
        raise InputError(f"out: a directory, not a file: {out_path}")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out_path


def read_calibration(model_dir: str, sites: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``sites``' calibration (``intercept``, ``slope``) from the fit's
    ``calibration.csv`` (a tuned GrAUC-PFL fit writes it).

    Parameters
    ----------
    model_dir : str
        The fit's output directory.
    sites : sequence of str
        The sites; one the file does not list (a site outside the federation) takes the
        sites' random-effects mean.

    Returns
    -------
    intercept, slope : ndarray, shape (len(sites),)
        Each site's calibration.
    """
    import pandas as pd

    from .calibration import calibration_mean

    path = os.path.join(model_dir, "calibration.csv")
    if not os.path.isfile(path):
        raise InputError(
            f"probability: no calibration.csv in {model_dir} (a GrAUC-PFL fit writes it "
            "unless --no-calibration; it comes from out-of-fold scores)"
        )
    frame = read_table(path, "probability", dtype={"site": str})
    need = ["site", "intercept", "slope", "site_intercept", "site_slope"]
    need += ["site_intercept_se", "site_slope_se"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise InputError(f"probability: {path} has no column {missing[0]!r}")
    used = numeric_columns(frame, ["intercept", "slope"], "probability")
    # a site whose out-of-fold scores held one class has no estimate of its own (empty)
    own = frame[need[3:]].apply(pd.to_numeric, errors="coerce")
    mu_a, mu_b = calibration_mean(own)
    at = {str(s).strip(): k for k, s in enumerate(frame["site"])}
    a = np.array([used[at[s], 0] if s in at else mu_a for s in sites])
    b = np.array([used[at[s], 1] if s in at else mu_b for s in sites])
    return a, b


def add_predict_parser(sub, what: str, new_sites: bool = False, probability: bool = False) -> None:
    """The ``predict`` subcommand of a method's command line (:func:`cmd_predict`).

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The command line's subparsers, which get ``predict``.
    what : str
        What the method predicts, for the help (e.g. ``risk scores``).
    new_sites : bool, optional
        Add the options that place sites outside the federation.
    probability : bool, optional
        Add the option that writes calibrated risks.
    """
    p = sub.add_parser("predict", help=f"{what} for new rows from a fitted model")
    p.add_argument("--model", required=True, help="the fit's output directory")
    p.add_argument("--data", required=True, help="CSV: the site column and the features")
    p.add_argument("--out", required=True, help="CSV to write")
    if probability:
        p.add_argument(
            "--probability",
            action="store_true",
            help="also each row's calibrated risk, expit(intercept + slope * score) with its "
            "site's calibration.csv row (a tuned fit writes it; docs/methods.md 3.14)",
        )
    if not new_sites:
        return
    p.add_argument(
        "--site",
        default="",
        help="a site outside the federation (with --lat, --lon): its rows are scored with "
        "coefficients borrowed from the fitted sites near it (an extrapolation); without a "
        "site column in --data every row is this site's",
    )
    p.add_argument("--lat", type=float, default=None, help="--site's latitude (degrees)")
    p.add_argument("--lon", type=float, default=None, help="--site's longitude (degrees)")
    p.add_argument(
        "--sites", default="", help="CSV: site, lat, lon of sites outside the federation"
    )
    p.add_argument(
        "--new-site-rule",
        default=NEW_SITE_RULES[0],
        choices=NEW_SITE_RULES,
        help="how a site outside the federation borrows coefficients (default: nearest, "
        "the nearest fitted site's; graph: the fitted penalty's answer for a site without "
        "rows; inverse-distance: its 3 nearest sites'; docs/methods.md 3.13)",
    )


def predicted_rows(args, read_model, ignore_outputs: bool, extend=None):
    """``predict``'s table for ``args``.

    Parameters
    ----------
    args : argparse.Namespace
        ``model``, ``data`` and, where the method has them, ``probability`` and the
        new-site options.
    read_model : callable
        ``read_model(model_dir)``: the method's :class:`FittedModel`.
    ignore_outputs : bool
        Skip the model's output columns in the data when there; otherwise only ``y``.
    extend : callable, optional
        ``extend(args, model)`` returns the model with the new sites of ``args`` and what
        each borrowed.

    Returns
    -------
    table : pandas.DataFrame
        The predictions (:func:`predict`), with ``probability`` after ``score`` when asked.
    model : FittedModel
        The model, with any new sites.
    borrowed : list of Borrowed
        What each site outside the federation borrowed.
    """
    model = read_model(args.model)
    borrowed: list[Borrowed] = []
    if extend is not None:
        model, borrowed = extend(args, model)
    ignore = ("y",) if not ignore_outputs else model.outputs
    result = predict(model, args.data, ignore, getattr(args, "site", "") or "")
    if getattr(args, "probability", False):
        from scipy.special import expit

        a, b = read_calibration(args.model, model.sites)
        at = {s: k for k, s in enumerate(model.sites)}
        z = result[model.site_column].map(at).to_numpy()
        score = result["score"].to_numpy(dtype=float)
        at_col = list(result.columns).index("score") + 1
        result.insert(at_col, "probability", expit(a[z] + b[z] * score))
    return result, model, borrowed


def cmd_predict(args, read_model, ignore_outputs: bool, extend=None) -> int:
    """``predict``: read the model, score the data (:func:`predicted_rows`), write
    ``--out``; prints one line (and one per site outside the federation, said to be an
    extrapolation).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed command line (:func:`add_predict_parser`).
    read_model : callable
        ``read_model(model_dir)``: the method's :class:`FittedModel`.
    ignore_outputs : bool
        Skip the model's output columns in the data when there; otherwise only ``y``.
    extend : callable, optional
        ``extend(args, model)`` returns the model with the new sites of ``args`` and what
        each borrowed.

    Returns
    -------
    int
        The exit status, 0.
    """
    result, model, borrowed = predicted_rows(args, read_model, ignore_outputs, extend)
    path = write_csv_atomic(result, args.out)
    for b in borrowed:
        rows = int((result[model.site_column] == b.site).sum())
        if rows:
            src = ", ".join(
                f"{model.sites[u]} ({d:.0f} km, weight {w:.2g})"
                for u, d, w in zip(b.sources, b.distance_km, b.weights, strict=True)
            )
            print(
                f"site {b.site} was not in the federation: its {rows} rows are scored with "
                f"coefficients borrowed from {src} by the {args.new_site_rule} rule (an "
                "extrapolation; rows marked extrapolated)"
            )
    n = result[model.site_column].nunique()
    entity = model.site_column + ("" if n == 1 else "s")  # site(s), or RowFed's client(s)
    print(f"predicted {len(result)} rows for {n} {entity}; wrote {path}")
    return 0
