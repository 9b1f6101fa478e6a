"""Real data for GrAUC-PFL (docs/methods.md 1.9): the CDC COVID-19 case surveillance file with
counties as institutions, and UCI Communities and Crime with states as institutions.

Both loaders return a :class:`SiteTable` (every institution's rows, before any split);
:func:`stratified_split` turns it into the project's :class:`~grauc_flower.data.SiteData`
with a seeded per-institution, per-class train/test split, so the fit, the Flower app and
the study run on it unchanged.

CDC "COVID-19 Case Surveillance Public Use Data with Geography" (data.cdc.gov ``n8mc-b4w4``;
the whole file or any subset of its rows, read in chunks):

- outcome ``hosp_yn``: ``Yes`` = 1, ``No`` = 0; rows with ``Missing``, ``Unknown`` or an
  empty/NA value are dropped (their outcome is unknown);
- covariates ``age_group, sex, race, ethnicity, symptom_status, underlying_conditions_yn``,
  one-hot encoded with one reference level per variable dropped (the score has no
  intercept: a full set of indicators would sum to one and cancel in every pairwise
  difference).  Reference: the variable's most frequent known level over the selected
  counties (ties: alphabetical) **[choice]**;
- ``Missing``, ``Unknown`` and empty/NA covariate values **[choice]**: by default
  (``missing="level"``) they are kept, merged into one level ``Missing/Unknown`` of each
  variable, as a statistician would: dropping them would discard most rows of the file
  (``underlying_conditions_yn`` and ``symptom_status`` are unknown for a majority of cases)
  and the missingness itself is related to how a case was followed up, so to
  hospitalization.  ``missing="drop"`` drops every row with an unknown covariate instead;
- institutions: counties (``county_fips_code``, read as text and zero-padded to 5 digits),
  located at the shipped county centroids; rows without a county code (suppressed in the
  public file) are dropped; a county of the file missing from the centroid table (codes
  created after 2009, e.g. Alaska's 02063/02066) is dropped with a note;
- selection: the ``num_counties`` (default 18) counties with the most cases that have at
  least ``min_per_class`` cases of each class, or the user's list of counties.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.errors import InputError
from strategies.stats.tuning import site_rng

from .data import SiteData, centroids, parse_counties

#: The 19 columns of the CDC file (docs/methods.md 1.9), in the file's order.
CDC_COLUMNS = (
    "case_month",
    "res_state",
    "state_fips_code",
    "res_county",
    "county_fips_code",
    "age_group",
    "sex",
    "race",
    "ethnicity",
    "case_positive_specimen_interval",
    "case_onset_interval",
    "process",
    "exposure_yn",
    "current_status",
    "symptom_status",
    "hosp_yn",
    "icu_yn",
    "death_yn",
    "underlying_conditions_yn",
)
CDC_OUTCOME = "hosp_yn"
CDC_COVARIATES = (
    "age_group",
    "sex",
    "race",
    "ethnicity",
    "symptom_status",
    "underlying_conditions_yn",
)
CDC_COUNTY = "county_fips_code"
#: Covariate values that mean "not known"; merged into :data:`MISSING_LEVEL`.
MISSING_VALUES = ("Missing", "Unknown", "NA", "")
MISSING_LEVEL = "Missing/Unknown"
CDC_DEFAULTS = {"num_counties": 18, "train_fraction": 0.2, "min_per_class": 15}

#: Communities and Crime: the crime rate ``high_crime`` is derived from is not a predictor of
#: it (nor is any column of :data:`strategies.datasets.crime.NOT_PREDICTORS`).
CRIME_NOT_PREDICTORS = ("ViolentCrimesPerPop",)
CRIME_DEFAULTS = {"train_fraction": 0.5, "min_per_class": 5}


@dataclass(frozen=True)
class SiteTable:
    """Every institution's rows before the train/test split.

    ``x[z]`` ``(n_z, p)`` and ``y[z]`` (0/1) of institution ``sites[z]`` at
    ``(lat[z], lon[z])``; ``features`` the column names; ``notes`` what was dropped and why
    (one line each, for the user).
    """

    sites: tuple[str, ...]
    lat: tuple[float, ...]
    lon: tuple[float, ...]
    x: tuple[np.ndarray, ...]
    y: tuple[np.ndarray, ...]
    features: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def counts(self) -> list[tuple[str, int, int]]:
        """``(site, n_pos, n_neg)`` per institution."""
        pairs = zip(self.sites, self.y, strict=True)
        return [(s, int(np.sum(y == 1)), int(np.sum(y == 0))) for s, y in pairs]


# ---------------------------------------------------------------------------------------
# The split
# ---------------------------------------------------------------------------------------
def n_train_of(n: int, fraction: float) -> int:
    """Training rows of a class with ``n`` rows: ``fraction * n`` rounded half up, at least
    1 and at most ``n - 1`` (so training and test both hold the class when ``n >= 2``).

    Parameters
    ----------
    n : int
        The class's rows.
    fraction : float
        The training share.

    Returns
    -------
    int
        The number of training rows.
    """
    k = int(np.floor(fraction * n + 0.5))
    return int(min(max(k, 1), max(n - 1, 1)))


def stratified_split(
    table: SiteTable, train_fraction: float, seed: int, max_per_class: int = 0
) -> list[SiteData]:
    """Per institution and per class, a random ``train_fraction`` (see :func:`n_train_of`)
    for training and the rest for testing (docs/methods.md 1.9: about 20% of each class).
    Rows keep their file order within the training and test sets.

    Parameters
    ----------
    table : SiteTable
        Every institution's rows.
    train_fraction : float
        The training share of each class, in (0, 1).
    seed : int
        The seed each institution's stream derives from (with its name).
    max_per_class : int, optional
        When above 0, at most that many rows of each class of an institution are drawn first
        (at random, with the same seed), bounding the cost of the pairwise surrogate for very
        large institutions; the fraction applies to what is drawn.

    Returns
    -------
    list of SiteData
        The institutions with their training and test rows.
    """
    if not 0 < train_fraction < 1:
        raise InputError(f"data.train-fraction: must be in (0, 1), got {train_fraction!r}")
    if max_per_class < 0:
        raise InputError(f"data.max-per-class: must be >= 0, got {max_per_class!r}")
    out = []
    for z, site in enumerate(table.sites):
        x, y = table.x[z], table.y[z]
        rng = site_rng(seed, site)
        train, test = [], []
        for cls in (1, 0):
            idx = rng.permutation(np.flatnonzero(y == cls))
            if max_per_class and len(idx) > max_per_class:
                idx = idx[:max_per_class]
            k = n_train_of(len(idx), train_fraction)
            train.append(idx[:k])
            test.append(idx[k:])
        tr = np.sort(np.concatenate(train))
        te = np.sort(np.concatenate(test))
        out.append(
            SiteData(
                site,
                float(table.lat[z]),
                float(table.lon[z]),
                x[tr],
                y[tr],
                x[te],
                y[te],
                table.features,
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# CDC COVID-19 case surveillance
# ---------------------------------------------------------------------------------------
def normalize_fips(values, what: str, first_line: int = 2) -> np.ndarray:
    """County codes as 5-digit strings.  A value that is not 1 to 5 digits (an integer-valued
    float such as ``6037.0`` is accepted) is an :class:`InputError` naming ``what`` and the
    line.

    Parameters
    ----------
    values : sequence
        The codes as read.
    what : str
        What an error names (the column).
    first_line : int, optional
        The file line of ``values[0]`` (an error names the bad value's line).

    Returns
    -------
    ndarray of object
        The codes; ``None`` for a missing value (NA, empty).
    """
    import pandas as pd

    s = pd.Series(values, dtype="object")
    text = s.where(s.notna(), "").astype(str).str.strip()
    text = text.str.replace(r"\.0+$", "", regex=True)
    missing = text.isin(["", "NA", "nan", "NaN"])
    ok = text.str.fullmatch(r"\d{1,5}") | missing
    if not ok.all():
        k = int(np.flatnonzero(~ok.to_numpy())[0])
        raise InputError(
            f"{what}: {s.iloc[k]!r} (line {first_line + k}) is not a county FIPS code "
            "(1 to 5 digits)"
        )
    out = text.str.zfill(5).to_numpy(dtype=object)
    out[missing.to_numpy()] = None
    return out


def _check_file(path: str, what: str = "data.path") -> None:
    if not path:
        raise InputError(f"{what}: give the CDC file (COVID-19 Case Surveillance with Geography)")
    if not os.path.isfile(path):
        raise InputError(f"{what}: file not found: {path}")


def _header(path: str) -> list[str]:
    import pandas as pd

    try:
        cols = pd.read_csv(path, nrows=0).columns
    except pd.errors.EmptyDataError:
        raise InputError(f"data: file is empty: {path}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"data: cannot parse {path}: {first}") from None
    return [str(c).strip() for c in cols]


def _chunks(path: str, usecols: Sequence[str], chunksize: int):
    """``(first_line, frame)`` per chunk of the needed columns, all as categories (a few
    thousand distinct values in many millions of rows)."""
    import pandas as pd

    reader = pd.read_csv(
        path,
        usecols=list(usecols),
        dtype={c: "category" for c in usecols},
        chunksize=chunksize,
        keep_default_na=False,  # "NA" and "" stay strings; handled explicitly below
        skipinitialspace=True,
    )
    line = 2
    try:
        for chunk in reader:
            yield line, chunk
            line += len(chunk)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"data: cannot parse {path} near line {line}: {first}") from None


def _by_category(col, values: np.ndarray, fill) -> np.ndarray:
    """``values[k]`` for a row of category ``k`` (``fill`` for a missing value)."""
    table = np.append(np.asarray(values, dtype=object), fill)
    return table[col.cat.codes.to_numpy()]  # code -1 (missing) picks ``fill``


def _outcome(col) -> np.ndarray:
    """``hosp_yn`` as 1 (Yes), 0 (No), -1 (anything else: dropped)."""
    cats = np.array([str(c).strip() for c in col.cat.categories], dtype=object)
    codes = np.where(cats == "Yes", 1, np.where(cats == "No", 0, -1))
    return _by_category(col, codes, -1).astype(np.int8)


def _fips_column(chunk, line: int) -> np.ndarray:
    """5-digit county codes (``None`` where missing) of a chunk's rows."""
    col = chunk[CDC_COUNTY]
    what = f"data: column {CDC_COUNTY!r}"
    try:
        norm = normalize_fips(list(col.cat.categories), what)
    except InputError:  # name the first offending row's line
        normalize_fips(col.astype(object).to_numpy(), what, line)
        raise
    return _by_category(col, norm, None)


def _count_classes(path: str, chunksize: int):
    """Pass 1: cases per county and class (a frame ``pos, neg`` indexed by FIPS code) and
    the number of cases with a known outcome but no county code."""
    import pandas as pd

    totals = None
    no_county = 0
    for line, chunk in _chunks(path, [CDC_COUNTY, CDC_OUTCOME], chunksize):
        y = _outcome(chunk[CDC_OUTCOME])
        fips = _fips_column(chunk, line)
        has = np.array([f is not None for f in fips])
        no_county += int(np.sum((y >= 0) & ~has))
        keep = (y >= 0) & has
        part = pd.DataFrame({"fips": fips[keep], "y": y[keep]}).groupby(["fips", "y"]).size()
        totals = part if totals is None else totals.add(part, fill_value=0)
    if totals is None or totals.empty:
        return pd.DataFrame(columns=["pos", "neg"]), no_county
    table = totals.unstack("y", fill_value=0).reindex(columns=[1, 0], fill_value=0)
    table.columns = ["pos", "neg"]
    return table.astype(np.int64), no_county


def _select(table, num_counties: int, min_per_class: int, notes: list[str]) -> list[str]:
    """The ``num_counties`` counties with the most cases that have a centroid and at least
    ``min_per_class`` cases of each class (ties: lower FIPS first)."""
    eligible = table[(table["pos"] >= min_per_class) & (table["neg"] >= min_per_class)]
    located = centroids(list(eligible.index))
    for f in eligible.index:
        if f not in located:
            n = int(eligible.at[f, "pos"] + eligible.at[f, "neg"])
            notes.append(f"county {f} ({n} cases) has no centroid in the shipped table: dropped")
    eligible = eligible[[f in located for f in eligible.index]]
    if eligible.empty:
        raise InputError(
            f"data: no county of the file has at least {min_per_class} cases of each class "
            f"({CDC_OUTCOME} Yes and No) and a known location"
        )
    order = eligible.assign(n=eligible["pos"] + eligible["neg"], f=eligible.index)
    order = order.sort_values(["n", "f"], ascending=[False, True], kind="stable")
    chosen = list(order.index[:num_counties])
    if len(chosen) < num_counties:
        notes.append(
            f"only {len(chosen)} counties have at least {min_per_class} cases of each class "
            f"(asked for {num_counties})"
        )
    return sorted(chosen)


def _level_of(value) -> str:
    text = str(value).strip()
    return MISSING_LEVEL if text in MISSING_VALUES else text


def _levels(col) -> np.ndarray:
    """Covariate values (a categorical column) as strings, the missing tokens merged into
    one level :data:`MISSING_LEVEL`."""
    cats = [_level_of(c) for c in col.cat.categories]
    return _by_category(col, np.array(cats, dtype=object), MISSING_LEVEL)


def encode_covariates(frame) -> tuple[np.ndarray, list[str], dict]:
    """One-hot columns of :data:`CDC_COVARIATES` with one reference level per variable
    dropped; returns ``(x, feature_names, reference_levels)``.

    Features are named ``variable=level``; per variable the non-reference levels come in
    alphabetical order with ``Missing/Unknown`` last.  ``frame`` holds the covariates as
    strings, missing values already merged into :data:`MISSING_LEVEL`.
    """
    cols, names, refs = [], [], {}
    for var in CDC_COVARIATES:
        values = frame[var].to_numpy(dtype=object).astype(str)
        levels, counts = np.unique(values, return_counts=True)
        pairs = zip(levels, counts, strict=True)
        known = sorted((-int(n), str(lv)) for lv, n in pairs if lv != MISSING_LEVEL)
        ref = known[0][1] if known else MISSING_LEVEL  # most frequent; ties: alphabetical
        refs[var] = ref
        ordered = sorted(lv for lv in levels if lv not in (ref, MISSING_LEVEL))
        if MISSING_LEVEL in levels and ref != MISSING_LEVEL:
            ordered.append(MISSING_LEVEL)
        for lv in ordered:
            cols.append((values == lv).astype(float))
            names.append(f"{var}={lv}")
    if not cols:
        raise InputError("data: every covariate has a single level in the selected counties")
    return np.column_stack(cols), names, refs


@functools.lru_cache(maxsize=2)
def read_cdc(
    path: str,
    counties: tuple[str, ...] = (),
    num_counties: int = 18,
    min_per_class: int = 15,
    missing: str = "level",
    chunksize: int = 1_000_000,
) -> SiteTable:
    """The CDC COVID-19 case surveillance file (with geography) as counties' data.

    Parameters
    ----------
    path : str
        The CSV (the whole public file, or any subset of its rows with its header).  It is
        read in chunks of ``chunksize`` rows, only the needed columns, categories as
        ``category`` dtype; without ``counties`` a first pass counts cases per county and
        class and a second keeps only the selected counties' rows.
    counties : tuple of str
        FIPS codes of the counties to use (each must have ``min_per_class`` cases of each
        class); empty: the ``num_counties`` largest eligible counties.
    num_counties : int
        How many counties to select when ``counties`` is empty (paper: 18).
    min_per_class : int
        A county needs at least this many hospitalized and non-hospitalized cases.
    missing : {"level", "drop"}
        Missing/Unknown/NA covariate values: one level of their own, or drop the row.

    Returns
    -------
    SiteTable
        One institution per county (site id: the 5-digit FIPS code), ordered by FIPS code,
        features ``variable=level``; ``notes`` lists what was dropped.
    """
    if missing not in ("level", "drop"):
        raise InputError(f"data.missing-levels: must be level or drop, got {missing!r}")
    if num_counties < 1:
        raise InputError(f"data.num-counties: must be >= 1, got {num_counties!r}")
    if min_per_class < 2:
        raise InputError(f"data.min-per-class: must be >= 2, got {min_per_class!r}")
    _check_file(path)
    header = _header(path)
    for col in (CDC_COUNTY, CDC_OUTCOME, *CDC_COVARIATES):
        if col not in header:
            raise InputError(f"data: column {col!r} is missing from {path}")
    listed = parse_counties(counties)
    notes: list[str] = []
    if listed:
        wanted = list(listed)
    else:
        table, no_county = _count_classes(path, chunksize)
        if no_county:
            notes.append(f"{no_county} cases without a county code (suppressed): dropped")
        wanted = _select(table, num_counties, min_per_class, notes)
    data, n_unknown_outcome = _county_rows(path, set(wanted), chunksize)
    if n_unknown_outcome:
        notes.append(
            f"{n_unknown_outcome} cases of the selected counties have {CDC_OUTCOME} "
            "Missing/Unknown/NA: dropped"
        )
    if missing == "drop" and len(data):
        unknown = (data[list(CDC_COVARIATES)] == MISSING_LEVEL).any(axis=1).to_numpy()
        if unknown.any():
            notes.append(f"{int(unknown.sum())} cases with a Missing/Unknown covariate: dropped")
        data = data[~unknown].reset_index(drop=True)
    wanted = _with_both_classes(data, wanted, min_per_class, bool(listed), notes)
    if not wanted:
        raise InputError(
            f"data: no county is left with at least {min_per_class} cases of each class"
        )
    data = data[data["fips"].isin(wanted)].reset_index(drop=True)
    x, features, refs = encode_covariates(data)
    notes.append("reference levels: " + "; ".join(f"{k}={v}" for k, v in refs.items()))
    where = centroids(wanted)
    fips_all = data["fips"].to_numpy()
    y_all = data["y"].to_numpy().astype(np.int64)
    xs, ys = [], []
    for c in wanted:
        mask = fips_all == c
        xs.append(x[mask])
        ys.append(y_all[mask])
    return SiteTable(
        tuple(wanted),
        tuple(where[c][0] for c in wanted),
        tuple(where[c][1] for c in wanted),
        tuple(xs),
        tuple(ys),
        tuple(features),
        tuple(notes),
    )


def _county_rows(path: str, keep: set, chunksize: int) -> tuple:
    """The CDC file's cases of the ``keep`` counties with a known outcome, read in chunks
    (covariates as levels, ``fips``, ``y``), and how many of theirs had no known outcome."""
    import pandas as pd

    parts = []
    n_unknown_outcome = 0
    for line, chunk in _chunks(path, [CDC_COUNTY, CDC_OUTCOME, *CDC_COVARIATES], chunksize):
        fips = _fips_column(chunk, line)
        y = _outcome(chunk[CDC_OUTCOME])
        in_county = np.array([f in keep for f in fips], dtype=bool)
        n_unknown_outcome += int(np.sum(in_county & (y < 0)))
        rows = in_county & (y >= 0)
        if not rows.any():
            continue
        part = pd.DataFrame({var: _levels(chunk[var][rows]) for var in CDC_COVARIATES})
        part["fips"] = fips[rows]
        part["y"] = y[rows]
        parts.append(part)
    columns = [*CDC_COVARIATES, "fips", "y"]
    data = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return data, n_unknown_outcome


def _with_both_classes(data, wanted: list, min_per_class: int, listed: bool, notes: list):
    """The counties of ``wanted`` with at least ``min_per_class`` cases of each class in
    ``data``; a county short of them is an error when the user ``listed`` the counties,
    else a note (in ``notes``) and dropped."""
    kept = list(wanted)
    for c in wanted:
        y_c = data["y"].to_numpy()[data["fips"].to_numpy() == c]
        n_pos, n_neg = int(np.sum(y_c == 1)), int(np.sum(y_c == 0))
        if min(n_pos, n_neg) >= min_per_class:
            continue
        what = (
            f"county {c} has {n_pos} hospitalized and {n_neg} non-hospitalized cases "
            f"({CDC_OUTCOME}); each class needs at least {min_per_class}"
        )
        if listed:
            raise InputError(f"data.counties: {what}")
        notes.append(f"{what}: dropped")
        kept.remove(c)
    return kept


# ---------------------------------------------------------------------------------------
# Communities and Crime (states as institutions)
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def load_crime(
    path: str = "",
    min_per_class: int = 5,
    outcome: str = "high_crime",
    exclude: tuple[str, ...] = (),
) -> SiteTable:
    """Communities and Crime for GrAUC-PFL: outcome ``high_crime``, states as institutions.

    Parameters
    ----------
    path : str
        The normalized CSV; empty: the copy shipped with the package.
    min_per_class : int
        Keep the states with at least this many communities of each class **[choice]**
        (default 5: with a 50/50 split every kept state has at least 2 of each class in its
        test data, so a test AUC, and at least 3 in training, so one of each class in every
        fold of 3-fold CV).  On the shipped copy this keeps 27 of the 46 states (1,739 of
        1,993 communities).
    outcome : str
        The 0/1 outcome column.
    exclude : tuple of str
        Further columns to leave out of the predictors.

    Returns
    -------
    SiteTable
        One institution per kept state (site id: the postal code, e.g. ``CA``) at the
        shipped state centroid, ordered by FIPS code; predictors: every numeric column but
        :data:`CRIME_NOT_PREDICTORS`, ``strategies.datasets.crime.NOT_PREDICTORS``, the state
        columns and ``exclude``.
    """
    import pandas as pd

    from strategies.datasets import state_centroids
    from strategies.datasets.crime import crime_predictors, crime_table
    from strategies.datasets.tables import numeric_columns

    if min_per_class < 2:
        raise InputError(f"data.min-per-class: must be >= 2, got {min_per_class!r}")
    df, state = crime_table(path)
    if outcome not in df.columns:
        raise InputError(f"data: column {outcome!r} is missing from {path or 'the shipped copy'}")
    y = pd.to_numeric(df[outcome], errors="coerce")
    if y.isna().any() or not np.isin(y.to_numpy(), (0, 1)).all():
        raise InputError(f"data: column {outcome!r} must be 0 or 1 with no missing values")
    predictors = crime_predictors(df, {*CRIME_NOT_PREDICTORS, outcome, *exclude})
    x = numeric_columns(df, predictors, "data")
    y = y.to_numpy().astype(np.int64)
    sc = state_centroids().set_index("state_fips")
    sites, lat, lon, xs, ys, notes = [], [], [], [], [], []
    for s in np.unique(state):
        rows = state == s
        n_pos, n_neg = int(np.sum(y[rows] == 1)), int(np.sum(y[rows] == 0))
        if s not in sc.index:
            raise InputError(f"data: state FIPS {s} is not in the shipped state centroids")
        code = str(sc.at[s, "state"])
        if min(n_pos, n_neg) < min_per_class:
            notes.append(
                f"state {code}: {n_pos} high-crime and {n_neg} other communities: left out"
            )
            continue
        sites.append(code)
        lat.append(float(sc.at[s, "lat"]))
        lon.append(float(sc.at[s, "lon"]))
        xs.append(x[rows])
        ys.append(y[rows])
    if not sites:
        raise InputError(
            f"data: no state has at least {min_per_class} communities of each class of {outcome!r}"
        )
    return SiteTable(
        tuple(sites), tuple(lat), tuple(lon), tuple(xs), tuple(ys), tuple(predictors), tuple(notes)
    )


def load_real(
    source: str,
    path: str = "",
    train_fraction: float = 0.0,
    seed: int = 0,
    counties=(),
    num_counties: int = 18,
    min_per_class: int = 0,
    max_per_class: int = 0,
    missing: str = "level",
) -> tuple[list[SiteData], SiteTable]:
    """``source`` ``"cdc"`` or ``"crime"`` split with ``seed``.

    Parameters
    ----------
    source : str
        ``"cdc"`` or ``"crime"``.
    path : str, optional
        The file: the CDC case file (required), or a copy of Communities and Crime (empty:
        the shipped one).
    train_fraction : float, optional
        The training share of each class per site (:func:`stratified_split`); 0: the
        source's default (:data:`CDC_DEFAULTS`, :data:`CRIME_DEFAULTS`).
    seed : int, optional
        The train/test split's seed.
    counties : str or sequence of str, optional
        cdc: the counties' FIPS codes (empty: the ``num_counties`` largest).
    num_counties : int, optional
        cdc: how many of the largest counties are taken.
    min_per_class : int, optional
        The rows of each class a site needs; 0: the source's default.
    max_per_class : int, optional
        At most this many rows per class and site are drawn (0: all).
    missing : str, optional
        cdc: ``"level"`` keeps Missing/Unknown covariate values as a level of their own,
        ``"drop"`` drops those rows.

    Returns
    -------
    sites : list of SiteData
        The split sites.
    table : SiteTable
        The loader's table (its features and notes).
    """
    if source == "cdc":
        d = CDC_DEFAULTS
        table = read_cdc(
            path,
            parse_counties(counties),
            int(num_counties),
            int(min_per_class or d["min_per_class"]),
            missing,
        )
    elif source == "crime":
        d = CRIME_DEFAULTS
        table = load_crime(path, int(min_per_class or d["min_per_class"]))
    else:
        raise InputError(f"data.source: must be cdc or crime here, got {source!r}")
    fraction = float(train_fraction or d["train_fraction"])
    return stratified_split(table, fraction, seed, int(max_per_class)), table


__all__ = [
    "CDC_COLUMNS",
    "CDC_COVARIATES",
    "SiteTable",
    "encode_covariates",
    "load_real",
    "n_train_of",
    "normalize_fips",
    "parse_counties",
    "read_cdc",
    "load_crime",
    "stratified_split",
]
