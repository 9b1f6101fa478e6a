"""GrAUC-PFL from Python: the :class:`GrAUCPFL` estimator and the fit's flow
(:func:`fit_to_dir`) that it and ``python -m grauc_flower fit`` both run.

>>> from grauc_flower import GrAUCPFL
>>> model = GrAUCPFL(lam=0.1).fit(data, sites)     # data: site, y, features; sites: lat, lon
>>> model.coef_                                     # sites x features, input scale

docs/api.md has a worked session; every parameter is a ``fit`` option (docs/usage.md).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import numpy as np
import pandas as pd

from strategies.api import FederatedModel, as_csv
from strategies.config import GRAUC_FUSED_METHODS, CheckpointConfig, GrAUCConfig, to_run_config
from strategies.datasets.tables import as_path
from strategies.errors import InputError
from strategies.runtime.cli import (
    check_test_arguments,
    from_flags,
    guards_from_args,
    guards_record,
    guards_run_config,
    moments_asked,
    note_default_floors,
    settings_from_args,
)
from strategies.runtime.fitflow import FitFlow
from strategies.runtime.tuning_options import tune_run_config
from strategies.stats.tuning import size_powers

from . import federated_tuning, tuning
from .sources import DataSpec


def config_from_args(a) -> GrAUCConfig:
    return settings_from_args(GrAUCConfig, a)


def _data_spec(a):
    """The fit command's data as a :class:`~grauc_flower.sources.DataSpec` (what the Flower
    engine's ClientApps load); checks which files each source needs."""
    if a.source == "csv":
        for key in ("data", "sites"):
            if not getattr(a, key):
                raise InputError(f"{key}: --source csv needs --data and --sites")
    elif a.test_data or a.holdout:
        key = "test-data" if a.test_data else "holdout"
        raise InputError(
            f"{key}: --source {a.source} has its own test set "
            + ("(the simulation's test rows)" if a.source == "simulated" else "(--train-fraction)")
        )
    if a.source == "simulated" and (a.data or a.sites):
        raise InputError("data: --source simulated takes no --data or --sites")
    check_test_arguments(a)
    if a.source == "cdc" and not a.data:
        raise InputError("data: --source cdc needs --data (the CDC COVID-19 case file)")
    if a.source in ("cdc", "crime") and a.sites:
        raise InputError(f"sites: --source {a.source} places sites at the shipped centroids")
    return from_flags(
        DataSpec,
        a,
        source=a.source,
        data_path=as_path(a.data) if a.data else "",
        sites_path=as_path(a.sites) if a.sites else "",
        allow_missing_class=a.missing_class == "borrow",
        test_path=as_path(a.test_data) if a.test_data else "",
        holdout=a.holdout,
    )


def _checkpoint(a) -> CheckpointConfig:
    """The checkpoint options, their paths made absolute."""
    return from_flags(
        CheckpointConfig,
        a,
        path=os.path.abspath(a.checkpoint) if a.checkpoint else "",
        resume=os.path.abspath(a.resume) if a.resume else "",
    )


def _grid(a) -> tuning.Grid:
    """The cross-validation grid of the options (each value checked)."""
    from strategies.stats.tuning import parse_grid

    def given(name: str, default, minimum: float = 0.0):
        text = getattr(a, name.replace("-", "_") + "_grid")
        return parse_grid(text, f"{name}-grid", minimum) if text else default

    rounds = given("rounds", tuning.ROUNDS_GRID, 1)
    if any(r != int(r) for r in rounds):
        raise InputError(f"rounds-grid: values must be integers >= 1, got {a.rounds_grid!r}")
    return tuning.Grid(
        lam=given("lam", ()),
        w_dist=given("w-dist", tuning.W_DIST_GRID),
        ridge=given("ridge", tuning.RIDGE_GRID),
        fedavg_rounds=tuple(int(r) for r in rounds),
        knob=a.knob_grid or None,
        size_power=a.size_power_grid or (),  # checked once the sites are known
    )


