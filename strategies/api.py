"""The Python API of both methods, in scikit-learn's idiom.

One estimator per method (``grauc_flower.GrAUCPFL``, ``rowfed_flower.RowFed``) shares this
base.  Its parameters are the ``fit`` command's options under their Python names (``lam``,
``w_dist``, ``tune``, ``engine``, ``min_rows``, ...): the settings declarations' own names,
defaults and checks, read from the command line's parser, so a setting is declared once for
both.  ``fit`` runs the same flow as the command line (each method's ``fit_to_dir``) and
returns ``self``; the fitted attributes end in ``_``; ``save`` writes the very files the
command line writes, and ``load`` reads them back.

A bad value raises :class:`~strategies.errors.InputError` (a ``ValueError``) whose message
starts with the parameter's name; the command line turns the same error into one
``error:`` line.  Data frames reach the in-process fit in memory, read by the command
line's own reader as if they were its CSV files (no file is written); with
``engine="flower"`` they are written to temporary CSV files, which the simulated sites read
(exactly: the shortest decimal of a float reads back to the same float).  Either way an
API fit equals the command line's fit of the same rows.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd

from .errors import InputError

#: The command line options that are neither parameters nor ``fit`` arguments.
_NOT_PARAMS = ("help", "out", "command")

#: The file a saved fit must hold.
_COEFFICIENTS = "coefficients.csv"


def fit_parser(build_parser) -> argparse.ArgumentParser:
    """The ``fit`` subcommand's parser of a method's command line."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["fit"]


