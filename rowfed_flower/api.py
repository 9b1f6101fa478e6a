"""RowFed from Python: the :class:`RowFed` estimator and the fit's flow
(:func:`fit_to_dir`) that it and ``python -m rowfed_flower fit`` both run.

>>> from rowfed_flower import RowFed
>>> model = RowFed(lam1=0.2, lam2=0.1).fit(data, responses=["y1", "y2"])
>>> model.coef_                     # (client, feature) x responses, input scale

docs/api.md has a worked session; every parameter is a ``fit`` option (docs/usage.md).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from strategies.api import FederatedModel
from strategies.config import FEDAVG_FAMILY, RowFedConfig, rowfed_run_config
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
from strategies.server.fedavg import round_limit
from strategies.stats.predict import INTERCEPT
from strategies.stats.tuning import KNOBS, parse_grid

from . import tuning as grid_search
from .federated_tuning import FEDERATED_TUNABLE
from .federation import FUSED_METHODS
from .sources import DataSpec

#: The command line's default grids, as it reads them.
DEFAULT_LAM1_GRID = ",".join(f"{v:g}" for v in grid_search.DEFAULT_LAM1_GRID)
DEFAULT_LAM2_GRID = ",".join(f"{v:g}" for v in grid_search.DEFAULT_LAM2_GRID)


def _config(args) -> RowFedConfig:
    return settings_from_args(RowFedConfig, args)


class RowFedFit(FitFlow):
    """RowFed's part of the ``fit`` flow (:class:`strategies.runtime.fitflow.FitFlow`): its
    CSV data, its grids (the federated GIC or cross-validation of a fused method or NonFed),
    its run config and its files."""

    SCORE = ("val_mse", False, "MSE", ".6g")
    SIMULATION_TABLE = "summary.csv"

    def prepare(self) -> None:
        args = self.a
        self.cfg = _config(args)
        _check_tuning(args)
        check_test_arguments(args)
        lam1_grid = grid_search.grid_values(args.lam1_grid, DEFAULT_LAM1_GRID, "lam1-grid")
        lam2_grid = grid_search.grid_values(args.lam2_grid, DEFAULT_LAM2_GRID, "lam2-grid")
        auto = grid_search.check_auto(lam1_grid, lam2_grid)
        self.grids = (lam1_grid, lam2_grid)
        if auto and not self.federated():
            raise InputError(
                f"lam1-grid: auto is for the federated tuning of "
                f"{', '.join(FEDERATED_TUNABLE)}, not {args.method}"
            )
        if self.federated() and args.knob_grid:
            raise InputError(f"knob-grid: {args.method} has no setting to tune besides its levels")

        from . import sources as rsources
        from .graph import build_graph

        self.guards = guards_from_args(args)
        data = rsources.read_fit_csv(args.data, args.responses, args.client_column)
        data = rsources.with_test_set(
            data, args.test_data, args.holdout, args.data_seed, args.client_column
        )
        counts = [(c.site, c.n, None, c.p) for c in data.clients]
        self.refused = note_default_floors(counts, moments_asked(self.cfg, "X'X"))
        # validates the graph against the client ids
        self.edges, self.weights = build_graph(self.cfg.graph, data.sites)
        if self.cfg.graph != "all-pairs":
            self.cfg = self.cfg.replace(graph=os.path.abspath(self.cfg.graph))
        self.data = data

    def federated(self) -> bool:
        """A fused method (or NonFed) is tuned inside the federation: one batched run on
        either engine; the FedAvg family by the in-process cross-validation, then refitted."""
        return self.a.tune is not None and self.a.method in FEDERATED_TUNABLE

    def cross_validate(self, opts) -> tuple:
        args = self.a
        cfg, table, summary = grid_search.tune(
            self.cfg, self.data, args.method, *self.grids, opts, args.knob_grid or None,
            args.size_power_grid,
        )  # fmt: skip
        return cfg, table, summary, grid_search.params_of(args.method)

    def round_limit(self) -> int:
        return round_limit(self.a.method, self.cfg)

    def n_sites(self) -> int:
        return len(self.data.clients)

    def run_inprocess(self, tmp: str, federated: bool, opts, progress) -> None:
        from . import federation as fed

        args = self.a
        if federated:
            from .federated_tuning import run_tuned_inprocess

            tune = (args.tune, (opts, *self.grids, args.size_power_grid))
            res = run_tuned_inprocess(
                self.cfg, self.data, args.method, tune, progress, guards=self.guards
            )
        else:
            res = fed.run_methods_inprocess(
                self.cfg, self.data, [args.method], progress, guards=self.guards
            )[args.method]
        fed.write_result(tmp, res, self.data, self.cfg)

    def run_config(self, tmp: str, federated: bool, opts) -> dict:
        """The run config of ``flwr run`` on the fit's data: the CSV file itself
        (``rowfed-data.source = csv``), the clients' floors, the federated tuning's keys."""
        args, data = self.a, self.data
        spec = from_flags(
            DataSpec,
            args,
            source="csv",
            path=os.path.abspath(args.data),
            responses=",".join(data.responses),
            num_clients=len(data.clients),
            test_path=os.path.abspath(args.test_data) if args.test_data else "",
            holdout=args.holdout,
        )
        rc = {
            **rowfed_run_config(self.cfg),
            "task": "rowfed",
            "method": args.method,
            "out-dir": tmp,
            **spec.to_run_config(),
            **guards_run_config(self.guards),
        }
        if federated:
            powers = args.size_power_grid
            powers = parse_grid(powers, "size-power-grid") if powers else ()
            grids = {"lam1-grid": self.grids[0], "lam2-grid": self.grids[1],
                     "size-power-grid": powers}  # fmt: skip
            rc.update(tune_run_config(args.tune, opts, grids))
        return rc

    def updates(self, seconds: float) -> dict:
        args = self.a
        named = getattr(args, "data_name", "") or as_path(args.data)
        return {"engine": args.engine, "data": named,
                "guards": guards_record(self.guards, self.refused), **self.extra,
                "seconds": seconds}  # fmt: skip

    def split(self) -> dict:
        args, clients = self.a, self.data.clients
        n_test = sum(c.x_test.shape[0] for c in clients)
        return {
            "test": "none" if not n_test else ("file" if args.test_data else "holdout"),
            "holdout": args.holdout or None,
            "n_train": sum(c.n for c in clients),
            "n_test": n_test,
        }

    def write_test(self, tmp: str, metrics: dict) -> dict:
        from . import federation as fed

        return fed.write_test_table(tmp, metrics, self.data.responses)

    def own_files(self, where: str) -> None:
        """``edges.csv``: the graph the fusion ran on (none for all pairs)."""
        if self.edges is None:
            return
        sites = self.data.sites
        pd.DataFrame(
            {
                "client_u": [sites[u] for u in self.edges[:, 0]],
                "client_v": [sites[v] for v in self.edges[:, 1]],
                "weight": self.weights if self.weights is not None else 1.0,
            }
        ).to_csv(os.path.join(where, "edges.csv"), index=False)

    def report(self, where: str) -> str:
        from .fitreport import fit_report

        return fit_report(where)


def _check_tuning(args) -> None:
    """The tuning options against the method and each other."""
    if args.tune is None and (args.lam1_grid is not None or args.lam2_grid is not None):
        key = "lam1-grid" if args.lam1_grid is not None else "lam2-grid"
        raise InputError(f"{key}: grids need --tune gic or --tune cv")
    if args.knob_grid and args.tune != "cv":
        raise InputError("knob-grid: grids need --tune cv")
    if args.size_power_grid is not None and args.tune != "cv":
        raise InputError("size-power-grid: grids need --tune cv")
    if args.size_power_grid is not None and args.method not in FUSED_METHODS:
        raise InputError(
            f"size-power-grid: {args.method} does not weight its clients (a fused method does)"
        )
    if args.tune == "cv" and args.size_power is not None and args.method in FUSED_METHODS:
        raise InputError(
            "size-power: chosen by --tune cv; give --size-power-grid to set its values"
        )
    fused = args.method not in FEDAVG_FAMILY  # the comparators have no lam1
    if args.tune is not None and (args.lam1 is not None and fused or args.lam2 is not None):
        key = "lam1" if args.lam1 is not None and fused else "lam2"
        raise InputError(
            f"{key}: chosen by --tune {args.tune}; give --{key}-grid to set its values"
        )
    if args.tune in grid_search.GIC_BY and args.method in FEDAVG_FAMILY:
        raise InputError(
            f"tune: {args.tune} is available for rowfed, perfl-lsma and nonfed; use --tune cv"
        )
    knob = KNOBS[args.method].name if args.method in KNOBS else None
    if args.tune == "cv" and knob and getattr(args, knob) is not None:
        flag = knob.replace("_", "-")
        raise InputError(f"{flag}: chosen by --tune cv; give --knob-grid to set its values")


def fit_to_dir(args) -> dict:
    """The fit of ``fit``'s options ``args`` (an :mod:`argparse` namespace of the ``fit``
    subcommand, or :class:`RowFed`'s) into the directory ``args.out``: every file the
    command line writes, all or nothing (:class:`RowFedFit`).  Returns ``metrics.json``'s
    content."""
    return RowFedFit(args).run()


#: The ``fit`` options that describe the data: arguments of :meth:`RowFed.fit`.
DATA_OPTIONS = ("data", "responses", "test_data", "holdout", "client_column")


class RowFed(FederatedModel):
    """RowFed (or a comparator, ``method=``) fitted across clients, from Python.

    Parameters
    ----------
    **params
        Any option of ``python -m rowfed_flower fit`` by its Python name (``lam1``,
        ``lam2``, ``penalty``, ``method``, ``engine``, ``tune``, ``lam1_grid``,
        ``min_rows``, ``data_seed``, ...; docs/usage.md), with the same defaults and
        checks; grids may be lists.  ``RowFed.param_names()`` lists them.

    Attributes
    ----------
    coef_ : pandas.DataFrame
        Each client's coefficients: rows (client, feature), columns the responses, on the
        input scale.
    intercept_ : pandas.DataFrame or None
        Each client's intercepts (rows: clients; columns: responses), when fitted.
    fused_groups_ : pandas.DataFrame
        Per feature, the number of client groups and each client's group label.
    history_, metrics_, test_, tuned_, n_rounds_, converged_, objective_, settings_
        The fit's rounds, ``metrics.json``, test table, tuned levels, rounds, whether it
        converged, its objective and the settings it ran with.
    """

    command = "rowfed_flower.cli"
    settings = RowFedConfig
    inputs = DATA_OPTIONS
    site_column = "client"

    def fit(self, data, responses, *, test_data=None, **options) -> RowFed:
        """Fit on ``data``; the test rows (``test_data``, or ``holdout=``) are scored into
        ``test_``.

        Parameters
        ----------
        data : pandas.DataFrame or str
            The training rows, a data frame or CSV path: a ``client`` column, the response
            columns and the predictors (every other column).
        responses : list of str or str
            The response columns, a list or comma-separated names.
        test_data : pandas.DataFrame or str, optional
            Test rows with the same columns.
        **options
            ``holdout`` (a share of each client's rows held out for testing) and
            ``client_column`` (another name of the client column); any other name is an
            :class:`~strategies.errors.InputError`.

        Returns
        -------
        RowFed
            ``self``, fitted.
        """
        import tempfile

        unknown = [k for k in options if k not in ("holdout", "client_column")]
        if unknown:
            raise InputError(f"{unknown[0]}: not an argument of fit() (a parameter of "
                             f"{type(self).__name__}?)")  # fmt: skip
        self._client_column = str(options.get("client_column") or "client")
        with tempfile.TemporaryDirectory(prefix="rowfed-fit-") as work, self._inputs() as put:
            inputs = {"responses": responses, **options}
            inputs["data"], inputs["data_name"] = put(data, work, "data", "data")
            if test_data is not None:
                inputs["test_data"], _ = put(test_data, work, "test", "test_data")
            return self._run(inputs, work)

    @staticmethod
    def _fit_to_dir(a) -> dict:
        return fit_to_dir(a)

    def _read_fit(self) -> None:
        frame = self._frame("coefficients.csv", dtype={"client": str, "feature": str})
        is_b = (frame["feature"] == INTERCEPT).to_numpy()
        self.coef_ = frame.loc[~is_b].set_index(["client", "feature"])
        self.intercept_ = (
            frame.loc[is_b].drop(columns="feature").set_index("client") if is_b.any() else None
        )
        self.feature_names_in_ = np.asarray(
            list(dict.fromkeys(self.coef_.index.get_level_values("feature"))), dtype=object
        )
        groups = self._frame("clusters.csv", dtype={"feature": str})
        self.fused_groups_ = groups.set_index("feature") if groups is not None else None

    def predict_table(self, data, **options) -> pd.DataFrame:
        """The table ``predict`` writes for ``data`` (its client column named as at
        :meth:`fit`, ``client_column``): ``row, client`` and the responses."""
        named = getattr(self, "_client_column", "client")
        if isinstance(data, pd.DataFrame) and named != "client" and named in data.columns:
            data = data.rename(columns={named: "client"})
        return super().predict_table(data, **options)

    def _predict_reader(self) -> tuple:
        from strategies.stats.predict import read_rowfed_model

        return read_rowfed_model, True, None

    def predict(self, data) -> np.ndarray:
        """Each row's predicted responses ``b_m + Theta_m' x`` by its client's
        coefficients (rows x responses; a ``client`` column picks them)."""
        table = self.predict_table(data)
        return table.iloc[:, 2:].to_numpy()

    def score(self, data) -> pd.DataFrame:
        """Each client's mean squared prediction error on ``data`` (with the responses),
        over its rows and responses: ``client, n, mse``."""
        named = getattr(self, "_client_column", "client")
        frame = data if isinstance(data, pd.DataFrame) else pd.read_csv(data, dtype={named: str})
        table = self.predict_table(frame)
        outputs = list(table.columns[2:])
        missing = [r for r in outputs if r not in frame.columns]
        if missing:
            raise InputError(f"data: no {missing[0]!r} column (a response the fit predicts)")
        err = frame[outputs].to_numpy(dtype=float) - table[outputs].to_numpy()
        sq = pd.DataFrame({"client": table["client"], "se": (err**2).mean(axis=1)})
        out = sq.groupby("client", sort=False)["se"].agg(["size", "mean"]).reset_index()
        return out.rename(columns={"size": "n", "mean": "mse"})


def example_data(seed: int = 1, **simulation) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The RowFed paper's simulated federation as data frames: the rows ``client, y1.., x1..``
    (10 clients, p = q = 20 by default; docs/methods.md 2.8).

    Parameters
    ----------
    seed : int, optional
        The simulation's seed.
    **simulation
        Further settings of the simulation: ``num_clients``, ``n_train``, ``n_test``,
        ``num_features``, ``num_responses`` (:class:`rowfed_flower.sources.DataSpec`).

    Returns
    -------
    train, test : pandas.DataFrame
        The training and the test rows.
    responses : list of str
        The response columns.
    """
    from .sources import simulated_data

    data = simulated_data(DataSpec(seed=seed, **simulation))

    def rows(test: bool) -> pd.DataFrame:
        parts = []
        for c in data.clients:
            x, y = (c.x_test, c.y_test) if test else (c.x, c.y)
            part = pd.DataFrame(np.hstack([y, x]), columns=[*data.responses, *data.features])
            part.insert(0, "client", c.site)
            parts.append(part)
        return pd.concat(parts, ignore_index=True)

    return rows(False), rows(True), list(data.responses)
