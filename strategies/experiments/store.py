"""Finished tasks on disk: one part file per (cell, replication), written atomically, the
settings fingerprint of an output directory and the growing ``results.csv``."""

from __future__ import annotations

import json
import os

import pandas as pd

from ..errors import InputError
from .design import Study, cell_label

RESULTS = "results"
#: Id columns read back as text (a county FIPS code such as "06037" keeps its zero).
ID_DTYPES = {"site": str, "client": str}


def atomic_csv(frame: pd.DataFrame, path: str) -> None:
    """Write a frame as CSV (no index) to a temporary file, then move it to ``path``.

    Parameters
    ----------
    frame : pandas.DataFrame
        The table.
    path : str
        The CSV file.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


class PartStore:
    """Finished tasks under ``out/parts``: ``<cell>/rep-NNNN.csv`` marks a task done."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.root = os.path.join(out, "parts")

    def path(self, cell: dict, rep: int, name: str = RESULTS) -> str:
        """The part file of a task's frame.

        Parameters
        ----------
        cell : dict
            The task's design values (the folder: :func:`cell_label`).
        rep : int
            Its replication.
        name : str, optional
            The frame's name.

        Returns
        -------
        str
            ``<root>/<cell>/rep-NNNN.csv`` for ``results``, ``rep-NNNN.<name>.csv`` for
            another frame.
        """
        stem = f"rep-{rep:04d}" + ("" if name == RESULTS else f".{name}")
        return os.path.join(self.root, cell_label(cell), stem + ".csv")

    def done(self, cell: dict, rep: int) -> bool:
        """Whether a task is finished (its ``results`` part file exists).

        Parameters
        ----------
        cell : dict
            The task's design values.
        rep : int
            Its replication.

        Returns
        -------
        bool
        """
        return os.path.isfile(self.path(cell, rep))

    def write(self, cell: dict, rep: int, frames: dict[str, pd.DataFrame]) -> None:
        """Every frame atomically, ``results`` last (the task's completion mark).

        Parameters
        ----------
        cell : dict
            The task's design values.
        rep : int
            Its replication.
        frames : dict of str to pandas.DataFrame
            The task's frames by name; ``results`` is required.
        """
        os.makedirs(os.path.dirname(self.path(cell, rep)), exist_ok=True)
        for name, frame in frames.items():
            if name != RESULTS:
                atomic_csv(frame, self.path(cell, rep, name))
        atomic_csv(frames[RESULTS], self.path(cell, rep))

    def read(self, cell: dict, rep: int, name: str = RESULTS) -> pd.DataFrame | None:
        """A task's frame as written (the ``site`` and ``client`` columns as text).

        Parameters
        ----------
        cell : dict
            The task's design values.
        rep : int
            Its replication.
        name : str, optional
            The frame's name.

        Returns
        -------
        pandas.DataFrame or None
            The frame, or ``None`` when there is no such file.
        """
        path = self.path(cell, rep, name)
        return pd.read_csv(path, dtype=ID_DTYPES) if os.path.isfile(path) else None

    def all_results(self) -> pd.DataFrame:
        """Every finished task's rows (any cell, any replication), or an empty frame."""
        if not os.path.isdir(self.root):
            return pd.DataFrame()
        frames = []
        for cell_dir in sorted(os.listdir(self.root)):
            d = os.path.join(self.root, cell_dir)
            if not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if name.startswith("rep-") and name.endswith(".csv") and name.count(".") == 1:
                    frames.append(pd.read_csv(os.path.join(d, name), dtype=ID_DTYPES))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def check_fingerprint(out: str, study: Study) -> None:
    """Write ``study.json`` in a new ``out``; in a used one it must match this study's (else
    an :class:`InputError` names the top-level tables that differ).

    Parameters
    ----------
    out : str
        The output directory.
    study : Study
        The study; its :meth:`Study.fingerprint` is compared.
    """
    path = os.path.join(out, "study.json")
    mine = json.loads(json.dumps(study.fingerprint(), sort_keys=True, default=str))
    if os.path.isfile(path):
        with open(path) as fh:
            theirs = json.load(fh)
        if theirs != mine:
            diff = sorted(
                k
                for k in set(theirs) | set(mine)
                if theirs.get(k) != mine.get(k)  # top-level tables that differ
            )
            raise InputError(
                f"out: {out} holds a study with other settings ({', '.join(diff)}); "
                "use another --out"
            )
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(mine, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


def append_rows(path: str, frame: pd.DataFrame) -> None:
    """Append rows to a CSV file in one write.

    Parameters
    ----------
    path : str
        The CSV file; a new or empty one gets the header.
    frame : pandas.DataFrame
        The rows; in an existing file, reordered to its header's columns (a column not in it
        is dropped, one missing is empty).
    """
    exists = os.path.isfile(path) and os.path.getsize(path) > 0
    if exists:
        with open(path) as fh:
            columns = fh.readline().strip().split(",")
        frame = frame.reindex(columns=columns)
    text = frame.to_csv(index=False, header=not exists)
    with open(path, "a") as fh:
        fh.write(text)
        fh.flush()
