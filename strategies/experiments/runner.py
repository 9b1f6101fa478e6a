"""A whole study run: the ``study`` command's options, the tasks not yet done, their
execution, and the results, summaries and figures written at the end."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pandas as pd

from ..errors import InputError
from ..report import study_report
from ..runtime.cli import check_output_dir
from .design import Study, cell_label, select_cells, task_seed
from .executors import check_reachable, run_local, run_ray
from .progress import StudyProgress
from .store import RESULTS, PartStore, append_rows, atomic_csv, check_fingerprint
from .summary import normalize_types, order_results, summarize, summary_table


def add_study_parser(sub) -> None:
    """The ``study`` subcommand (both methods share it)."""
    add_study_options(sub.add_parser("study", help="a simulation study driven by a TOML config"))


def run_study_args(
    a, study: Study, task_path: str, metrics, make_figures, tables: Callable | None = None
) -> int:
    """:func:`run_study` with the parsed options of :func:`add_study_options`.

    Parameters
    ----------
    a : argparse.Namespace
        The parsed options (``--no-figures``: ``make_figures`` is not called).
    study : Study
        The study config.
    task_path : str
        The method's task function, ``"module:function"``.
    metrics : sequence of str
        The result columns summarized as mean (SD) over replications.
    make_figures : callable
        ``make_figures(out, study, results, store, cells)``: the paths of the figures it
        writes.
    tables : callable, optional
        Replaces the mean (SD) tables (:func:`run_study`).

    Returns
    -------
    int
        The exit code (:func:`run_study`).
    """
    return run_study(
        study,
        task_path,
        a.out,
        reps=a.reps,
        only=a.only,
        workers=a.workers,
        ray_address=a.ray_address,
        metrics=metrics,
        figures=None if a.no_figures else make_figures,
        quiet=a.quiet,
        tables=tables,
    )


def add_study_options(p) -> None:
    """The options of both methods' ``study`` subcommands."""
    p.add_argument("--config", required=True, help="study config (TOML), e.g. configs/sim1.toml")
    p.add_argument("--out", required=True, help="output directory (reused: finished tasks skip)")
    p.add_argument("--reps", type=int, default=None, help="replications (default: the config's)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only the cells with this design value (repeatable; values of one key: any)",
    )
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--ray-address",
        default="",
        metavar="ADDR",
        help="run the tasks on this Ray cluster ('auto', 'ray://host:10001'; 'local' starts one)",
    )
    p.add_argument("--no-figures", action="store_true", help="write results and summaries only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run_study(
    study: Study,
    task_path: str,
    out: str,
    reps: int | None = None,
    only: Sequence[str] = (),
    workers: int = 1,
    ray_address: str = "",
    metrics: Sequence[str] = (),
    figures: Callable | None = None,
    quiet: bool = False,
    tables: Callable | None = None,
) -> int:
    """Run the tasks of ``study`` not yet in ``out``; write results, summary and figures.

    Bad input raises :class:`InputError`.

    Parameters
    ----------
    study : Study
        The study config.
    task_path : str
        The method's task function, ``"module:function"``
        (:func:`strategies.experiments.executors.execute_task`).
    out : str
        The output directory; the tasks already finished there are skipped.
    reps : int, optional
        Replications per cell (``None``: the config's).
    only : sequence of str, optional
        ``KEY=VALUE`` selections of cells (:func:`select_cells`).
    workers : int, optional
        Worker processes for the tasks.
    ray_address : str, optional
        A Ray cluster to run the tasks on instead (empty: none).
    metrics : sequence of str, optional
        The result columns summarized as mean (SD) over replications (:func:`summarize`,
        :func:`summary_table`).
    figures : callable, optional
        ``figures(out, study, results, store, cells)``: the paths of the figures it writes;
        ``None``: no figures.
    quiet : bool, optional
        No progress lines.
    tables : callable, optional
        ``tables(results, keys) -> (summary, table, caption)`` replaces the mean (SD) over
        replications of ``metrics``, e.g. a coverage study's.

    Returns
    -------
    int
        The exit code: 0, or 1 when a task, the figures or the report failed (the finished
        tasks are kept; rerun the same command to retry).
    """
    if reps is not None and reps < 1:
        raise InputError(f"reps: must be >= 1, got {reps}")
    if workers < 1:
        raise InputError(f"workers: must be >= 1, got {workers}")
    cells = select_cells(study.cells, study.keys, study.types, only)
    n_reps = study.replications if reps is None else reps
    out = check_output_dir(out)
    if ray_address:  # before anything is written
        check_reachable(ray_address)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise InputError(f"out: cannot create {out}: {exc.strerror}") from None
    check_fingerprint(out, study)
    store = PartStore(out)
    tasks = [(c, r) for c in cells for r in range(n_reps)]
    done = {(cell_label(c), r) for c, r in tasks if store.done(c, r)}
    todo = [(c, r, task_seed(study.seed, c, r)) for c, r in tasks if (cell_label(c), r) not in done]
    results_path = os.path.join(out, "results.csv")
    _rebuild(store, study, results_path)

    progress = StudyProgress(tasks, done, quiet)
    where = f"Ray at {ray_address}" if ray_address else f"{workers} worker(s)"
    progress.say(
        f"study: {len(tasks)} tasks ({len(cells)} cells x {n_reps} replications); "
        f"{len(done)} already done in {out}, {len(todo)} to run on {where}"
    )
    errors: list[str] = []

    def on_result(cell, rep, seed, outcome) -> None:
        status, payload, seconds = outcome
        if status != "ok":
            errors.append(f"{cell_label(cell)} rep {rep} (seed {seed}): {payload}")
            with open(os.path.join(out, "errors.log"), "a") as fh:
                fh.write(errors[-1] + "\n")
            progress.say(f"task {cell_label(cell)} rep {rep} failed: {payload.splitlines()[0]}")
            return
        frames = dict(payload)
        frames[RESULTS] = frames[RESULTS].assign(seconds=round(seconds, 3))
        store.write(cell, rep, frames)
        append_rows(results_path, frames[RESULTS])
        progress.task_done(cell, rep)

    if todo:
        progress.show()
        try:
            if ray_address:
                run_ray(task_path, study.settings, todo, ray_address, on_result)
            else:
                run_local(task_path, study.settings, todo, workers, on_result)
        finally:
            progress.close()
    results = _rebuild(store, study, results_path)
    code = _summarize(out, study, results, store, cells, metrics, figures, tables, progress)
    if errors:
        progress.say(
            f"error: {len(errors)} task(s) failed (see {os.path.join(out, 'errors.log')}); "
            "rerun the same command to retry them"
        )
        code = 1
    n_done = len(tasks) - len(todo) + (len(todo) - len(errors))
    progress.say(f"study: {n_done}/{len(tasks)} tasks done; wrote {out}")
    return code


