"""One fit into a directory, all or nothing: the flow that both methods' ``fit`` command and
Python API run (each method's ``api.fit_to_dir``).

:meth:`FitFlow.run` is the flow, written once: read and check the options and the data
(:meth:`~FitFlow.prepare`); inside a directory that appears only whole
(:func:`~strategies.runtime.cli.atomic_output_dir`), the in-process cross-validation of a
method tuned outside the federation, then the fit on the chosen engine (in process, or
``flwr run``), then ``metrics.json`` completed, the test table, the method's own files and
``report.html`` (:func:`~strategies.runtime.cli.finish_outputs`).  A method's subclass
supplies only what differs: its data, its run config, its tuning and its files.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import InputError
from .cli import RoundProgress, atomic_output_dir, finish_outputs, line_to_stderr, project_dir
from .launch import stream_echo
from .tuning_options import cv_options, tuning_metrics


class FitFlow:
    """The ``fit`` flow of one method; subclasses fill in the hooks.

    Parameters
    ----------
    a : argparse.Namespace
        The ``fit`` subcommand's options (or the Python API's, read by the same parser).

    Attributes set by :meth:`prepare`: ``cfg`` (the method's settings; a comparator's
    in-process tuning replaces it by its choice) and whatever the hooks read.
    """

    #: The validation score's column in ``cv.csv``, whether higher is better, and how the
    #: choice's line names and formats it.
    SCORE = ("val_auc", True, "AUC", ".4f")
    #: The table a ``flwr run`` simulation writes that a ``fit`` does not keep.
    SIMULATION_TABLE = "auc.csv"

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.cfg = None
        self.extra: dict = {}  # metrics.json entries of the in-process tuning

    # -- the flow ----------------------------------------------------------------------------
    def run(self) -> dict:
        """Fit into ``a.out``; returns ``metrics.json``'s content."""
        a = self.a
        self.prepare()
        federated = self.federated()
        opts = self.cv_options()
        if opts is not None and not federated and (opts.criterion != "folds" or opts.repeats > 1):
            key = "cv-criterion" if opts.criterion != "folds" else "cv-repeats"
            raise InputError(f"{key}: for the federated tuning ({a.method} is not tuned so)")
        t0 = time.perf_counter()
        with atomic_output_dir(a.out) as tmp:
            if a.tune == "cv" and not federated:
                self._tune_in_process(tmp, opts)
            if a.engine == "inprocess":
                progress = RoundProgress(a.method, self.round_limit(), a.quiet)
                if federated:
                    progress = None if a.quiet else line_to_stderr
                self.run_inprocess(tmp, federated, opts, progress)
            else:
                from .simulation import flwr_run

                rc = self.run_config(tmp, federated, opts)
                flwr_run(project_dir(), rc, self.n_sites(), echo=stream_echo(a.quiet, a.verbose))
                os.remove(os.path.join(tmp, self.SIMULATION_TABLE))
            self.after_run(tmp, federated, opts)
            seconds = round(time.perf_counter() - t0, 3)
            return finish_outputs(
                tmp,
                self.updates(seconds),
                self.split(),
                lambda metrics: self.write_test(tmp, metrics),
                self.own_files,
                self.report,
            )

    def _tune_in_process(self, tmp: str, opts) -> None:
        """A method tuned outside the federation: its cross-validation in process, the
        choice as :attr:`cfg`, ``cv.csv`` and the tuning's ``metrics.json`` entries."""
        cfg, table, summary, params = self.cross_validate(opts)
        self.cfg = cfg
        table.to_csv(os.path.join(tmp, "cv.csv"), index=False)
        column, higher, name, fmt = self.SCORE
        self.extra = tuning_metrics(summary, params, column, higher, opts)
        if table.attrs.get("extended"):
            self.extra["cv"]["extended"] = table.attrs["extended"]
        if not self.a.quiet:
            chosen = ", ".join(f"{k} = {v:g}" for k, v in self.extra["tuned"].items())
            sys.stderr.write(
                f"cv: chose {chosen} (mean validation {name} "
                f"{self.extra['cv']['mean']:{fmt}} over {opts.folds} folds); refitting on all "
                "training data\n"
            )

    # -- what each method supplies -------------------------------------------------------------
    def prepare(self) -> None:  # pragma: no cover - each method's
        """Check the options and read the data (every error before anything is written)."""
        raise NotImplementedError

    def federated(self) -> bool:  # pragma: no cover - each method's
        """Whether the fit is tuned (or calibrated) inside the federation, in one batch."""
        raise NotImplementedError

    def cv_options(self):
        """The cross-validation's options, or ``None`` where nothing is cross-validated."""
        return cv_options(self.a, self.a.data_seed)

    def cross_validate(self, opts) -> tuple:  # pragma: no cover - each method's
        """A comparator's in-process tuning: ``(chosen cfg, table, summary, params)``."""
        raise NotImplementedError

    def round_limit(self) -> int:  # pragma: no cover - each method's
        raise NotImplementedError

    def n_sites(self) -> int:  # pragma: no cover - each method's
        raise NotImplementedError

    def run_inprocess(self, tmp: str, federated: bool, opts, progress) -> None:
        """The fit in process, its result written into ``tmp``.

        Parameters
        ----------
        tmp : str
            The fit's output directory (:func:`~strategies.runtime.cli.atomic_output_dir`).
        federated : bool
            Whether the fit is tuned (or calibrated) inside the federation
            (:meth:`federated`).
        opts : CVOptions or None
            The cross-validation's options (:meth:`cv_options`).
        progress : callable or None
            Where progress goes: a :class:`~strategies.runtime.cli.RoundProgress`, or for
            a federated fit :func:`~strategies.runtime.cli.line_to_stderr` (``None`` with
            ``--quiet``).
        """
        raise NotImplementedError  # pragma: no cover - each method's

    def run_config(self, tmp: str, federated: bool, opts) -> dict:
        """The Flower run config of the fit (``--engine flower``), writing into ``tmp``.

        Parameters
        ----------
        tmp : str
            The fit's output directory (the run config's ``out-dir``).
        federated : bool
            Whether the fit is tuned (or calibrated) inside the federation
            (:meth:`federated`).
        opts : CVOptions or None
            The cross-validation's options (:meth:`cv_options`).

        Returns
        -------
        dict
            The run config.
        """
        raise NotImplementedError  # pragma: no cover - each method's

    def after_run(self, tmp: str, federated: bool, opts) -> None:
        """What follows the run before ``metrics.json`` is completed (nothing by default).

        Parameters
        ----------
        tmp : str
            The fit's output directory, holding the run's files.
        federated : bool
            Whether the fit was tuned (or calibrated) inside the federation
            (:meth:`federated`).
        opts : CVOptions or None
            The cross-validation's options (:meth:`cv_options`).
        """

    def updates(self, seconds: float) -> dict:  # pragma: no cover - each method's
        """``metrics.json``'s entries besides the run's own (the run's ``seconds``)."""
        raise NotImplementedError

    def split(self) -> dict:  # pragma: no cover - each method's
        """``metrics.json``'s ``split``: where the test rows came from, the row counts."""
        raise NotImplementedError

    def write_test(self, tmp: str, metrics: dict) -> dict:  # pragma: no cover
        """``test.csv`` in ``tmp``.

        Parameters
        ----------
        tmp : str
            The fit's output directory.
        metrics : dict
            ``metrics.json``'s content so far (:func:`~strategies.runtime.cli.finish_outputs`).

        Returns
        -------
        dict
            ``metrics.json``'s ``test``.
        """
        raise NotImplementedError

    def own_files(self, where: str) -> None:
        """The method's own files in the fit's directory (nothing by default)."""

    def report(self, where: str) -> str:  # pragma: no cover - each method's
        """``report.html`` from the fit's files."""
        raise NotImplementedError
