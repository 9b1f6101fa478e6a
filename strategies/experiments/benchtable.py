"""The benchmark commands' table: one row per measurement, the machine in every row,
``bench.csv`` on disk and a printed block per kind of measurement."""

from __future__ import annotations

import os
import platform

import pandas as pd

from ..runtime.cli import atomic_output_dir, check_output_dir


def check_out(out: str) -> None:
    """Check ``out`` before a benchmark runs (not after it): a bad path fails at once."""
    if out:
        check_output_dir(out)


def finish(rows: list[dict], out: str) -> pd.DataFrame:
    """The rows as a frame with a ``machine`` column, written to ``out/bench.csv``."""
    df = pd.DataFrame(rows)
    df.insert(
        0,
        "machine",
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    )
    if out:
        with atomic_output_dir(out) as tmp:
            df.to_csv(os.path.join(tmp, "bench.csv"), index=False)
    return df


def format_table(df: pd.DataFrame) -> str:
    """One block per measurement (``what``), each with only its own columns."""
    lines = [f"machine: {df['machine'].iloc[0]}"]
    with pd.option_context("display.width", 160, "display.float_format", lambda v: f"{v:.4g}"):
        for what, block in df.groupby("what", sort=False):
            block = block.drop(columns=["machine", "what"]).dropna(axis=1, how="all")
            lines += ["", f"[{what}]", block.to_string(index=False)]
    return "\n".join(lines)