def _text(value) -> str:
    """A grid value as the command line would read it (a float by its shortest decimal,
    which reads back to the same float)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, str):
        return value
    raise TypeError


def convert(action: argparse.Action, name: str, value):
    """``value`` for the option ``action`` as its parser would have made it from text,
    checked as the parser checks it (its type, choices, a flag's True/False); a list for
    a text option (a grid, the responses) is joined by commas.

    Parameters
    ----------
    action : argparse.Action
        The option's action in the ``fit`` parser: its type, choices and default.
    name : str
        The parameter's name, which starts each error's message.
    value : object
        The value given from Python (``None``: the option's default).

    Returns
    -------
    object
        The value as the parser would have stored it: a number, a bool or text.
    """
    if value is None:
        return action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, (bool, np.bool_)):
            raise InputError(f"{name}: must be True or False, got {value!r}")
        return bool(value)
    kind = action.type
    if kind in (int, float):
        if isinstance(value, (bool, np.bool_, str)) or not isinstance(
            value, (int, float, np.integer, np.floating)
        ):
            raise InputError(f"{name}: must be a number, got {value!r}")
        if isinstance(value, (float, np.floating)) and not math.isfinite(value):
            raise InputError(f"{name}: must be a finite number, got {value!r}")
        if kind is int and not isinstance(value, (int, np.integer)):
            if not float(value).is_integer():
                raise InputError(f"{name}: must be an integer, got {value!r}")
        value = kind(value)
    else:
        try:
            if isinstance(value, (list, tuple, np.ndarray, pd.Index, range)):
                value = ",".join(_text(v) for v in value)
            else:
                value = _text(value)
        except TypeError:
            raise InputError(f"{name}: must be text or a list, got {value!r}") from None
    if action.choices is not None and value not in action.choices:
        allowed = ", ".join(str(c) for c in action.choices)
        raise InputError(f"{name}: must be one of {allowed}; got {value!r}")
    return value


def as_frame(data, what: str) -> pd.DataFrame:
    """``data`` as a data frame, else an error naming ``what``.

    Parameters
    ----------
    data : pandas.DataFrame or mapping
        A data frame, or a mapping of column names to columns.
    what : str
        The argument's name, which starts the error's message.

    Returns
    -------
    pandas.DataFrame
    """
    if isinstance(data, Mapping):
        data = pd.DataFrame(data)
    if not isinstance(data, pd.DataFrame):
        kind = type(data).__name__
        raise InputError(f"{what}: must be a pandas DataFrame or a CSV path, got {kind}")
    return data


def described(frame: pd.DataFrame) -> str:
    """How ``metrics.json`` names data given as a data frame."""
    return f"(a data frame: {frame.shape[0]} rows, {frame.shape[1]} columns)"


def as_csv(data, folder: str, name: str, what: str) -> tuple[str, str]:
    """``data`` as a CSV file: a path is used as it is, a data frame written into ``folder``.

    Parameters
    ----------
    data : str, os.PathLike, pandas.DataFrame or mapping
        A CSV path, a data frame, or a mapping of column names to columns.
    folder : str
        The directory a data frame is written into.
    name : str
        The file's stem: a data frame is written to ``folder/<name>.csv``.
    what : str
        The argument's name, which starts an error's message.

    Returns
    -------
    path : str
        The CSV file's path.
    named : str
        How ``metrics.json`` names the data: empty for a path (the file's own path), else
        the data frame's shape (:func:`described`).
    """
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data), ""
    data = as_frame(data, what)
    path = os.path.join(folder, f"{name}.csv")
    data.to_csv(path, index=False)
    return path, described(data)


class FederatedModel:
    """What both methods' estimators share: parameters, the fit's run, its files, scoring.

    A subclass sets :attr:`command` (its command line module, whose ``build_parser``
    declares the options), :attr:`settings` (its settings class), :attr:`inputs` (the
    ``fit`` options that describe the data, given to :meth:`fit`, not to the constructor),
    runs its flow in :meth:`_fit_to_dir` and reads its own files in :meth:`_read_fit`.
    """

    command: str = ""
    settings: type = object
    inputs: tuple[str, ...] = ()
    #: the column that names each row's site (GrAUC-PFL) or client (RowFed)
    site_column: str = "site"

    def __init__(self, **params) -> None:
        self._params: dict = {}
        self.set_params(**params)

    # -- parameters ---------------------------------------------------------------------------
    @classmethod
    def _actions(cls) -> dict[str, argparse.Action]:
        module = __import__(cls.command, fromlist=["build_parser"])
        return {
            a.dest: a for a in fit_parser(module.build_parser)._actions if a.dest not in _NOT_PARAMS
        }

    @classmethod
    def param_names(cls) -> list[str]:
        """Every parameter the constructor takes (the ``fit`` command's options)."""
        return [d for d in cls._actions() if d not in cls.inputs]

    def get_params(self, deep: bool = True) -> dict:
        """The parameters given (the others keep the command line's defaults)."""
        return dict(self._params)

    def set_params(self, **params) -> FederatedModel:
        """Set parameters, each checked now (its type, choices and range); returns self."""
        actions = self._actions()
        for name, value in params.items():
            if name not in actions or name in self.inputs:
                where = "an argument of fit()" if name in self.inputs else "not a parameter"
                raise InputError(f"{name}: {where} of {type(self).__name__}")
            convert(actions[name], name, value)
        merged = {**self._params, **params}
        self._namespace(merged, {})  # the settings' own checks, raised now
        self._params = merged
        return self

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._params.items())
        return f"{type(self).__name__}({shown})"

    def _namespace(self, params: dict, inputs: dict) -> argparse.Namespace:
        """The ``fit`` options: the parser's defaults, ``params`` and ``inputs`` over them;
        the method's settings built once so that a bad setting is raised here."""
        actions = self._actions()
        a = argparse.Namespace(**{d: act.default for d, act in actions.items()})
        a.quiet = True  # no progress lines unless asked (a notebook)
        for name, value in {**params, **inputs}.items():
            setattr(a, name, convert(actions[name], name, value) if name in actions else value)
        with self._named():
            from .runtime.cli import settings_from_args

            settings_from_args(self.settings, a)
        return a

    @staticmethod
    def _pythonic(exc: InputError) -> InputError:
        """The error with its option named as the parameter (``w_dist``, not ``w-dist``)."""
        text = re.sub(r"'?memory:\d+'?", "the data frame", str(exc))
        head, sep, rest = text.partition(":")
        if sep and head.strip() and " " not in head.strip():
            text = head.replace("-", "_") + sep + rest
        return type(exc)(text)

    @staticmethod
    @contextlib.contextmanager
    def _named():
        """Errors raised inside name the parameter as the API does (:meth:`_pythonic`)."""
        try:
            yield
        except InputError as exc:
            raise FederatedModel._pythonic(exc) from None

    # -- the fit ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _inputs(self, engine: str = ""):
        """``put(data, folder, name, what)``: a data frame as the fit reads it: held in
        memory for the in-process engine (read as its CSV file would be, without writing
        one), written to a CSV file in ``folder`` for ``flwr run`` (its sites read files);
        a path as it is.  The frames are let go afterwards."""
        from .datasets.tables import forget, remember

        engine = engine or self._params.get("engine") or "inprocess"
        held: list[str] = []

        def put(data, folder: str, name: str, what: str) -> tuple[str, str]:
            if engine != "inprocess" or isinstance(data, (str, os.PathLike)):
                return as_csv(data, folder, name, what)
            frame = as_frame(data, what)
            held.append(remember(frame))
            return held[-1], described(frame)

        try:
            yield put
        finally:
            for token in held:
                forget(token)
            self._release()  # a file read now may change before the next fit

    def _release(self) -> None:
        """Let go of what the fit cached of data frames held in memory (each method's)."""
        return None

    def _run(self, inputs: dict, work: str) -> FederatedModel:
        """Run the command line's flow on ``inputs`` (paths inside ``work``) and keep the
        files it wrote."""
        a = self._namespace(self._params, inputs)
        a.out = os.path.join(work, "model")
        with self._named():
            metrics = self._fit_to_dir(a)
        files = {}
        for root, _, names in os.walk(a.out):
            for f in names:
                path = os.path.join(root, f)
                rel = os.path.relpath(path, a.out)
                if not rel.startswith("."):
                    with open(path, "rb") as fh:
                        files[rel] = fh.read()
        self._set_fitted(files)
        self._warn(metrics)
        return self

    @staticmethod
    def _warn(metrics: dict) -> None:
        """What the command line prints as warnings, as Python warnings."""
        from .config import FEDAVG_FAMILY
        from .runtime.cli import warn_grid_edge

        stream = io.StringIO()
        warn_grid_edge(metrics, stream)
        info = metrics.get("inference") or {}
        if "error" in info:
            stream.write(f"warning: no confidence intervals: {info['error']}\n")
        if not metrics.get("converged", True) and metrics.get("method") not in FEDAVG_FAMILY:
            stream.write("warning: stopped at the round limit; see history_\n")
        for line in stream.getvalue().splitlines():
            text = re.sub(r"--([a-z0-9-]+)", lambda m: m[1].replace("-", "_"), line)
            # warn -> _warn -> _run -> fit -> the caller
            warnings.warn(text.removeprefix("warning: "), UserWarning, stacklevel=4)

    def _set_fitted(self, files: dict[str, bytes]) -> None:
        if _COEFFICIENTS not in files or "metrics.json" not in files:
            raise InputError(f"model: no {_COEFFICIENTS} or metrics.json (a fit's --out)")
        self._files = dict(files)
        self.metrics_ = json.loads(files["metrics.json"])
        try:
            self._read_fit()
        except (KeyError, ValueError, IndexError) as exc:
            kind = type(self).__name__
            raise InputError(f"model: not a {kind} fit ({type(exc).__name__}: {exc})") from None
        self.method_ = self.metrics_.get("method")
        self.settings_ = self.metrics_.get("config", {})
        self.n_rounds_ = self.metrics_.get("rounds")
        self.converged_ = self.metrics_.get("converged")
        self.objective_ = self.metrics_.get("objective")
        self.tuned_ = self.metrics_.get("tuned") or (self.metrics_.get("tuning") or {}).get(
            "selected"
        )
        self.history_ = self._frame("history.csv")
        self.test_ = self._frame("test.csv")

    def _frame(self, name: str, **read_csv) -> pd.DataFrame | None:
        if name not in self._files:
            return None
        return pd.read_csv(io.BytesIO(self._files[name]), **read_csv)

    @staticmethod
    def _fit_to_dir(a) -> dict:  # pragma: no cover - each method's flow
        raise NotImplementedError

    def _read_fit(self) -> None:  # pragma: no cover - each method reads its own files
        raise NotImplementedError

    def _check_fitted(self) -> None:
        if not hasattr(self, "_files"):
            raise InputError(f"model: this {type(self).__name__} is not fitted; call fit first")

    # -- files --------------------------------------------------------------------------------
    def save(self, path: str) -> str:
        """Write the fit's files into the directory ``path`` (what ``fit --out`` writes;
        ``predict --model path`` and ``report --model path`` read it); returns its path."""
        from .runtime.cli import atomic_output_dir

        self._check_fitted()
        with atomic_output_dir(os.fspath(path)) as tmp:
            self._write_files(tmp)
        return os.path.abspath(path)

    def _write_files(self, folder: str, skip: tuple[str, ...] = ()) -> str:
        for rel, content in self._files.items():
            if rel in skip:
                continue
            target = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(content)
        return folder

    @classmethod
    def load(cls, path: str) -> FederatedModel:
        """A fitted estimator from a fit's directory (the API's ``save`` or ``fit --out``)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise InputError(f"model: not a directory: {path}")
        files = {}
        for root, _, names in os.walk(path):
            for f in names:
                full = os.path.join(root, f)
                rel = os.path.relpath(full, path)
                if not rel.startswith("."):
                    with open(full, "rb") as fh:
                        files[rel] = fh.read()
        if _COEFFICIENTS not in files:
            raise InputError(f"model: no {_COEFFICIENTS} in {path} (a fit's --out)")
        metrics = json.loads(files.get("metrics.json", b"{}"))
        model = cls()
        model._set_fitted(files)
        # the settings it ran with (tuned levels included) are its parameters: a refit of
        # the loaded estimator is the same fit
        names = set(cls.param_names())
        ran = {k.replace("-", "_"): v for k, v in (metrics.get("config") or {}).items()}
        params = {k: v for k, v in ran.items() if k in names and v is not None}
        try:
            model.set_params(method=metrics.get("method") or "", **params)
        except InputError:  # another version's settings: the fit stands, its parameters not
            model.set_params(**({"method": metrics["method"]} if metrics.get("method") else {}))
        return model

    def report(self, path: str) -> str:
        """Write the fit's one-page report (``report.html``) to the file ``path``."""
        from .stats.predict import write_bytes_atomic

        self._check_fitted()
        return write_bytes_atomic(self._files["report.html"], os.fspath(path))

    # -- scoring ------------------------------------------------------------------------------
    def predict_table(self, data, **options) -> pd.DataFrame:
        """The table ``predict`` writes for ``data``: ``row``, the site, the outputs.

        Parameters
        ----------
        data : pandas.DataFrame or str
            A data frame or CSV path with the site column and the features.
        **options
            The method's own options of ``predict`` (none by default: a name given is an
            :class:`~strategies.errors.InputError`).

        Returns
        -------
        pandas.DataFrame
        """
        from .stats.predict import predicted_rows

        self._check_fitted()
        with (
            tempfile.TemporaryDirectory(prefix="pfl-predict-") as work,
            self._inputs(engine="inprocess") as put,  # rows are read in memory
        ):
            model_dir = self._write_files(os.path.join(work, "model"), skip=("report.html",))
            path, _ = put(data, work, "data", "data")
            args = self._predict_args(model_dir, path, work, **options)
            result, _, _ = predicted_rows(args, *self._predict_reader())
        return result

    def _predict_args(self, model_dir: str, path: str, work: str, **options):
        if options:
            raise InputError(f"{next(iter(options))}: not an option of predict")
        return argparse.Namespace(model=model_dir, data=path)

    def _predict_reader(self) -> tuple:  # pragma: no cover - each method's reader
        raise NotImplementedError