def _check_tuning(a) -> None:
    from strategies.stats.tuning import KNOBS

    grids = (
        "lam_grid",
        "w_dist_grid",
        "ridge_grid",
        "rounds_grid",
        "knob_grid",
        "size_power_grid",
    )
    if not a.tune:
        for g in grids:
            if getattr(a, g):
                raise InputError(f"{g.replace('_', '-')}: grids need --tune cv")
        return
    if a.method not in tuning.PARAMS:
        raise InputError(f"tune: cv is available for {', '.join(tuning.PARAMS)}, not {a.method}")
    if a.knob_grid and a.method not in KNOBS:
        raise InputError(f"knob-grid: {a.method} has no setting to tune besides its levels")
    if a.size_power_grid and a.method not in GRAUC_FUSED_METHODS:
        raise InputError(
            f"size-power-grid: {a.method} does not weight its sites (a fused method does)"
        )
    knob = KNOBS[a.method].name if a.method in KNOBS else None
    for name in tuning.PARAMS[a.method]:
        if getattr(a, name, None) is not None:
            key = name.replace("_", "-")
            grid = {"fedavg_rounds": "rounds", knob: "knob"}.get(name, key)
            raise InputError(f"{key}: chosen by --tune cv; give --{grid}-grid to set its values")


def _load(a, spec):
    """The sites (with their test rows, if any) and the feature names."""
    from .sources import load_real_spec, load_sites

    if a.source in ("csv", "simulated"):
        sites, features = load_sites(spec)
        if not sites:
            raise InputError("data: no site of the data is in the sites file")
        return list(sites), features
    sites, table = load_real_spec(spec)
    if not a.quiet:
        for note in table.notes:
            sys.stderr.write(f"note: {note}\n")
        n_train = sum(len(s.y_train) for s in sites)
        n_test = sum(len(s.y_test) for s in sites)
        sys.stderr.write(
            f"{a.source}: {len(sites)} sites, {len(table.features)} features, "
            f"{n_train} training and {n_test} test rows\n"
        )
    return list(sites), table.features


def _calibration_only(tmp: str, run: dict, opts) -> dict:
    """A plain fit's outputs after the cross-validation that calibrated it: ``metrics.json``
    without a choice (``tuned``, ``at_grid_edge``, ``cv``), with the calibration's folds and
    rounds, and no ``cv.csv`` (one setting, nothing chosen)."""
    for key in ("tuned", "at_grid_edge"):
        run.pop(key, None)
    cv = run.pop("cv", {})
    run["calibration"] = {
        **run.get("calibration", {}),
        "from": "each site's pooled out-of-fold scores at the fit's own setting",
        "folds": opts.folds,
        "cv_auc": cv.get("mean"),
    }
    run["tuning"] = {**run.get("tuning", {}), "purpose": "calibration"}
    with open(os.path.join(tmp, "metrics.json"), "w") as fh:
        json.dump(run, fh, indent=2)
    os.remove(os.path.join(tmp, "cv.csv"))
    return run


