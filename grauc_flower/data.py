"""Institution data: the paper's simulations (docs/methods.md 1.8) and CSV input (fit command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from strategies.datasets.tables import named, numeric_columns, read_table, stripped_ids, warn
from strategies.errors import InputError, bad_cell, file_line, plain

if TYPE_CHECKING:  # pandas is imported where CSV files are read (clients stay light)
    import pandas as pd

#: Group centres of the simulated institutions: around Los Angeles and around New York.
GROUP_CENTRES = ((34.05, -118.24), (40.71, -74.01))
LEVEL_SHIFT = {0: 0.0, 1: 0.3, 2: 0.6, 3: 0.9}
SIM2_SIZES = (30, 50, 100, 200, 300)


@dataclass(frozen=True)
class SiteData:
    """One institution's data.  ``x_test``/``y_test`` may be empty (shape ``(0, p)``)."""

    site: str
    lat: float
    lon: float
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    features: tuple[str, ...] = ()

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.features or tuple(f"x{k + 1}" for k in range(self.x_train.shape[1]))

    @property
    def n_pos(self) -> int:
        return int(np.sum(self.y_train == 1))

    @property
    def n_neg(self) -> int:
        return int(np.sum(self.y_train == 0))

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]


def class_sizes(n_total: int, prevalence: float, minimum: int = 4) -> tuple[int, int]:
    """``(n_pos, n_neg)`` with ``n_pos = round(prevalence N)``, at least ``minimum`` each.

    Parameters
    ----------
    n_total : int
        The number of rows ``N``.
    prevalence : float
        The share of positives.
    minimum : int, optional
        The least number of rows of each class (a class below it is raised to it).

    Returns
    -------
    n_pos, n_neg : int
        The rows of each class.
    """
    n_pos = max(minimum, int(round(prevalence * n_total)))
    n_neg = max(minimum, n_total - n_pos)
    return n_pos, n_neg


def mean_shift(level: int, group: int, p: int) -> np.ndarray:
    """``mu*`` of the positives (docs/methods.md 1.8): group 1 ``(0.9+D, 0.9, 0.9-D)``, group 2
    ``(0.9-D, 0.9, 0.9+D)``, zero beyond the third coordinate.

    Parameters
    ----------
    level : int
        The shift's level, 0 to 3: ``D`` is 0, 0.3, 0.6 or 0.9 (:data:`LEVEL_SHIFT`).
    group : int
        The mean group: 0 for group 1, any other value for group 2.
    p : int
        The number of features.

    Returns
    -------
    ndarray, shape (p,)
        The positives' mean.
    """
    d = LEVEL_SHIFT[level]
    mu = np.zeros(p)
    first = (0.9 + d, 0.9, 0.9 - d) if group == 0 else (0.9 - d, 0.9, 0.9 + d)
    mu[: min(3, p)] = first[: min(3, p)]
    return mu


