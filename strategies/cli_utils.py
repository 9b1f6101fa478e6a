"""Command-line plumbing shared by both methods' commands: one-line errors, atomic outputs."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile

from .errors import InputError


class Parser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line (``error: ...``) with exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


def fail(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2


@contextlib.contextmanager
def atomic_output_dir(out: str):
    """Yield a temporary directory next to ``out``; on success its files are moved into
    ``out`` (created if needed).  On any error nothing is written to ``out``."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"out: {out} exists and is not a directory")
    if not os.path.isdir(parent):
        raise InputError(f"out: parent directory does not exist: {parent}")
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        yield tmp
        os.makedirs(out, exist_ok=True)
        for root, _, files in os.walk(tmp):
            rel = os.path.relpath(root, tmp)
            target = os.path.join(out, rel) if rel != "." else out
            os.makedirs(target, exist_ok=True)
            for f in files:
                os.replace(os.path.join(root, f), os.path.join(target, f))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def project_dir() -> str:
    """The Flower app directory (the checkout holding ``pyproject.toml``)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(here, "pyproject.toml")):
        raise InputError("engine: the flower engine needs the project checkout (pip install -e .)")
    return here
