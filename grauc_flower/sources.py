"""Where a federation's data come from and its settings (light imports: the ClientApp uses
this in every message's process)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from strategies.config import GRAUC_METHODS, GrAUCConfig, from_run_config, parse_methods
from strategies.errors import InputError

from .data import SiteData, add_test_data, hold_out, load_csv, simulate


@dataclass(frozen=True)
class DataSpec:
    """Where a federation's data come from (run-config keys ``data.*``)."""

    source: str = "simulated"  # simulated | csv | cdc | crime
    simulation: int = 1
    n_sites: int = 20
    n_features: int = 10
    n_train: int = 50
    n_test: int = 200
    prevalence: float = 0.3
    level: int = 3
    data_seed: int = 0
    data_path: str = ""
    sites_path: str = ""
    allow_missing_class: bool = False
    # real data (cdc: the CDC COVID-19 file at data_path; crime: the shipped Communities and
    # Crime copy, or data_path); see grauc_flower.realdata
    counties: str = ""  # cdc: comma-separated FIPS codes; empty = the largest num_counties
    num_counties: int = 18
    train_fraction: float = 0.0  # per class and institution; 0 = the source's (cdc 0.2)
    min_per_class: int = 0  # institutions need this many of each class; 0 = the source's
    max_per_class: int = 5000  # at most this many rows per class and institution; 0 = all
    missing_levels: str = "level"  # cdc: Missing/Unknown covariates a level, or drop
    # csv: a test set, from a file with the data's columns or held out of each site
    test_path: str = ""
    holdout: float = 0.0  # share of each class of each site held out (seeded by data_seed)

    @classmethod
    def from_run_config(cls, rc: dict) -> DataSpec:
        """The spec from a run config's ``data.*`` keys (and ``grauc.missing-class``); an
        unknown ``data.*`` key or a value of the wrong type is an error naming the key."""
        kinds = {f.name: f.type for f in fields(cls)}
        kwargs = {}
        for key, value in rc.items():
            if not key.startswith("data."):
                continue
            if key not in DATA_KEYS:
                raise InputError(f"{key}: unknown setting")
            name = DATA_KEYS[key]
            kind = {"int": int, "float": float, "str": str}[kinds[name]]
            try:
                if kind is int and isinstance(value, float) and not value.is_integer():
                    raise ValueError
                kwargs[name] = kind(value)
            except (TypeError, ValueError):
                raise InputError(f"{key}: expected {kinds[name]}, got {value!r}") from None
        kwargs["allow_missing_class"] = str(rc.get("grauc.missing-class", "error")) == "borrow"
        return cls(**kwargs)

    def to_run_config(self) -> dict:
        return {key: getattr(self, name) for key, name in DATA_KEYS.items()}


#: Run-config key -> :class:`DataSpec` field.
DATA_KEYS = {
    "data.source": "source",
    "data.simulation": "simulation",
    "data.num-sites": "n_sites",
    "data.num-features": "n_features",
    "data.n-train": "n_train",
    "data.n-test": "n_test",
    "data.prevalence": "prevalence",
    "data.level": "level",
    "data.seed": "data_seed",
    "data.path": "data_path",
    "data.sites-path": "sites_path",
    "data.counties": "counties",
    "data.num-counties": "num_counties",
    "data.train-fraction": "train_fraction",
    "data.min-per-class": "min_per_class",
    "data.max-per-class": "max_per_class",
    "data.missing-levels": "missing_levels",
    "data.test-path": "test_path",
    "data.holdout": "holdout",
}


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
    raise InputError(f"data.source: must be simulated, csv, cdc or crime, got {spec.source!r}")


def with_test_set(sites, spec: DataSpec) -> list[SiteData]:
    """``sites`` with the test set ``spec`` asks for (``test_path`` or ``holdout``)."""
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


def grauc_config(rc: dict) -> GrAUCConfig:
    return from_run_config(GrAUCConfig, rc, "grauc")


def grauc_methods(rc: dict) -> list[str]:
    return parse_methods(rc.get("method", "grauc"), GRAUC_METHODS)