def _summarize(out, study, results, store, cells, metrics, figures, tables, progress) -> int:
    """The study's summary tables, figures and report from ``results`` (:func:`run_study`'s
    arguments); returns 1 when the figures or the report failed, else 0."""
    if tables is None:
        summary = summarize(results, study.keys, metrics)
        table = summary_table(summary, study.keys, metrics)
        caption = None
    else:
        summary, table, caption = tables(results, study.keys)
    atomic_csv(summary, os.path.join(out, "summary.csv"))
    atomic_csv(table, os.path.join(out, "summary_table.csv"))
    code = 0
    made: list[str] = []
    if figures is not None and not results.empty:
        try:
            made = figures(out, study, results, store, cells)
            progress.say(f"figures: {', '.join(os.path.basename(p) for p in made)}")
        except Exception as exc:
            progress.say(f"error: figures: {type(exc).__name__}: {exc}")
            code = 1
    if not results.empty:
        try:
            progress.say(f"report: {study_report(out, study, results, table, made, caption)}")
        except Exception as exc:
            progress.say(f"error: report: {type(exc).__name__}: {exc}")
            code = 1
    return code


def _rebuild(store: PartStore, study: Study, path: str) -> pd.DataFrame:
    results = store.all_results()
    if not results.empty:
        results = normalize_types(order_results(results, study.cells, study.keys), study)
        atomic_csv(results, path)
    elif os.path.isfile(path):
        os.remove(path)
    return results