def _draw(rng, n_pos: int, n_neg: int, mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = mu.shape[0]
    x = np.vstack([rng.standard_normal((n_pos, p)) + mu, rng.standard_normal((n_neg, p))])
    y = np.concatenate([np.ones(n_pos, dtype=np.int64), np.zeros(n_neg, dtype=np.int64)])
    return x, y


def _layout(
    rng, simulation: int, n_sites: int, places: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first draws of a simulation: site coordinates ``(Z, 2)`` and mean groups ``(Z,)``.
    With ``places`` (``(Z, 2)`` latitudes and longitudes: sites at given locations, e.g.
    county centroids) each site is in the group of the nearer centre of
    :data:`GROUP_CENTRES` (by great-circle distance), and nothing is drawn for the layout."""
    if simulation not in (1, 2, 3, 4):
        raise InputError(f"simulation: must be 1, 2, 3 or 4, got {simulation}")
    if places is not None:
        from .graph import geodesic_km

        coords = np.asarray(places, dtype=float)
        geo = np.array(
            [np.argmin([geodesic_km(a, b, *c) for c in GROUP_CENTRES]) for a, b in coords]
        )
    else:
        geo = np.repeat([0, 1], [n_sites // 2, n_sites - n_sites // 2])
        centres = np.array(GROUP_CENTRES)[geo]
        coords = centres + rng.uniform(-1.0, 1.0, size=(n_sites, 2))
    mean_group = rng.permutation(geo) if simulation == 3 else geo
    return coords, mean_group


def county_places(counties) -> tuple[tuple[str, ...], np.ndarray]:
    """The 5-digit FIPS codes of ``counties`` (a list or ``"06037,17031"``) and their
    shipped centroids ``(Z, 2)`` (an unknown code is an error naming ``counties``)."""
    codes = parse_counties(counties)
    where = centroids(codes)
    return codes, np.array([where[c] for c in codes], dtype=float)


def centroids(fips) -> dict[str, tuple[float, float]]:
    """``{code: (lat, lon)}`` of the county FIPS codes ``fips`` in the shipped centroid
    table (codes not in it are left out)."""
    from strategies.datasets import county_centroids

    cc = county_centroids().set_index("county_fips")
    return {f: (float(cc.at[f, "lat"]), float(cc.at[f, "lon"])) for f in fips if f in cc.index}


def parse_counties(counties) -> tuple[str, ...]:
    """A user's county list (``"06037,17031"`` or a sequence) as 5-digit codes, each in the
    shipped centroid table; a bad or unknown code is an :class:`InputError`."""
    if isinstance(counties, str):
        counties = [c for c in counties.split(",") if c.strip()]
    counties = [str(c).strip() for c in counties]
    if not counties:
        return ()
    import pandas as pd

    for c in counties:
        if not pd.Series([c]).str.fullmatch(r"\d{1,5}").iloc[0]:
            raise InputError(f"data.counties: {c!r} is not a county FIPS code (1 to 5 digits)")
    codes = [c.zfill(5) for c in counties]
    if len(set(codes)) != len(codes):
        dup = next(c for c in codes if codes.count(c) > 1)
        raise InputError(f"data.counties: county {dup} is listed twice")
    known = centroids(codes)
    for c in codes:
        if c not in known:
            raise InputError(
                f"data.counties: {c} is not a county FIPS code of the shipped centroid table"
            )
    return tuple(codes)


def site_means(
    simulation: int = 1, n_sites: int = 20, n_features: int = 10, level: int = 3, seed: int = 0,
    counties=(),
) -> np.ndarray:  # fmt: skip
    """The positives' mean ``mu*`` of every site of :func:`simulate` with the same arguments
    (the negatives' mean is 0; both classes have identity covariance).

    Parameters
    ----------
    simulation : int, optional
        The simulation, 1 to 4.
    n_sites : int, optional
        The number of sites (without ``counties``).
    n_features : int, optional
        The number of features.
    level : int, optional
        The mean shift's level, 0 to 3 (simulation 4 has none).
    seed : int, optional
        The simulation's seed.
    counties : str or sequence of str, optional
        County FIPS codes: the sites at their centroids (:func:`simulate`).

    Returns
    -------
    ndarray, shape (Z, p)
        Each site's positives' mean.
    """
    places = county_places(counties)[1] if counties else None
    _, mean_group = _layout(np.random.default_rng(seed), simulation, n_sites, places)
    return _means(simulation, level, mean_group, n_features)


def _means(simulation: int, level: int, mean_group: np.ndarray, p: int) -> np.ndarray:
    lvl = 0 if simulation == 4 else level
    return np.stack([mean_shift(lvl, int(g), p) for g in mean_group])


def simulate(
    simulation: int = 1,
    n_sites: int = 20,
    n_features: int = 10,
    n_train: int = 50,
    n_test: int = 200,
    prevalence: float = 0.3,
    level: int = 3,
    seed: int = 0,
    counties=(),
) -> list[SiteData]:
    """The paper's simulations 1–4 (docs/methods.md 1.8).

    Sites ``0 .. Z/2-1`` lie around Los Angeles, the rest around New York, each jittered
    uniformly by up to 1 degree.  Simulation 1: mean groups follow geography.  2: as 1 with
    each site's training size drawn once from {30, 50, 100, 200, 300}.  3: the two mean groups
    are assigned at random, unrelated to location.  4: one mean for all (shift 0).

    Parameters
    ----------
    simulation : int, optional
        The simulation, 1 to 4.
    n_sites : int, optional
        The number of sites ``Z``.
    n_features : int, optional
        The number of features ``p``.
    n_train : int, optional
        The training rows per site (not simulation 2's, which draws them).
    n_test : int, optional
        The test rows per site.
    prevalence : float, optional
        The share of positives in each site's training and test rows
        (:func:`class_sizes`: at least 4 of each class).
    level : int, optional
        How far the two mean groups differ, 0 (not) to 3 (:func:`mean_shift`).
    seed : int, optional
        The seed of every draw.
    counties : str or sequence of str, optional
        County FIPS codes: the sites are those counties, named by their codes, at their
        shipped centroids (``n_sites`` is their number), each in the mean group of the
        nearer of Los Angeles and New York (:func:`_layout`).

    Returns
    -------
    list of SiteData
        The sites, named ``S01, S02, ...`` (or by their county codes).
    """
    rng = np.random.default_rng(seed)
    names = None
    places = None
    if counties:
        names, places = county_places(counties)
        n_sites = len(names)
    coords, mean_group = _layout(rng, simulation, n_sites, places)
    sizes = rng.choice(SIM2_SIZES, size=n_sites) if simulation == 2 else np.full(n_sites, n_train)
    means = _means(simulation, level, mean_group, n_features)
    width = len(str(n_sites))
    sites = []
    for z in range(n_sites):
        mu = means[z]
        x_tr, y_tr = _draw(rng, *class_sizes(int(sizes[z]), prevalence), mu)
        x_te, y_te = _draw(rng, *class_sizes(n_test, prevalence), mu)
        sites.append(
            SiteData(
                site=names[z] if names else f"S{z + 1:0{width}d}",
                lat=float(coords[z, 0]),
                lon=float(coords[z, 1]),
                x_train=x_tr,
                y_train=y_tr,
                x_test=x_te,
                y_test=y_te,
            )
        )
    return sites


# ---------------------------------------------------------------------------------------
# CSV input


def location(lat, lon, where: str = "", site: str | None = None) -> tuple[float, float]:
    """A site's ``(lat, lon)`` in degrees, each a number within [-90, 90] and [-180, 180], else
    an :class:`InputError`: the one check of a sites file, a node config and ``predict``'s
    ``--lat/--lon``.

    Parameters
    ----------
    lat, lon : float or str
        The latitude and longitude as given.
    where : str, optional
        What the error names before the field, e.g. ``"sites: "``.
    site : str, optional
        The site the error names, if given.

    Returns
    -------
    lat, lon : float
        The checked coordinates.
    """
    out = []
    for key, value, bound in (("lat", lat, 90.0), ("lon", lon, 180.0)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InputError(f"{where}{key} must be a number, got {value!r}") from None
        if not -bound <= number <= bound:  # NaN too
            who = "" if site is None else f" for site {site!r}"
            raise InputError(
                f"{where}{key} must be within [{-bound:g}, {bound:g}]{who}, got {number:g}"
            )
        out.append(number)
    return out[0], out[1]


def read_sites(path: str) -> pd.DataFrame:
    """Read ``SITES.csv`` (``site, lat, lon``) and validate it.  Returns one row per site."""

    df = read_table(path, "sites", dtype={"site": str})
    for col in ("site", "lat", "lon"):
        if col not in df.columns:
            raise InputError(f"sites: missing column {col!r} in {path}")
    if df["site"].isna().any():
        raise InputError("sites: column 'site' has a missing value")
    df = df.assign(site=stripped_ids(df["site"], "sites: column 'site'"))
    coords = numeric_columns(df, ["lat", "lon"], "sites")
    df = df.assign(lat=coords[:, 0], lon=coords[:, 1])
    for site, lat, lon in df[["site", "lat", "lon"]].itertuples(index=False):
        location(lat, lon, "sites: ", site)
    for site, grp in df.groupby("site", sort=False):
        if len(grp) > 1 and (grp["lat"].nunique() > 1 or grp["lon"].nunique() > 1):
            raise InputError(f"sites: site {site!r} is listed twice with different coordinates")
    return df.drop_duplicates("site").reset_index(drop=True)[["site", "lat", "lon"]]


def read_data(path: str, key: str = "data") -> tuple[pd.DataFrame, list[str]]:
    """Read ``DATA.csv`` (``site``, ``y`` and the features).

    Parameters
    ----------
    path : str
        The file.
    key : str, optional
        What errors name (e.g. ``"test-data"``).

    Returns
    -------
    frame : pandas.DataFrame
        The rows, ``site`` stripped and ``y`` as integers 0 or 1.
    features : list of str
        The feature names: every other column, in file order.
    """
    import pandas as pd

    df = read_table(path, key, dtype={"site": str})
    for col in ("site", "y"):
        if col not in df.columns:
            raise InputError(f"{key}: missing column {col!r} in {path}")
    features = [c for c in df.columns if c not in ("site", "y")]
    if not features:
        raise InputError(f"{key}: no feature columns (every column but 'site' and 'y')")
    if df["site"].isna().any():
        raise InputError(f"{key}: column 'site' has a missing value")
    y = pd.to_numeric(df["y"], errors="coerce")
    if y.isna().any():
        row = int(np.flatnonzero(y.isna().to_numpy())[0])
        raise InputError(f"{key}: {bad_cell('y', df['y'].iloc[row], row)}")
    if not np.isin(y.to_numpy(), (0, 1)).all():
        row = int(np.flatnonzero(~np.isin(y.to_numpy(), (0, 1)))[0])
        raise InputError(
            f"{key}: column 'y' must be 0 or 1, found {plain(y.iloc[row])} at {file_line(row)}"
        )
    df = df.assign(site=stripped_ids(df["site"], f"{key}: column 'site'"), y=y.astype(np.int64))
    return df, features


def sites_from_frames(
    data: pd.DataFrame,
    features: list[str],
    sites: pd.DataFrame,
    allow_missing_class: bool = False,
) -> list[SiteData]:
    """Split the data by site, in the order of the sites file.  Checks every data site has
    coordinates; a site of the sites file without rows is left out, with a warning.

    Parameters
    ----------
    data : pandas.DataFrame
        The rows (:func:`read_data`).
    features : list of str
        The feature columns.
    sites : pandas.DataFrame
        The sites file (:func:`read_sites`).
    allow_missing_class : bool, optional
        Let a site lack a class; otherwise that is an error.

    Returns
    -------
    list of SiteData
        The sites with rows, without test rows.
    """
    import pandas as pd

    x = numeric_columns(data, features, "data")
    known = set(sites["site"])
    unknown = [s for s in pd.unique(data["site"]) if s not in known]
    if unknown:
        raise InputError(f"sites: site {unknown[0]!r} is in the data but not in the sites file")
    present = set(data["site"])
    idle = [s for s in sites["site"] if s not in present]
    if idle:
        warn(
            f"sites: {len(idle)} site(s) of the sites file have no data rows and are left out, "
            f"of the graph too: the tree joins the sites with rows ({named(idle, quote=True)})"
        )
    out = []
    y_all = data["y"].to_numpy()
    site_col = data["site"].to_numpy()
    p = len(features)
    for row in sites.itertuples(index=False):
        if row.site not in present:
            continue
        mask = site_col == row.site
        y = y_all[mask]
        if not allow_missing_class and (np.all(y == 1) or np.all(y == 0)):
            missing = "negatives (y = 0)" if np.all(y == 1) else "positives (y = 1)"
            raise InputError(
                f"data: site {row.site!r} has no {missing} in its training data "
                "(use --missing-class borrow to let it take its model from its neighbours)"
            )
        out.append(
            SiteData(
                site=str(row.site),
                lat=float(row.lat),
                lon=float(row.lon),
                x_train=x[mask],
                y_train=y,
                x_test=np.zeros((0, p)),
                y_test=np.zeros(0, dtype=np.int64),
                features=tuple(features),
            )
        )
    return out


def load_csv(data_path: str, sites_path: str, allow_missing_class: bool = False):
    """Load ``DATA.csv`` and ``SITES.csv``.

    Parameters
    ----------
    data_path : str
        The rows (:func:`read_data`).
    sites_path : str
        The sites' locations (:func:`read_sites`).
    allow_missing_class : bool, optional
        Let a site lack a class (:func:`sites_from_frames`).

    Returns
    -------
    sites : list of SiteData
        The sites with rows, in the sites file's order.
    features : list of str
        The feature names.
    """
    sites = read_sites(sites_path)
    data, features = read_data(data_path)
    return sites_from_frames(data, features, sites, allow_missing_class), features


def add_test_data(sites: list[SiteData], path: str) -> list[SiteData]:
    """The sites with their test rows from ``path``.  A site without test rows keeps none.

    Parameters
    ----------
    sites : list of SiteData
        The training sites.
    path : str
        The test file: the training file's columns, in any order; each ``site`` must be a
        training site.

    Returns
    -------
    list of SiteData
        ``sites`` with ``x_test`` and ``y_test`` set.
    """
    import dataclasses

    df, features = read_data(path, "test-data")
    trained = list(sites[0].feature_names) if sites else []
    if sorted(features) != sorted(trained):
        extra = sorted(set(features) - set(trained))
        missing = sorted(set(trained) - set(features))
        what = f"extra column {extra[0]!r}" if extra else f"missing feature {missing[0]!r}"
        raise InputError(f"test-data: {what} (the columns must match the training data)")
    known = {s.site for s in sites}
    unknown = [s for s in dict.fromkeys(df["site"]) if s not in known]
    if unknown:
        raise InputError(f"test-data: site {unknown[0]!r} is not a site of the training data")
    x = numeric_columns(df, trained, "test-data")
    y = df["y"].to_numpy()
    col = df["site"].to_numpy()
    return [dataclasses.replace(s, x_test=x[col == s.site], y_test=y[col == s.site]) for s in sites]


def hold_out(sites: list[SiteData], fraction: float, seed: int) -> list[SiteData]:
    """A stratified test set inside each site, drawn from the site's own seeded stream.

    Parameters
    ----------
    sites : list of SiteData
        The sites; their training rows are split.
    fraction : float
        The share of each class held out, in (0, 1) (rounded half up, leaving one row of a
        class for training).
    seed : int
        The seed each site's stream derives from (with its name).

    Returns
    -------
    list of SiteData
        The sites, their held-out rows as the test rows.
    """
    from strategies.stats.tuning import holdout_mask, site_rng

    if not 0 < fraction < 1:
        raise InputError(f"holdout: must be in (0, 1), got {fraction!r}")
    out = []
    for s in sites:
        test = holdout_mask(s.y_train, len(s.y_train), fraction, site_rng(seed, s.site))
        out.append(
            SiteData(
                s.site,
                s.lat,
                s.lon,
                s.x_train[~test],
                s.y_train[~test],
                s.x_train[test],
                s.y_train[test],
                s.features,
            )
        )
    return out


def load_site_file(path: str, node_config) -> SiteData:
    """One institution's own file (deployment).

    Parameters
    ----------
    path : str
        The file: columns ``y`` and the features (a ``site`` column, if present, must hold
        only this site).
    node_config : mapping
        The SuperNode's node config: the site id and location (``site``, ``lat``, ``lon``).

    Returns
    -------
    SiteData
        The site's training rows, without test rows.
    """
    for key in ("site", "lat", "lon"):
        if key not in node_config:
            raise InputError(f"node-config: missing {key!r} (e.g. site=S01 lat=34.1 lon=-118.2)")
    site = str(node_config["site"])
    lat, lon = location(node_config["lat"], node_config["lon"], "node-config: ")
    df, features = read_data_single(path)
    if "site" in df.columns:
        others = set(df["site"].astype(str)) - {site}
        if others:
            raise InputError(f"data: {path} holds rows of other sites: {sorted(others)[:3]}")
        features = [f for f in features if f != "site"]
    x = numeric_columns(df, features, "data")
    y = df["y"].to_numpy()
    p = x.shape[1]
    return SiteData(
        site,
        lat,
        lon,
        x,
        y,
        np.zeros((0, p)),
        np.zeros(0, dtype=np.int64),
        tuple(features),
    )


def read_data_single(path: str) -> tuple[pd.DataFrame, list[str]]:
    import pandas as pd

    df = read_table(path, "data", dtype={"site": str})
    if "y" not in df.columns:
        raise InputError(f"data: missing column 'y' in {path}")
    y = pd.to_numeric(df["y"], errors="coerce")
    if y.isna().any() or not np.isin(y.to_numpy(), (0, 1)).all():
        raise InputError("data: column 'y' must be 0 or 1 with no missing values")
    df = df.assign(y=y.astype(np.int64))
    return df, [c for c in df.columns if c != "y"]