class GrAUCFit(FitFlow):
    """GrAUC-PFL's part of the ``fit`` flow (:class:`strategies.runtime.fitflow.FitFlow`):
    its data sources, the calibration batched with a fused method's plain fit, its run config
    and its files."""

    def prepare(self) -> None:
        a = self.a
        self.cfg = config_from_args(a)
        _check_tuning(a)
        grid = _grid(a) if a.tune else None
        self.spec = _data_spec(a)
        self.guards = guards_from_args(a)
        sites, self.features = _load(a, self.spec)
        counts = [(s.site, len(s.y_train), {"1": s.n_pos, "0": s.n_neg}, s.n_features)
                  for s in sites]  # fmt: skip
        self.refused = note_default_floors(
            counts, moments_asked(self.cfg, "a Hessian or covariance")
        )
        if grid is not None:
            sizes = [len(s.y_train) for s in sites]
            grid = replace(grid, size_power=size_powers(sizes, self.cfg, a.size_power_grid or None))
        # a fused method's plain fit is calibrated too: the cross-validation of its own
        # setting, batched with the fit (docs/methods.md 3.14); its result is the plain fit
        calibrate = (
            not a.tune and a.method in GRAUC_FUSED_METHODS and a.calibration
            and not (a.checkpoint or a.resume)
        )  # fmt: skip
        if calibrate and max(min(s.n_pos, s.n_neg) for s in sites) < a.folds:
            calibrate = False  # no site fills the folds: a plain fit, without risks
            sys.stderr.write(
                f"note: no calibration (no site has {a.folds} training rows of each class for "
                "the folds; give fewer --folds)\n"
            )
        if calibrate:
            cfg = self.cfg
            grid = tuning.Grid(lam=(cfg.lam,), w_dist=(cfg.w_dist,), ridge=(cfg.ridge,),
                               size_power=(cfg.size_power,))  # fmt: skip
        self.sites, self.grid, self.calibrate = sites, grid, calibrate

    def federated(self) -> bool:
        """A fused method is tuned (or calibrated) inside the federation, in one batched run
        on either engine; the comparators by the in-process cross-validation, then refitted."""
        return (self.a.tune == "cv" or self.calibrate) and self.a.method in GRAUC_FUSED_METHODS

    def cv_options(self):
        return super().cv_options() if self.a.tune == "cv" or self.calibrate else None

    def cross_validate(self, opts) -> tuple:
        a = self.a
        cfg, table, summary = tuning.tune(
            self.sites, self.cfg, a.method, self.grid, opts, widen=True
        )
        return cfg, table, summary, tuning.PARAMS[a.method]

    def round_limit(self) -> int:
        from . import federation as fed

        return fed.round_limit(self.a.method, self.cfg)

    def n_sites(self) -> int:
        return len(self.sites)

    def run_inprocess(self, tmp: str, federated: bool, opts, progress) -> None:
        from . import federation as fed

        a = self.a
        ckpt = _checkpoint(a).strategy_kwargs()
        if ckpt["resume"] and not os.path.isfile(ckpt["resume"]):
            raise InputError(f"resume: file not found: {a.resume}")
        if federated and (ckpt["checkpoint"] or ckpt["resume"]):
            raise InputError("checkpoint: not with --tune cv (the tuning runs many fits)")
        if federated:
            res = federated_tuning.run_tuned_inprocess(
                self.cfg, self.sites, a.method, (opts, self.grid), progress, self.guards
            )
        else:
            res = fed.run_methods_inprocess(
                self.cfg, self.sites, [a.method], progress=progress, checkpoint=ckpt,
                guards=self.guards,
            )[a.method]  # fmt: skip
        fed.write_result(tmp, res, self.features, self.cfg)

    def run_config(self, tmp: str, federated: bool, opts) -> dict:
        a = self.a
        rc = {
            **to_run_config(self.cfg, "grauc"),
            "task": "grauc",
            "method": a.method,
            "out-dir": tmp,
            **self.spec.to_run_config(),
            "data.num-sites": len(self.sites),
            **_checkpoint(a).to_run_config(),
            **guards_run_config(self.guards),
        }
        if federated:
            grid = self.grid
            grids = {"lam-grid": grid.lam, "w-dist-grid": grid.w_dist}
            grids.update({"ridge-grid": grid.ridge, "size-power-grid": grid.size_power})
            rc.update(tune_run_config("cv", opts, grids))
        return rc

    def after_run(self, tmp: str, federated: bool, opts) -> None:
        with open(os.path.join(tmp, "metrics.json")) as fh:
            run = json.load(fh)
        if self.calibrate:  # the one setting's cross-validation gave the calibration, no choice
            _calibration_only(tmp, run, opts)
        elif federated and not self.a.quiet:
            chosen = ", ".join(f"{k} = {v:g}" for k, v in run["tuned"].items())
            t = run["tuning"]
            sys.stderr.write(
                f"cv: chose {chosen} (criterion {opts.criterion}, {run['cv']['score']} "
                f"{run['cv']['mean']:.4f}); tuning and refit took {t['rounds']} rounds "
                f"for {t['fits']} fits\n"
            )

    def updates(self, seconds: float) -> dict:
        a = self.a
        return dict(
            engine=a.engine,
            features=list(self.features),
            n_sites=len(self.sites),
            seconds=seconds,
            source=a.source,
            data=_named(a, "data"),
            sites=_named(a, "sites"),
            guards=guards_record(self.guards, self.refused),
            **self.extra,
        )

    def split(self) -> dict:
        a, sites = self.a, self.sites
        n_test = sum(len(s.y_test) for s in sites)
        test = "file" if a.test_data else "holdout" if a.holdout else "source"
        return {
            "test": test if n_test else "none",
            "holdout": a.holdout or None,
            "train-fraction": self.spec.train_fraction if a.source in ("cdc", "crime") else None,
            "data-seed": self.spec.data_seed,
            "n_train": sum(len(s.y_train) for s in sites),
            "n_test": n_test,
        }

    def write_test(self, tmp: str, metrics: dict) -> dict:
        from . import federation as fed

        return fed.write_test_table(tmp, metrics, [s.site for s in self.sites])

    def own_files(self, where: str) -> None:
        from . import federation as fed

        fed.sites_table(self.sites).to_csv(os.path.join(where, "sites.csv"), index=False)

    def report(self, where: str) -> str:
        from .fitreport import fit_report

        return fit_report(where)


