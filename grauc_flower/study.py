"""The GrAUC-PFL simulation study (docs/methods.md 1.7–1.8): ``python -m grauc_flower study``.

One task = one (cell, replication): simulate the 20 institutions with the task's seed, choose
``lam`` and ``w_dist`` by stratified K-fold cross-validation inside each institution's
training data (criterion: mean validation AUC over institutions; warm starts along the
descending ``lam`` grid), refit GrAUC-PFL on all training data with the chosen values, fit
the baselines, and evaluate every method on the test data (per-site AUC and DeLong SE).

Config (``configs/sim1.toml`` and friends; every table but ``[design]`` is optional)::

    study = "grauc"
    replications = 100
    seed = 1                                # base seed; each (cell, rep) derives its own
    methods = ["grauc", "individual", "fedavg"]
    [design]                                # the grid (lists); all four keys are required
    simulation = [1]
    n_train = [50, 300]                     # simulation 2 draws sizes per site: use 0
    prevalence = [0.3, 0.25, 0.2, 0.15, 0.1, 0.05]
    level = [1, 2, 3]                       # simulation 4 has no shift: use 0
    [data]                                  # fixed data settings (or design keys)
    n_sites = 20
    n_features = 10
    n_test = 200
    [tuning]
    folds = 5
    lam = {max = 3.0, min = 0.01, num = 6}  # log-spaced, or an explicit list
    w_dist = [0.0, 2.0]
    cv_tol = 1e-3                           # looser than the final fit's
    cv_max_rounds = 100
    size_power = [0.0, 1.0]                 # site weighting (default: [grauc]'s size-power)
    [grauc]                                 # GrAUCConfig overrides (run-config names)
    tol = 1e-6
    [figures]
    cell = {simulation = 1, n_train = 50, prevalence = 0.3, level = 3}

Real data (``configs/crime_grauc.toml``, ``configs/cdc_covid.toml``): ``[data] source`` is
``"crime"`` or ``"cdc"`` (:mod:`grauc_flower.realdata`), the design's one required key is
``train_fraction`` (the share of each class of each institution used for training; the
rest is the test set), and a replication is a new random split (the task's seed)::

    [design]
    train_fraction = [0.5]
    [data]
    source = "crime"          # or "cdc"
    path = ""                 # the CSV (cdc: required; crime: empty = the shipped copy)
    min_per_class = 5         # institutions need this many of each class (0: the default)
    max_per_class = 5000      # rows drawn per class and institution (0: all)
    counties = []             # cdc: FIPS codes (empty: the num_counties largest)
    num_counties = 18         # cdc
    missing_levels = "level"  # cdc: Missing/Unknown covariate values: a level, or "drop"
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from strategies import quiet_flower
from strategies.config import GRAUC_METHODS, GrAUCConfig, Table, from_run_config, listing, setting
from strategies.errors import InputError
from strategies.experiments.coverage import coverage_setting
from strategies.experiments.design import (
    Study,
    data_source,
    figure_cell_setting,
    load_study,
    read_config,
    study_methods,
)
from strategies.experiments.runner import add_study_parser, run_study_args
from strategies.stats.tuning import RULES, CVOptions
from strategies.stats.tuning import choose as choose_setting

from . import tuning as cv
from .data import LEVEL_SHIFT, simulate
from .tuning import Grid

#: Design keys (and their types); the first four are required and lead the output columns.
DESIGN_TYPES = {
    "simulation": int,
    "n_train": int,
    "prevalence": float,
    "level": int,
    "n_sites": int,
    "n_features": int,
    "n_test": int,
}
REQUIRED = ("simulation", "n_train", "prevalence", "level")
#: The tuning values a coverage study fixes in the method's table.
COVERAGE_FIXED = ("lam", "w-dist")
SECTIONS = ("data", "tuning", "grauc", "figures", "coverage")
#: Real data (``[data] source``): design keys.
REAL_SOURCES = ("crime", "cdc")
REAL_DESIGN_TYPES = {
    "train_fraction": float,
    "min_per_class": int,
    "max_per_class": int,
    "num_counties": int,
}
REAL_REQUIRED = ("train_fraction",)
TASK = "grauc_flower.study:run_task"


@dataclass(frozen=True)
class StudyTuning(Table):
    """``[tuning]`` of a GrAUC-PFL study."""

    prefix = "tuning"

    folds: int = setting(5, "folds within each site, >= 2", at_least=2)
    lam: tuple[float, ...] = listing(
        tuple(float(v) for v in np.geomspace(3.0, 0.01, 6)),
        "the lam grid: a list, {max, min, num} (log-spaced) or auto (from lam_max)",
        at_least=0, descending=True, spaced=True, words=("auto",),
    )  # fmt: skip
    w_dist: tuple[float, ...] = listing((0.0, 2.0), "the w_dist grid", at_least=0)
    ridge: tuple[float, ...] = listing((), "the ridge grid (default: [grauc]'s ridge)", at_least=0)
    size_power: tuple[float, ...] = listing(
        (), "the site weighting grid (default: [grauc]'s size-power)", at_least=0, at_most=1
    )
    rule: str = setting("best", "the best mean score, or the simplest within 1 SE", RULES)
    cv_tol: float = setting(1e-3, "the cross-validation fits' tolerance, > 0", above=0)
    cv_max_rounds: int = setting(100, "the cross-validation fits' round limit, >= 1", at_least=1)
    comparators: bool = setting(False, "tune each comparator's own setting by the same folds")


@dataclass(frozen=True)
class SimulatedData(Table):
    """``[data]`` of a simulation study: the sizes the design does not vary."""

    prefix = "data"

    source: str = setting("simulated", "where the sites come from", ("simulated",))
    n_sites: int = setting(20, "institutions", at_least=1)
    n_features: int = setting(10, "features", at_least=1)
    n_test: int = setting(200, "test rows per institution", at_least=1)
    counties: tuple[str, ...] = listing(
        (), "FIPS codes: sites at these counties' centroids (empty: n_sites around Los "
        "Angeles and New York)", "code", nonempty=False,
    )  # fmt: skip


@dataclass(frozen=True)
class RealData(Table):
    """``[data]`` of a real-data study (:mod:`grauc_flower.realdata`)."""

    prefix = "data"

    source: str = setting("crime", "the real data set", REAL_SOURCES)
    path: str = setting("", "the CSV (cdc: required; crime: empty = the shipped copy)")
    min_per_class: int = setting(0, "rows of each class an institution needs (0: the default)",
                                 at_least=0)  # fmt: skip
    max_per_class: int = setting(5000, "rows drawn per class and institution (0: all)", at_least=0)
    counties: tuple[str, ...] = listing(
        (), "cdc: FIPS codes (empty: the num_counties largest)", "code", nonempty=False
    )
    num_counties: int = setting(18, "cdc: the largest counties taken", at_least=1)
    missing_levels: str = setting(
        "level", "cdc: Missing/Unknown covariate values as a level, or drop", ("level", "drop")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.counties and self.source != "cdc":
            raise InputError("data.counties: only for source 'cdc'")
        if self.source == "cdc" and not self.path:
            raise InputError(
                "data.path: source 'cdc' needs the CDC file (COVID-19 Case Surveillance)"
            )


@dataclass(frozen=True)
class Settings:
    """The parsed non-design part of a GrAUC study config."""

    methods: tuple[str, ...]
    data: dict
    folds: int
    lam_grid: tuple[float, ...]  # descending; empty: automatic (from lam_max)
    w_dist_grid: tuple[float, ...]
    ridge_grid: tuple[float, ...]
    rule: str
    cv_tol: float
    cv_max_rounds: int
    cfg: GrAUCConfig
    figure_cell: dict | None
    coverage: float | None = None  # [coverage] level: a coverage study at fixed lam, w_dist
    comparators: bool = False  # [tuning] comparators: tune each comparator by the same CV
    size_power_grid: tuple[float, ...] = ()  # [tuning] size_power (empty: the config's)


def parse_settings(settings: dict, keys=REQUIRED) -> Settings:
    """Check and parse the tables of a study config (everything but ``[design]``).

    Parameters
    ----------
    settings : dict
        The config's tables but ``[design]``.
    keys : sequence of str, optional
        The design keys (``[figures] cell`` may set only these).

    Returns
    -------
    Settings
        The parsed settings.
    """
    coverage = coverage_setting(settings, "grauc", COVERAGE_FIXED)
    methods = study_methods(settings, GRAUC_METHODS, ("grauc", "individual", "fedavg"))
    data = parse_data(settings.get("data", {}))
    tuning = StudyTuning.from_table(settings.get("tuning", {}))
    rc = {f"grauc.{k}": v for k, v in settings.get("grauc", {}).items()}
    chosen = (
        ("grauc.seed",) if coverage is not None else ("grauc.lam", "grauc.w-dist", "grauc.seed")
    )
    for key in chosen:
        if key in rc:
            raise InputError(f"{key}: chosen by the study (tuning / per-task seed), not set here")
    for key in ("grauc.inference", "grauc.level"):
        if key in rc and coverage is not None:
            raise InputError(f"{key}: a coverage study sets it; give coverage.level")
    cfg = from_run_config(GrAUCConfig, rc, "grauc")
    if coverage is not None:
        # the truth and its fused groups are stated on the input scale: the study fits there
        if rc.get("grauc.standardize", "none") != "none":
            raise InputError(
                "grauc.standardize: a coverage study's truth is on the input scale; use none"
            )
        cfg = cfg.replace(inference="oracle", level=coverage, standardize="none")
    for grid, key in (("ridge", "grauc.ridge"), ("size_power", "grauc.size-power")):
        if grid in settings.get("tuning", {}) and key in rc:
            raise InputError(f"{key}: tuned by [tuning] {grid}; set one or the other")
    cell = figure_cell_setting(settings, keys)
    return Settings(
        tuple(methods),
        data,
        tuning.folds,
        tuning.lam,
        tuning.w_dist,
        tuning.ridge or (cfg.ridge,),
        tuning.rule,
        tuning.cv_tol,
        tuning.cv_max_rounds,
        cfg,
        cell,
        coverage,
        tuning.comparators,
        tuning.size_power or (cfg.size_power,),
    )


def parse_data(table: dict) -> dict:
    """``[data]``: the simulation's sizes, or a real source's settings (with defaults)."""
    if not isinstance(table, dict):
        raise InputError("data: expected a table")
    kind = SimulatedData if data_source(table, REAL_SOURCES) == "simulated" else RealData
    return asdict(kind.from_table(table))


def real_data(data: dict, cell: dict, seed: int):
    """A real source's sites for one task.

    Parameters
    ----------
    data : dict
        The parsed ``[data]`` table (:func:`parse_data`).
    cell : dict
        The design cell; its values override ``[data]``, its ``train_fraction`` is the
        training share.
    seed : int
        Draws the train/test split.

    Returns
    -------
    sites : list of SiteData
        The sites.
    table : SiteTable
        The loader's table (features, notes; :func:`grauc_flower.realdata.load_real`).
    """
    from .realdata import load_real

    d = {**data, **{k: v for k, v in cell.items() if k in data}}
    return load_real(
        d["source"],
        d["path"],
        cell["train_fraction"],
        seed,
        tuple(d["counties"]),
        d["num_counties"],
        d["min_per_class"],
        d["max_per_class"],
        d["missing_levels"],
    )


def check_real_cell(cell: dict, data: dict) -> None:
    """Reject a real-data cell before anything runs (and read the data once: bad files,
    columns and county lists fail here, with one line).

    Parameters
    ----------
    cell : dict
        The design cell.
    data : dict
        The parsed ``[data]`` table.
    """
    label = ", ".join(f"{k}={v}" for k, v in cell.items())
    if not 0 < cell["train_fraction"] < 1:
        raise InputError(f"design.train_fraction: must be in (0, 1) (cell {label})")
    for key, low in (("min_per_class", 0), ("max_per_class", 0), ("num_counties", 1)):
        if key in cell and cell[key] < low:
            raise InputError(f"design.{key}: must be >= {low} (cell {label})")
    real_data(data, cell, 0)


def check_cell(cell: dict, data: dict) -> None:
    """Reject a design cell the simulation cannot produce (before anything runs).

    Parameters
    ----------
    cell : dict
        The design cell.
    data : dict
        The parsed ``[data]`` table (the cell's values override it).
    """
    label = ", ".join(f"{k}={v}" for k, v in cell.items())
    if cell["simulation"] not in (1, 2, 3, 4):
        raise InputError(f"design.simulation: must be 1, 2, 3 or 4 (cell {label})")
    if not 0 < cell["prevalence"] < 1:
        raise InputError(f"design.prevalence: must be in (0, 1) (cell {label})")
    if cell["level"] not in LEVEL_SHIFT:
        raise InputError(f"design.level: must be 0, 1, 2 or 3 (cell {label})")
    if cell["simulation"] != 2 and cell["n_train"] < 8:
        raise InputError(f"design.n_train: must be >= 8 (4 of each class) (cell {label})")
    merged = {**data, **{k: v for k, v in cell.items() if k in data}}
    if merged["n_sites"] < 2:
        raise InputError(f"n_sites: must be >= 2 (cell {label})")
    if merged["n_test"] < 8:
        raise InputError(f"n_test: must be >= 8 (4 of each class) (cell {label})")


def load(path: str) -> tuple[Study, Settings]:
    raw = read_config(path)
    coverage_setting(raw, "grauc", COVERAGE_FIXED)  # before the design's keys are checked
    source = data_source(raw.get("data", {}), REAL_SOURCES)
    if source == "simulated":
        study = load_study(path, "grauc", DESIGN_TYPES, REQUIRED, SECTIONS)
    else:
        study = load_study(path, "grauc", REAL_DESIGN_TYPES, REAL_REQUIRED, SECTIONS)
    settings = parse_settings(study.settings, study.keys)
    for cell in study.cells:
        if source == "simulated":
            check_cell(cell, settings.data)
        else:
            check_real_cell(cell, settings.data)
    return study, settings


# ---------------------------------------------------------------------------------------
# One task
# ---------------------------------------------------------------------------------------
def _cv_options(st: Settings, seed: int) -> CVOptions:
    """The study's CV (in this process: the study runs its tasks in parallel)."""
    return CVOptions(
        folds=st.folds,
        rule=st.rule,
        tol=st.cv_tol,
        max_rounds=st.cv_max_rounds,
        jobs=1,
        seed=seed,
        quiet=True,
    )


def cross_validate(sites, cfg: GrAUCConfig, st: Settings, seed: int) -> pd.DataFrame:
    """The task's cross-validation table (:func:`grauc_flower.tuning.cross_validate` on the
    config's grid).

    Parameters
    ----------
    sites : sequence of SiteData
        The task's sites.
    cfg : GrAUCConfig
        The task's settings (those the grid does not vary).
    st : Settings
        The study's settings: the grids and the cross-validation's options.
    seed : int
        The folds' seed.

    Returns
    -------
    pandas.DataFrame
        The table, a row per fold and setting (``val_auc``, ...).
    """
    grid = Grid(
        lam=st.lam_grid, w_dist=st.w_dist_grid, ridge=st.ridge_grid, size_power=st.size_power_grid
    )
    return cv.cross_validate(sites, cfg, "grauc", grid, _cv_options(st, seed))


def tuned_comparator(sites, cfg: GrAUCConfig, method: str, st: Settings, seed: int):
    """With ``[tuning] comparators = true``: ``method``'s settings chosen by the same folds,
    rule and ridge grid as GrAUC-PFL's (:func:`grauc_flower.tuning.tune`: the ridge and the
    comparator's own setting).

    Parameters
    ----------
    sites : sequence of SiteData
        The task's sites.
    cfg : GrAUCConfig
        The task's settings (those the grid does not vary).
    method : str
        The comparator.
    st : Settings
        The study's settings: the ridge and size-power grids and the cross-validation's
        options.
    seed : int
        The folds' seed.

    Returns
    -------
    cfg : GrAUCConfig
        ``cfg`` at the choice.
    chosen : dict
        ``{setting: value}`` of the comparator's tuned settings.
    """
    tuned, _, summary = cv.tune(
        sites,
        cfg,
        method,
        Grid(ridge=st.ridge_grid, size_power=st.size_power_grid),
        _cv_options(st, seed),
    )
    chosen = summary[summary["chosen"]].iloc[0]
    return tuned, {k: chosen[k] for k in cv.PARAMS[method]}


def choose(table: pd.DataFrame, rule: str = "best") -> dict:
    """``lam``, ``w_dist``, ``ridge`` and ``size_power`` by :func:`strategies.stats.tuning.choose`
    (mean validation AUC over folds).

    Parameters
    ----------
    table : pandas.DataFrame
        The cross-validation table (:func:`cross_validate`).
    rule : str, optional
        ``"best"`` (the best mean) or ``"1se"`` (the simplest within one standard error).

    Returns
    -------
    dict
        The chosen value of each setting.
    """
    chosen, _ = choose_setting(
        table, cv.PARAMS["grauc"], "val_auc", True, rule, cv.SIMPLEST["grauc"]
    )
    return chosen


def simulation_arguments(st: Settings, cell: dict) -> dict:
    """The design cell's :func:`grauc_flower.data.simulate` arguments, without the seed.

    Parameters
    ----------
    st : Settings
        The study's settings (its ``[data]``).
    cell : dict
        The design cell; its values override ``[data]``.

    Returns
    -------
    dict
        ``simulation, n_sites, n_features, n_train, n_test, prevalence, level, counties``.
    """
    data = {**st.data, **{k: v for k, v in cell.items() if k in st.data}}
    return {
        "simulation": cell["simulation"],
        "n_sites": data["n_sites"],
        "n_features": data["n_features"],
        "n_train": cell["n_train"],
        "n_test": data["n_test"],
        "prevalence": cell["prevalence"],
        "level": cell["level"],
        "counties": tuple(data.get("counties", ())),
    }


def simulated_sites(st: Settings, cell: dict, seed: int) -> tuple[list, list[str]]:
    """A simulated cell's sites (docs/methods.md 1.8) and feature names.

    Parameters
    ----------
    st : Settings
        The study's settings (its ``[data]``).
    cell : dict
        The design cell.
    seed : int
        The simulation's seed.

    Returns
    -------
    sites : list of SiteData
        The simulated sites.
    features : list of str
        ``x1, x2, ...``.
    """
    args = simulation_arguments(st, cell)
    return simulate(**args, seed=seed), [f"x{j + 1}" for j in range(args["n_features"])]


def run_task(settings: dict, cell: dict, rep: int, seed: int) -> dict[str, pd.DataFrame]:
    """One (cell, replication): data, tuning, fits, test AUC.

    Parameters
    ----------
    settings : dict
        The study config's tables but ``[design]``.
    cell : dict
        The design values of the task's cell.
    rep : int
        The replication.
    seed : int
        The task's seed (the data, the folds and the fits).

    Returns
    -------
    dict of str to pandas.DataFrame
        ``results`` (one row per method and site), ``coef`` (coefficients, input scale),
        ``clusters`` (GrAUC-PFL's fused groups per feature) and ``cv`` (the tuning table);
        the last two when GrAUC-PFL is among the methods.
    """
    quiet_flower()
    from .federation import auc_table, run_methods_inprocess

    st = parse_settings(settings, tuple(cell))
    if st.data["source"] == "simulated":
        sites, features = simulated_sites(st, cell, seed)
    else:  # a real source: a new stratified train/test split per replication
        sites, source_table = real_data(st.data, cell, seed)
        features = list(source_table.features)
    cfg = st.cfg.replace(seed=seed)
    frames: dict[str, pd.DataFrame] = {}
    lam = w_dist = float("nan")
    ridge, power = cfg.ridge, cfg.size_power
    if "grauc" in st.methods:
        table = cross_validate(sites, cfg, st, seed)
        chosen = choose(table, st.rule)
        lam, w_dist, ridge = chosen["lam"], chosen["w_dist"], chosen["ridge"]
        power = chosen["size_power"]
        frames["cv"] = table
    results, tuned = {}, {}
    for method in st.methods:  # GrAUC-PFL at its tuned setting; the baselines at the config's
        point = cfg  # or, with [tuning] comparators, at theirs
        if method == "grauc":
            point = cfg.replace(lam=lam, w_dist=w_dist, ridge=ridge, size_power=power)
        elif st.comparators and method in cv.PARAMS:
            point, tuned[method] = tuned_comparator(sites, cfg, method, st, seed)
        results.update(run_methods_inprocess(point, sites, [method]))
    table = auc_table(results)
    is_grauc = table["method"] == "grauc"
    table["lam"] = np.where(is_grauc, lam, np.nan)
    table["w_dist"] = np.where(is_grauc, w_dist, np.nan)
    table["size_power"] = np.where(is_grauc, power, np.nan)
    ridges = {m: float(t["ridge"]) for m, t in tuned.items()}
    table["ridge"] = np.where(is_grauc, ridge, table["method"].map(ridges).fillna(cfg.ridge))
    if st.comparators:  # each comparator's own tuned setting, as "name=value"
        table["tuned"] = table["method"].map(
            {
                m: ";".join(f"{k}={v:g}" for k, v in t.items() if k != "ridge")
                for m, t in tuned.items()
            }
        )
    table["rounds"] = table["method"].map({m: r.rounds for m, r in results.items()})
    table["converged"] = table["method"].map({m: r.converged for m, r in results.items()})
    n_train = {s.site: (s.n_pos, s.n_neg) for s in sites}
    table["n_train_pos"] = table["site"].map(lambda z: n_train[z][0])
    table["n_train_neg"] = table["site"].map(lambda z: n_train[z][1])
    table["seed"] = seed
    table.insert(0, "rep", rep)
    for pos, key in enumerate(cell):
        table.insert(pos, key, cell[key])
    frames["results"] = table

    coef = []
    lat = {s.site: s.lat for s in sites}
    lon = {s.site: s.lon for s in sites}
    for method, res in results.items():
        frame = pd.DataFrame(res.coefficients, columns=features)
        frame.insert(0, "lon", [lon[s] for s in res.sites])
        frame.insert(0, "lat", [lat[s] for s in res.sites])
        frame.insert(0, "site", res.sites)
        frame.insert(0, "method", method)
        coef.append(frame)
    frames["coef"] = pd.concat(coef, ignore_index=True)
    if "grauc" in results:
        clusters = pd.DataFrame(results["grauc"].extra["clusters"], columns=features)
        clusters.insert(0, "site", results["grauc"].sites)
        frames["clusters"] = clusters
    return frames


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    """The ``study`` subcommand."""
    add_study_parser(sub)


def cmd_study(a, study, st) -> int:
    """A study of the config ``a.config`` read as ``(study, st)`` by :func:`load` (a
    coverage study is :func:`grauc_flower.coverage.run`'s).

    Parameters
    ----------
    a : argparse.Namespace
        The ``study`` command's options.
    study : Study
        The study config.
    st : Settings
        Its parsed settings (not read here: each task parses the config's tables itself).

    Returns
    -------
    int
        The exit status.
    """
    from .figures import make_figures

    return run_study_args(a, study, TASK, ("auc",), make_figures)


__all__ = [
    "Settings",
    "choose",
    "cmd_study",
    "cross_validate",
    "load",
    "parse_settings",
    "run_task",
    "simulated_sites",
    "simulation_arguments",
]
