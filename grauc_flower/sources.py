"""Where a federation's data come from and its settings (light imports: the ClientApp uses
this in every message's process)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from strategies.config import Section, setting
from strategies.errors import InputError

from .data import SiteData, add_test_data, hold_out, load_csv, simulate

#: Where a GrAUC-PFL federation's rows can come from (``data.source``).
SOURCES = ("simulated", "csv", "cdc", "crime")


@dataclass(frozen=True)
class DataSpec(Section):
    """Where a federation's data come from (run-config keys ``data.*``; the ``fit`` options
    named by ``flag``): one declaration for the keys, the options, their defaults and their
    checks (:func:`strategies.config.setting`)."""

    prefix = "data"

    source: str = setting(
        "simulated",
        "simulated (the main job), csv (data.path, data.sites-path), cdc (the CDC COVID-19 "
        "case file at data.path), crime (Communities and Crime)",
        SOURCES,
    )
    simulation: int = setting(1, "simulated: the paper's simulation 1-4", at_least=1, at_most=4)
    n_sites: int = setting(20, "simulated: sites >= 1", at_least=1, key="num-sites")
    n_features: int = setting(10, "simulated: features >= 1", at_least=1, key="num-features")
    n_train: int = setting(50, "simulated: training rows per site >= 1", at_least=1)
    n_test: int = setting(200, "simulated: test rows per site >= 0", at_least=0)
    prevalence: float = setting(0.3, "simulated: share of positives, in (0, 1)", above=0, below=1)
    level: int = setting(
        3, "simulated: how far the two mean groups differ, 0 (not) to 3", at_least=0, at_most=3
    )
    data_seed: int = setting(
        0,
        "the train/test split (cdc, crime, --holdout), the simulation and the folds",
        key="seed",
        flag="data-seed",
        metavar="SEED",
    )
    data_path: str = setting("", "csv: the rows; cdc: the case file; crime: a copy", key="path")
    sites_path: str = setting("", "csv: site, lat, lon", key="sites-path")
    allow_missing_class: bool = setting(
        False, "a site may lack a class (grauc.missing-class = borrow)", key=False
    )
    counties: str = setting(
        "", "cdc: comma-separated county FIPS codes (empty: the largest); simulated: sites at "
        "these counties' centroids (empty: around Los Angeles and New York)", flag="counties",
        metavar="LIST",
    )  # fmt: skip
    num_counties: int = setting(
        18, "cdc: the largest N counties, >= 1", at_least=1, flag="num-counties", metavar="N"
    )
    train_fraction: float = setting(
        0.0,
        "cdc/crime: training share of each class per site, in [0, 1); 0: the source's "
        "(cdc 0.2, crime 0.5)",
        at_least=0,
        below=1,
        flag="train-fraction",
        metavar="F",
    )
    min_per_class: int = setting(
        0,
        "cdc/crime: a site needs this many rows of each class; 0: the source's (cdc 15, crime 5)",
        at_least=0,
        flag="min-per-class",
        metavar="N",
    )
    max_per_class: int = setting(
        5000,
        "cdc/crime: at most this many rows per class and site; 0 = all",
        at_least=0,
        flag="max-per-class",
        metavar="N",
    )
    missing_levels: str = setting(
        "level",
        "cdc: Missing/Unknown covariates as a level of their own, or drop the rows",
        ("level", "drop"),
        flag="missing-levels",
    )
    test_path: str = setting("", "csv: a test file with the data's columns")
    holdout: float = setting(
        0.0, "csv: share of each class of each site held out for testing, in [0, 1)",
        at_least=0, below=1,
    )  # fmt: skip

    @classmethod
    def from_run_config(cls, run_config: dict, **fixed) -> DataSpec:
        """The spec from a run config's ``data.*`` keys and ``grauc.missing-class``."""
        borrow = str(run_config.get("grauc.missing-class", "error")) == "borrow"
        return super().from_run_config(run_config, allow_missing_class=borrow, **fixed)


@functools.lru_cache(maxsize=4)
def load_sites(spec: DataSpec) -> tuple[tuple[SiteData, ...], tuple[str, ...]]:
    """All sites' data for ``spec`` (cached per process)."""
    if spec.source == "simulated":
        sites = simulate(
            spec.simulation,
            spec.n_sites,
            spec.n_features,
            spec.n_train,
            spec.n_test,
            spec.prevalence,
            spec.level,
            spec.data_seed,
            counties=spec.counties,
        )
        return tuple(sites), tuple(f"x{k + 1}" for k in range(spec.n_features))
    if spec.source == "csv":
        if not spec.data_path or not spec.sites_path:
            raise InputError("data.path: the csv source needs data.path and data.sites-path")
        sites, features = load_csv(spec.data_path, spec.sites_path, spec.allow_missing_class)
        return tuple(with_test_set(sites, spec)), tuple(features)
    if spec.source in ("cdc", "crime"):
        sites, table = load_real_spec(spec)
        return tuple(sites), table.features
    raise AssertionError(spec.source)  # DataSpec checks its source


def with_test_set(sites, spec: DataSpec) -> list[SiteData]:
    """``sites`` with the test set ``spec`` asks for: a test file or a holdout share, not both.

    Parameters
    ----------
    sites : sequence of SiteData
        The sites read from the csv source.
    spec : DataSpec
        Its ``test_path`` (:func:`~grauc_flower.data.add_test_data`) or ``holdout`` and
        ``data_seed`` (:func:`~grauc_flower.data.hold_out`).

    Returns
    -------
    list of SiteData
        The sites with their test rows (as given when ``spec`` asks for none).
    """
    if spec.test_path and spec.holdout:
        raise InputError("holdout: give a test file or a holdout share, not both")
    if spec.test_path:
        return add_test_data(list(sites), spec.test_path)
    if spec.holdout:
        return hold_out(list(sites), spec.holdout, spec.data_seed)
    return list(sites)


def load_real_spec(spec: DataSpec):
    """Sites and the loader's table (features, notes) of a ``cdc`` or ``crime`` spec."""
    from .realdata import load_real

    return load_real(
        spec.source,
        spec.data_path,
        spec.train_fraction,
        spec.data_seed,
        spec.counties,
        spec.num_counties,
        spec.min_per_class,
        spec.max_per_class,
        spec.missing_levels,
    )