def fit_to_dir(a) -> dict:
    """The fit of ``fit``'s options ``a`` (an :mod:`argparse` namespace of the ``fit``
    subcommand, or :class:`GrAUCPFL`'s) into the directory ``a.out``: every file the
    command line writes, all or nothing (:class:`GrAUCFit`).  Returns ``metrics.json``'s
    content."""
    return GrAUCFit(a).run()


def _named(a, key: str) -> str:
    """How ``metrics.json`` names the fit's data or sites: the file, ``(built in)``, or
    what the API was given (a data frame)."""
    given = getattr(a, f"{key}_name", "")
    path = getattr(a, key)
    return given or (as_path(path) if path else "(built in)")


#: The ``fit`` options that describe the data: arguments of :meth:`GrAUCPFL.fit`.
DATA_OPTIONS = (
    "source", "data", "sites", "test_data", "holdout", "train_fraction", "counties",
    "num_counties", "min_per_class", "max_per_class", "missing_levels",
)  # fmt: skip


class GrAUCPFL(FederatedModel):
    """GrAUC-PFL (or a comparator, ``method=``) fitted across sites, from Python.

    Parameters
    ----------
    **params
        Any option of ``python -m grauc_flower fit`` by its Python name (``lam``,
        ``w_dist``, ``ridge``, ``method``, ``engine``, ``tune``, ``folds``,
        ``lam_grid``, ``min_rows``, ``calibration``, ``data_seed``, ...; docs/usage.md),
        with the same defaults and checks; grids may be lists.  ``GrAUCPFL.param_names()``
        lists them.

    Attributes
    ----------
    coef_ : pandas.DataFrame
        Each site's coefficients (rows: sites; columns: features), on the input scale.
    fused_groups_ : pandas.DataFrame
        Per feature, the label of each site's fused group (sites sharing a label share the
        coefficient).
    sites_ : pandas.DataFrame
        The sites' locations and row counts.
    calibration_ : pandas.DataFrame or None
        Each site's risk calibration (``predict_proba``), when the fit has one.
    history_, metrics_, test_, tuned_, n_rounds_, converged_, objective_, settings_
        The fit's rounds, ``metrics.json``, test table, tuned levels, rounds, whether it
        converged, its objective and the settings it ran with.
    """

    command = "grauc_flower.cli"
    settings = GrAUCConfig
    inputs = DATA_OPTIONS

    def fit(self, data=None, sites=None, *, test_data=None, **options) -> GrAUCPFL:
        """Fit on ``data`` at ``sites``.

        Without ``data``, ``source=`` names built-in data (``"simulated"``, ``"crime"``;
        ``"cdc"`` with ``data`` the case file), with that source's options
        (``train_fraction``, ...).

        Parameters
        ----------
        data : pandas.DataFrame or str, optional
            The rows (a data frame or CSV path): ``site``, ``y`` in {0, 1} and the features.
        sites : pandas.DataFrame, str or dict, optional
            The sites' locations ``site``, ``lat``, ``lon``: a data frame, a CSV path or a
            mapping ``{site: (lat, lon)}``.
        test_data : pandas.DataFrame or str, optional
            Test rows with the same columns as ``data``, scored into ``test_``.
        **options
            The ``fit`` options that describe the data (:data:`DATA_OPTIONS` but ``data`` and
            ``sites``: ``source``, ``holdout``, ``train_fraction``, ...); another name is an
            error.

        Returns
        -------
        GrAUCPFL
            ``self``, fitted.
        """
        import tempfile

        unknown = [k for k in options if k not in DATA_OPTIONS or k in ("data", "sites")]
        if unknown:
            raise InputError(f"{unknown[0]}: not an argument of fit() (a parameter of "
                             f"{type(self).__name__}?)")  # fmt: skip
        source = options.pop("source", "csv" if data is not None else None)
        if source is None:
            raise InputError("data: give data and sites, or source='simulated' (or 'crime')")
        with tempfile.TemporaryDirectory(prefix="grauc-fit-") as work, self._inputs() as put:
            inputs = {"source": source, **options}
            if data is not None:
                inputs["data"], inputs["data_name"] = put(data, work, "data", "data")
            if sites is not None:
                inputs["sites"], inputs["sites_name"] = put(
                    _sites_frame(sites), work, "sites", "sites"
                )
            if test_data is not None:
                inputs["test_data"], _ = put(test_data, work, "test", "test_data")
            return self._run(inputs, work)

    @staticmethod
    def _fit_to_dir(a) -> dict:
        return fit_to_dir(a)

    def _release(self) -> None:
        from .sources import load_sites

        load_sites.cache_clear()

    def _read_fit(self) -> None:
        self.coef_ = self._frame("coefficients.csv", dtype={"site": str}).set_index("site")
        self.feature_names_in_ = np.asarray(self.coef_.columns, dtype=object)
        groups = self._frame("clusters.csv", dtype={"site": str})
        self.fused_groups_ = groups.set_index("site") if groups is not None else None
        self.sites_ = self._frame("sites.csv", dtype={"site": str})
        self.calibration_ = self._frame("calibration.csv", dtype={"site": str})

    def _predict_reader(self) -> tuple:
        from strategies.stats.predict import read_grauc_model

        from .federation import new_site_model

        return read_grauc_model, False, new_site_model

    def _predict_args(self, model_dir, path, work, new_sites=None, new_site_rule="nearest",
                      probability=False):  # fmt: skip
        import argparse

        from strategies.stats.predict import NEW_SITE_RULES

        if new_site_rule not in NEW_SITE_RULES:
            raise InputError(
                f"new_site_rule: must be one of {', '.join(NEW_SITE_RULES)}; got {new_site_rule!r}"
            )
        where = ""
        if new_sites is not None:
            where, _ = as_csv(_sites_frame(new_sites), work, "new_sites", "new_sites")
        return argparse.Namespace(model=model_dir, data=path, site="", lat=None, lon=None,
                                  sites=where, new_site_rule=new_site_rule,
                                  probability=probability)  # fmt: skip

    def predict(self, data, new_sites=None, new_site_rule: str = "nearest") -> np.ndarray:
        """Each row's risk score ``x'beta`` by its site's coefficients (a ranking within a site).

        Parameters
        ----------
        data : pandas.DataFrame or str
            The rows to score (a data frame or CSV path): ``site`` and the features.
        new_sites : pandas.DataFrame, str or dict, optional
            The locations (``site, lat, lon``) of sites outside the federation: such a site
            borrows coefficients from the fitted sites near it.
        new_site_rule : str, optional
            How a new site borrows them: ``"nearest"``, ``"graph"`` or ``"inverse-distance"``
            (docs/methods.md 3.13).

        Returns
        -------
        ndarray, shape (n,)
            Each row's score.
        """
        table = self.predict_table(data, new_sites=new_sites, new_site_rule=new_site_rule)
        return table["score"].to_numpy()

    def predict_proba(self, data, new_sites=None, new_site_rule: str = "nearest") -> np.ndarray:
        """The calibrated risks as scikit-learn gives them: columns P(y = 0), P(y = 1).

        Parameters
        ----------
        data : pandas.DataFrame or str
            The rows to score (a data frame or CSV path): ``site`` and the features.
        new_sites : pandas.DataFrame, str or dict, optional
            The locations (``site, lat, lon``) of sites outside the federation, as in
            :meth:`predict`.
        new_site_rule : str, optional
            How a new site borrows coefficients: ``"nearest"``, ``"graph"`` or
            ``"inverse-distance"``.

        Returns
        -------
        ndarray, shape (n, 2)
            Per row, ``1 - p`` and ``p``, the calibrated probability ``p`` of ``y = 1``.
        """
        table = self.predict_table(
            data, new_sites=new_sites, new_site_rule=new_site_rule, probability=True
        )
        p = table["probability"].to_numpy()
        return np.column_stack([1.0 - p, p])

    def score(self, data, level: float = 0.95) -> pd.DataFrame:
        """Each site's AUC on ``data``, DeLong's standard error and the ``level`` interval.

        Parameters
        ----------
        data : pandas.DataFrame or str
            The rows (a data frame or CSV path) with ``site``, the features and ``y``.
        level : float, optional
            The interval's confidence level, in (0, 1).

        Returns
        -------
        pandas.DataFrame
            A row per site: ``site, auc, auc_se, lower, upper, n_pos, n_neg`` (a site whose
            rows hold one class has no AUC: NaN).
        """
        from .metrics import auc_interval, delong

        if not 0 < level < 1:
            raise InputError(f"level: must be in (0, 1), got {level!r}")
        frame = data if isinstance(data, pd.DataFrame) else pd.read_csv(data, dtype={"site": str})
        if "y" not in frame.columns:
            raise InputError("data: no 'y' column (the outcome the AUC is of)")
        table = self.predict_table(frame)
        y = pd.to_numeric(frame["y"], errors="coerce").to_numpy()
        rows = []
        for site, idx in table.groupby("site", sort=False).indices.items():
            s, t = table["score"].to_numpy()[idx], y[idx]
            n_pos, n_neg = int((t == 1).sum()), int((t == 0).sum())
            a = se = lo = hi = float("nan")
            if n_pos and n_neg:
                a, se = delong(s, t)
                lo, hi = auc_interval(a, se, level)
            rows.append(dict(site=site, auc=a, auc_se=se, lower=lo, upper=hi, n_pos=n_pos,
                             n_neg=n_neg))  # fmt: skip
        return pd.DataFrame(rows)


