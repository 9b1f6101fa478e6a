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
    """The rows as a frame with a ``machine`` column, written to ``out/bench.csv``.

    Parameters
    ----------
    rows : list of dict
        One per measurement.
    out : str
        The output directory, written atomically; empty: nothing is written.

    Returns
    -------
    pandas.DataFrame
        The rows, ``machine`` first (the processor, its cores and the Python version).
    """
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


def timed_tuning(strategy, clients, max_rounds: int) -> dict:
    """Run a federated tuning (:class:`strategies.server.batch.BatchStrategy`) in process with each
    client's ``fit`` and ``evaluate`` timed: the rounds and fits it took, the wall time, and
    per round the server's time (the rest of the wall time) against the slowest site's (the
    sites answer side by side in a federation; here one after another).

    Parameters
    ----------
    strategy : BatchStrategy
        The tuning's strategy.
    clients : list of NumPyClient
        One per site; their ``fit`` and ``evaluate`` are replaced by timed wrappers.
    max_rounds : int
        The round limit of the in-process run.

    Returns
    -------
    dict
        ``rounds``, ``fits``, ``wall_seconds``, ``server_seconds_per_round``,
        ``slowest_site_seconds_per_round``, and the strategy's own clock:
        ``hooks_seconds_per_round`` (its hooks) and ``wait_seconds_per_round`` (the wait for
        the answers).
    """
    import time

    from ..runtime.engine import run_inprocess

    per_round: dict[int, list[float]] = {}
    for z, c in enumerate(clients):
        for name in ("fit", "evaluate"):
            inner = getattr(c, name)

            def timed(parameters, config, inner=inner, z=z):
                t0 = time.perf_counter()
                try:
                    return inner(parameters, config)
                finally:
                    row = per_round.setdefault(strategy.rounds + 1, [0.0] * len(clients))
                    row[z] += time.perf_counter() - t0

            setattr(c, name, timed)
    t0 = time.perf_counter()
    rounds = run_inprocess(strategy, clients, max_rounds)
    wall = time.perf_counter() - t0
    site_total = sum(sum(r) for r in per_round.values())
    slowest = [max(r) for r in per_round.values()]
    return {
        "rounds": rounds,
        "fits": strategy.fits,
        "wall_seconds": wall,
        "server_seconds_per_round": (wall - site_total) / max(rounds, 1),
        "slowest_site_seconds_per_round": float(sum(slowest)) / max(rounds, 1),
        # the strategy's own clock: its hooks against the wait for the answers
        "hooks_seconds_per_round": strategy.timing().get("server_seconds_per_round"),
        "wait_seconds_per_round": strategy.timing().get("sites_seconds_per_round"),
    }


def format_table(df: pd.DataFrame) -> str:
    """One block per measurement (``what``), each with only its own columns."""
    lines = [f"machine: {df['machine'].iloc[0]}"]
    with pd.option_context("display.width", 160, "display.float_format", lambda v: f"{v:.4g}"):
        for what, block in df.groupby("what", sort=False):
            block = block.drop(columns=["machine", "what"]).dropna(axis=1, how="all")
            lines += ["", f"[{what}]", block.to_string(index=False)]
    return "\n".join(lines)
