"""The fit command: ``python -m rowfed_flower fit --data DATA.csv --responses Y1,Y2 --out DIR``
(and ``study --config configs/rowfed_dims.toml --out DIR``: :mod:`rowfed_flower.study`).

``DATA.csv`` has a ``client`` column, the response columns named by ``--responses`` and
the predictors (every other column).  Writes ``DIR/coefficients.csv`` (``client, feature,
<response>...``, input scale, an ``(intercept)`` row per client when fitted),
``DIR/history.csv`` (``round, objective, primal_residual, dual_residual, rho``),
``DIR/clusters.csv`` (per predictor: the client groups), ``DIR/metrics.json``,
``DIR/report.html`` (the figures and tables of the fit on one page; ``report --model DIR``
rebuilds it), ``DIR/edges.csv`` when ``--graph`` is a file, ``DIR/test.csv`` with test rows,
and ``DIR/gic.csv`` or ``DIR/cv.csv`` when tuned.

Bad input gives one line ``error: ...`` on stderr and exit code 2; nothing is written to
``--out`` then (outputs are written to a temporary directory and moved at the end).
Defaults of the model settings come from :class:`strategies.config.RowFedConfig`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd

from strategies.config import FEDAVG_FAMILY, ROWFED_METHODS, RowFedConfig, rowfed_run_config
from strategies.errors import InputError
from strategies.experiments.scale import add_scale_option, format_scale
from strategies.fedavg import round_limit
from strategies.predict import add_predict_parser, cmd_predict, read_rowfed_model
from strategies.report import add_report_parser, cmd_report
from strategies.runtime.cli import (
    Parser,
    RoundProgress,
    add_flags,
    add_guard_arguments,
    add_run_parser,
    add_settings,
    add_test_arguments,
    add_tuning_arguments,
    atomic_output_dir,
    check_test_arguments,
    cmd_run,
    cv_options,
    end_fit,
    finish_outputs,
    from_flags,
    guards_from_args,
    guards_record,
    guards_run_config,
    line_to_stderr,
    moments_asked,
    note_default_floors,
    project_dir,
    run_main,
    settings_from_args,
    tune_run_config,
    tuning_metrics,
)
from strategies.tuning import KNOBS, parse_grid

from . import tuning as grid_search
from .federation import FUSED_METHODS
from .sources import RowFedDataSpec

DEFAULT_LAM1_GRID = ",".join(f"{v:g}" for v in grid_search.DEFAULT_LAM1_GRID)
DEFAULT_LAM2_GRID = ",".join(f"{v:g}" for v in grid_search.DEFAULT_LAM2_GRID)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m rowfed_flower",
        description="RowFed on Flower: personalized multivariate regression with row-wise "
        "fusion across clients; its comparators; studies and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    fit = sub.add_parser("fit", help="fit RowFed (or a baseline) to a CSV file")
    fit.add_argument("--data", required=True, help="CSV with a client column")
    fit.add_argument("--responses", required=True, help="comma-separated response columns")
    fit.add_argument("--out", required=True, help="output directory")
    fit.add_argument(
        "--method", choices=ROWFED_METHODS, default="rowfed", help="the method (default: rowfed)"
    )
    fit.add_argument(
        "--engine",
        choices=("inprocess", "flower"),
        default="inprocess",
        help="inprocess: Flower's server in this process; flower: flwr run (default: inprocess)",
    )
    add_test_arguments(fit)
    add_guard_arguments(fit)
    add_flags(fit, RowFedDataSpec)  # --client-column, --data-seed
    add_tuning_arguments(fit, ("gic", "gic-nq", "cv"))
    fit.add_argument(
        "--lam1-grid",
        metavar="LIST",
        help=f"gic/cv: lam1 values (default: {DEFAULT_LAM1_GRID}; auto, with --lam2-grid "
        "auto: 6 from lam1_max down over a factor 100)",
    )
    fit.add_argument(
        "--lam2-grid",
        metavar="LIST",
        help=f"gic/cv: lam2 values (default: {DEFAULT_LAM2_GRID}; auto: 5 below lam2_max "
        "over a factor 100)",
    )
    fit.add_argument(
        "--size-power-grid",
        metavar="LIST",
        help="cv: size-power values of the fused methods, each in [0, 1] (default: 0,1 when "
        "the clients differ in size, else the --size-power value)",
    )
    add_settings(fit, RowFedConfig)
    fit.add_argument("--quiet", action="store_true", help="no progress lines")
    fit.add_argument(
        "--verbose",
        action="store_true",
        help="Flower's own log (a line per message and round; all of it with --engine flower)",
    )
    default = "rowfed,nonfed,fedavg,perfl-lsma"
    add_run_parser(sub, ROWFED_METHODS, default, "rowfed-data.num-clients", 10)
    from .study import add_parser as _study_parser

    _study_parser(sub)
    bench = sub.add_parser("bench", help="rounds to a 1e-4/1e-6 gap: defaults vs the paper's")
    bench.add_argument("--out", default="", help="directory for bench.csv")
    bench.add_argument("--quick", action="store_true", help="lasso only, lower round limit")
    bench.add_argument(
        "--family",
        action="store_true",
        help="instead: rounds over the problem family (median, 90th percentile, worst)",
    )
    add_scale_option(bench)
    add_predict_parser(sub, "predicted responses")
    add_report_parser(sub)
    return parser


def _config(args) -> RowFedConfig:
    return settings_from_args(RowFedConfig, args)


def _run_flower(
    cfg: RowFedConfig, args, data, tmp: str, tune: dict | None = None, guards=None
) -> None:  # fmt: skip
    """``flwr run`` the app on Flower's simulation engine (one SuperNode per client) with
    this file as the data (``rowfed-data.source = csv``) and the clients' floors
    ``guards``; outputs land in ``tmp``."""
    from strategies.runtime.simulation import flwr_run

    spec = from_flags(
        RowFedDataSpec,
        args,
        source="csv",
        path=os.path.abspath(args.data),
        responses=",".join(data.responses),
        num_clients=len(data.clients),
        test_path=os.path.abspath(args.test_data) if args.test_data else "",
        holdout=args.holdout,
    )
    rc = {
        **rowfed_run_config(cfg),
        "task": "rowfed",
        "method": args.method,
        "out-dir": tmp,
        **spec.to_run_config(),
        **(tune or {}),
        **(guards_run_config(guards) if guards is not None else {}),
    }
    from strategies.runtime.launch import stream_echo

    flwr_run(project_dir(), rc, len(data.clients), echo=stream_echo(False, args.verbose))
    os.remove(os.path.join(tmp, "summary.csv"))


def fit(args) -> int:
    cfg = _config(args)
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
    check_test_arguments(args)
    lam1_grid = grid_search.grid_values(args.lam1_grid, DEFAULT_LAM1_GRID, "lam1-grid")
    lam2_grid = grid_search.grid_values(args.lam2_grid, DEFAULT_LAM2_GRID, "lam2-grid")
    auto = grid_search.check_auto(lam1_grid, lam2_grid)

    from . import federation as fed
    from . import sources as rsources
    from .figures import fit_report
    from .graph import read_graph

    guards = guards_from_args(args)
    data = rsources.read_fit_csv(args.data, args.responses, args.client_column)
    data = rsources.with_test_set(
        data, args.test_data, args.holdout, args.data_seed, args.client_column
    )
    counts = [(c.site, c.n, None, c.p) for c in data.clients]
    refused = note_default_floors(counts, moments_asked(cfg, "X'X"))
    edges, weights = read_graph(cfg.graph, data.sites)  # validates it against the client ids
    if cfg.graph != "all-pairs":
        cfg = cfg.replace(graph=os.path.abspath(cfg.graph))

    t0 = time.perf_counter()
    extra = {"engine": args.engine, "data": os.path.abspath(args.data),
             "guards": guards_record(guards, refused)}  # fmt: skip
    with atomic_output_dir(args.out) as tmp:
        # a fused method (or NonFed) is tuned inside the federation: one batched run on
        # either engine; the FedAvg family by the in-process cross-validation, then refitted
        federated = args.tune is not None and args.method in grid_search.FEDERATED_TUNABLE
        if auto and not federated:
            raise InputError(
                f"lam1-grid: auto is for the federated tuning of "
                f"{', '.join(grid_search.FEDERATED_TUNABLE)}, not {args.method}"
            )
        fed_grids = (lam1_grid, lam2_grid)
        opts = cv_options(args, args.data_seed)
        if federated and args.knob_grid:
            raise InputError(f"knob-grid: {args.method} has no setting to tune besides its levels")
        if not federated and (opts.criterion != "folds" or opts.repeats > 1):
            key = "cv-criterion" if opts.criterion != "folds" else "cv-repeats"
            raise InputError(f"{key}: for the federated tuning ({args.method} is not tuned so)")
        if args.tune == "cv" and not federated:
            cfg, table, summary = grid_search.tune_cv(
                cfg,
                data,
                args.method,
                lam1_grid,
                lam2_grid,
                opts,
                args.knob_grid or None,
                args.size_power_grid,
            )
            table.to_csv(os.path.join(tmp, "cv.csv"), index=False)
            params = grid_search.params_of(args.method)
            extra.update(tuning_metrics(summary, params, "val_mse", False, opts))
            chosen = ", ".join(f"{k} = {v:g}" for k, v in extra["tuned"].items())
            print(
                f"cv: chose {chosen} (mean validation MSE {extra['cv']['mean']:.6g} over "
                f"{opts.folds} folds); refitting on all training data",
                file=sys.stderr,
            )
        if args.engine == "flower":
            tune = None
            if federated:
                powers = args.size_power_grid
                powers = parse_grid(powers, "size-power-grid") if powers else ()
                grids = {"lam1-grid": fed_grids[0], "lam2-grid": fed_grids[1],
                         "size-power-grid": powers}  # fmt: skip
                tune = tune_run_config(args.tune, opts, grids)
            _run_flower(cfg, args, data, tmp, tune, guards)
        else:
            tune = None
            if federated:
                tune = (args.tune, (opts, *fed_grids, args.size_power_grid))
            progress = RoundProgress(args.method, round_limit(args.method, cfg), args.quiet)
            if federated:
                progress = None if args.quiet else line_to_stderr
            if tune is not None:
                from .tuning import run_tuned_inprocess

                res = run_tuned_inprocess(cfg, data, args.method, tune, progress, guards=guards)
            else:
                res = fed.run_methods_inprocess(cfg, data, [args.method], progress, guards=guards)[
                    args.method
                ]
            fed.write_result(tmp, res, data, cfg)
        n_test = sum(c.x_test.shape[0] for c in data.clients)
        split = {
            "test": "none" if not n_test else ("file" if args.test_data else "holdout"),
            "holdout": args.holdout or None,
            "n_train": sum(c.n for c in data.clients),
            "n_test": n_test,
        }

        def own_files(where: str) -> None:
            if edges is not None:
                pd.DataFrame(
                    {
                        "client_u": [data.sites[u] for u in edges[:, 0]],
                        "client_v": [data.sites[v] for v in edges[:, 1]],
                        "weight": weights if weights is not None else 1.0,
                    }
                ).to_csv(os.path.join(where, "edges.csv"), index=False)

        metrics = finish_outputs(
            tmp,
            {**extra, "seconds": round(time.perf_counter() - t0, 3)},
            split,
            lambda m: fed.write_test_table(tmp, m, data.responses),
            own_files,
            fit_report,
        )

    tuned = ""
    criterion = metrics.get("tuning", {}).get("criterion")
    if criterion in grid_search.GIC_BY:
        value = metrics["tuning"]["selected"][criterion.replace("-", "_")]
        tuned = f"; selected by {criterion.upper()} ({value:.6g})"
    elif "tuned" in metrics:
        tuned = f"; selected by {metrics['cv']['folds']}-fold CV"
    if "test" in metrics and metrics["test"]["mse"] is not None:
        tuned += f"; test MSE {metrics['test']['mse']:.6g}"
    method, out = metrics["method"], os.path.abspath(args.out)
    end_fit(method, metrics, grid_search.used_levels(method), tuned.lstrip("; "), out)
    return 0


def dispatch(args) -> int:
    if args.command == "study":
        from .study import cmd_study, load

        study, st = load(args.config)
        if st.coverage is not None:
            from .coverage import run as run_coverage

            return run_coverage(args, study, st)
        return cmd_study(args, study, st)
    if args.command == "run":
        return cmd_run(args, "rowfed", "MSE-Est")
    if args.command == "predict":
        return cmd_predict(args, read_rowfed_model, ignore_outputs=True)
    if args.command == "report":
        from .figures import fit_report

        return cmd_report(args, fit_report)
    if args.command == "bench":
        from . import bench

        if args.scale:
            print(format_scale(bench.scale_run(args.out, quick=args.quick)))
            return 0
        run = bench.family_run if args.family else bench.run
        print(bench.format_table(run(args.out, quick=args.quick)))
        return 0
    return fit(args)


def main(argv=None) -> int:
    return run_main(build_parser(), dispatch, argv)


__all__ = ["build_parser", "main"]