def _sites_frame(sites):
    """Sites given as a mapping ``{site: (lat, lon)}`` as a data frame; else as given."""
    if isinstance(sites, dict) and sites and not {"site", "lat", "lon"} <= set(sites):
        return pd.DataFrame(
            [(str(k), *v) for k, v in sites.items()], columns=["site", "lat", "lon"]
        )
    return sites


def example_data(seed: int = 0, **simulation) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The main job's simulated federation as data frames (simulation 1 of the GrAUC-PFL paper,
    20 sites; docs/methods.md 1.8).

    Parameters
    ----------
    seed : int, optional
        The simulation's seed (``data_seed``).
    **simulation
        The ``data.*`` settings by their Python names (:class:`~grauc_flower.sources.DataSpec`
        fields), e.g. ``n_sites=12, n_train=300``.

    Returns
    -------
    train, test : pandas.DataFrame
        The training and test rows ``site, y, x1..``.
    sites : pandas.DataFrame
        The sites ``site, lat, lon``.
    """
    from .sources import load_sites

    spec = DataSpec(source="simulated", data_seed=seed, **simulation)
    sites, features = load_sites(spec)

    def rows(x_of, y_of) -> pd.DataFrame:
        parts = []
        for s in sites:
            part = pd.DataFrame(x_of(s), columns=list(features))
            part.insert(0, "y", y_of(s).astype(int))
            part.insert(0, "site", s.site)
            parts.append(part)
        return pd.concat(parts, ignore_index=True)

    train = rows(lambda s: s.x_train, lambda s: s.y_train)
    test = rows(lambda s: s.x_test, lambda s: s.y_test)
    where = pd.DataFrame([(s.site, s.lat, s.lon) for s in sites], columns=["site", "lat", "lon"])
    return train, test, where
