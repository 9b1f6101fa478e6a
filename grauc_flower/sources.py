"""Where a federation's data come from and its settings (light imports: the ClientApp uses
this in every message's process)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from strategies.config import GRAUC_METHODS, GrAUCConfig, from_run_config, parse_methods
from strategies.errors import InputError

from .data import SiteData, load_csv, simulate


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

    @classmethod
    def from_run_config(cls, rc: dict) -> DataSpec:
        return cls(
            source=str(rc.get("data.source", "simulated")),
            simulation=int(rc.get("data.simulation", 1)),
            n_sites=int(rc.get("data.num-sites", 20)),
            n_features=int(rc.get("data.num-features", 10)),
            n_train=int(rc.get("data.n-train", 50)),
            n_test=int(rc.get("data.n-test", 200)),
            prevalence=float(rc.get("data.prevalence", 0.3)),
            level=int(rc.get("data.level", 3)),
            data_seed=int(rc.get("data.seed", 0)),
            data_path=str(rc.get("data.path", "")),
            sites_path=str(rc.get("data.sites-path", "")),
            allow_missing_class=str(rc.get("grauc.missing-class", "error")) == "borrow",
            counties=str(rc.get("data.counties", "")),
            num_counties=int(rc.get("data.num-counties", 18)),
            train_fraction=float(rc.get("data.train-fraction", 0.0)),
            min_per_class=int(rc.get("data.min-per-class", 0)),
            max_per_class=int(rc.get("data.max-per-class", 5000)),
            missing_levels=str(rc.get("data.missing-levels", "level")),
        )

    def to_run_config(self) -> dict:
        return {
            "data.source": self.source,
            "data.simulation": self.simulation,
            "data.num-sites": self.n_sites,
            "data.num-features": self.n_features,
            "data.n-train": self.n_train,
            "data.n-test": self.n_test,
            "data.prevalence": self.prevalence,
            "data.level": self.level,
            "data.seed": self.data_seed,
            "data.path": self.data_path,
            "data.sites-path": self.sites_path,
            "data.counties": self.counties,
            "data.num-counties": self.num_counties,
            "data.train-fraction": self.train_fraction,
            "data.min-per-class": self.min_per_class,
            "data.max-per-class": self.max_per_class,
            "data.missing-levels": self.missing_levels,
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
        return tuple(sites), tuple(features)
    if spec.source in ("cdc", "crime"):
        sites, table = load_real_spec(spec)
        return tuple(sites), table.features
    raise InputError(f"data.source: must be simulated, csv, cdc or crime, got {spec.source!r}")


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
