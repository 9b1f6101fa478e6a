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

from strategies.config import ROWFED_METHODS, RowFedConfig
from strategies.experiments.scale import add_scale_option, format_scale
from strategies.report import add_report_parser, cmd_report
from strategies.runtime.cli import (
    Parser,
    add_flags,
    add_guard_arguments,
    add_run_parser,
    add_settings,
    add_test_arguments,
    cmd_run,
    end_fit,
    run_main,
)
from strategies.runtime.tuning_options import add_tuning_arguments
from strategies.stats.predict import add_predict_parser, cmd_predict, read_rowfed_model

from . import tuning as grid_search
from .api import DEFAULT_LAM1_GRID, DEFAULT_LAM2_GRID
from .sources import DataSpec


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
    add_flags(fit, DataSpec)  # --client-column, --data-seed
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


def cmd_fit(args) -> int:
    """``fit``: the flow (:func:`rowfed_flower.api.fit_to_dir`, which the API runs too),
    then its one line and warnings."""
    from .api import fit_to_dir

    metrics = fit_to_dir(args)
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
        from .fitreport import fit_report

        return cmd_report(args, fit_report)
    if args.command == "bench":
        from . import bench

        if args.scale:
            from . import scale

            print(format_scale(scale.scale_run(args.out, quick=args.quick)))
            return 0
        from . import family

        run = family.family_run if args.family else bench.run
        print(bench.format_table(run(args.out, quick=args.quick)))
        return 0
    return cmd_fit(args)


def main(argv=None) -> int:
    return run_main(build_parser(), dispatch, argv)


__all__ = ["build_parser", "main"]
