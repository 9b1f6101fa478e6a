"""``python -m grauc_flower bench``: what a fit costs, side by side, on this machine.

- rounds to a 1e-4 and a 1e-6 relative objective gap for the paper's ``linearized`` solver
  (at its better rho of {0.1, 1}, from zeros) and for ``prox`` at the default settings, on the
  20-institution simulation-1 problem, against an optimum from a tight solve;
- wall time per round in-process and through ``flwr run`` (20 simulated SuperNodes);
- the surrogate's gradient: time and peak memory versus ``n m`` (chunked vs one pass);
- graph building versus the number of sites ``Z``; the server step versus ``Z`` (p = 20).

Ratios between variants are the figures to quote; absolute times depend on the machine.
"""

from __future__ import annotations

import os
import platform
import time
import tracemalloc

import numpy as np
import pandas as pd

from strategies import admm
from strategies.config import GrAUCConfig

from . import federation as fed
from .auc import PairwiseLogistic
from .graph import build_graph


def _gap_rounds(history: list[dict], fstar: float, level: float) -> float:
    gaps = np.array([abs(h["objective"] - fstar) / abs(fstar) for h in history])
    bad = np.flatnonzero(gaps > level)
    if len(bad) == 0:
        return 1.0
    return float(bad[-1] + 2) if bad[-1] + 1 < len(gaps) else float("nan")


def rounds_table(quick: bool) -> list[dict]:
    sites, _ = fed.load_sites(fed.DataSpec())
    base = GrAUCConfig()
    ref = fed.run_methods_inprocess(base.replace(tol=1e-13, max_rounds=4000), sites, ["grauc"])[
        "grauc"
    ]
    fstar = min(h["objective"] for h in ref.history[-50:])
    rows = []
    limit = 1500 if quick else 4000
    variants = [("prox (defaults)", base)]
    for rho in (0.1, 1.0):
        variants.append(
            (
                f"linearized rho={rho:g} zeros",
                base.replace(local_solver="linearized", rho=rho, init="zeros"),
            )
        )
    for name, cfg in variants:
        t0 = time.perf_counter()
        res = fed.run_methods_inprocess(cfg.replace(tol=1e-12, max_rounds=limit), sites, ["grauc"])[
            "grauc"
        ]
        rows.append(
            {
                "what": "rounds",
                "variant": name,
                "rounds_to_1e-4": _gap_rounds(res.history, fstar, 1e-4),
                "rounds_to_1e-6": _gap_rounds(res.history, fstar, 1e-6),
                "seconds_per_round_inprocess": (time.perf_counter() - t0) / res.rounds,
            }
        )
    return rows


def flower_round_time(rounds: int = 30) -> dict:
    """Seconds per round through ``flwr run`` (20 simulated SuperNodes), read off the
    server's per-round log (elapsed time at each round), and the start-up before round 1."""
    import re

    from strategies.cli_utils import project_dir
    from strategies.simulation import flwr_run

    t0 = time.perf_counter()
    out = flwr_run(
        project_dir(), {"method": "grauc", "grauc.max-rounds": rounds, "grauc.tol": 1e-14}, 20
    )
    wall = time.perf_counter() - t0
    stamps = {
        int(k): float(t)
        for k, t in re.findall(r"grauc round (\d+): objective .*?\(([\d.]+) s\)", out)
    }
    first, last = min(stamps), max(stamps)
    per_round = (stamps[last] - stamps[first]) / (last - first)
    return {
        "what": "flower",
        "variant": "flwr run, 20 SuperNodes",
        "seconds_per_round_flower": per_round,
        "rounds": last,
        "wall_seconds": wall,
        "startup_seconds": wall - per_round * last,
    }


def gradient_table(sizes) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    p = 20
    for n, m in sizes:
        xp, xn = rng.standard_normal((n, p)), rng.standard_normal((m, p))
        b = rng.standard_normal(p) * 0.1
        f = PairwiseLogistic(xp, xn)
        tracemalloc.start()
        t0 = time.perf_counter()
        f.value_and_grad(b)
        t_chunk = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        row = {
            "what": "gradient",
            "variant": f"n={n} m={m}",
            "n_times_m": n * m,
            "seconds_chunked": t_chunk,
            "peak_MiB_chunked": peak / 2**20,
        }
        if n * m <= 5e7:
            one = PairwiseLogistic(xp, xn, chunk_elements=n * m)
            t0 = time.perf_counter()
            one.value_and_grad(b)
            row["seconds_one_pass"] = time.perf_counter() - t0
            row["chunked_over_one_pass"] = t_chunk / row["seconds_one_pass"]
        rows.append(row)
    return rows


def graph_table(zs) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    for z in zs:
        lat = np.degrees(np.arcsin(rng.uniform(-1, 1, z)))
        lon = rng.uniform(-180, 180, z)
        t0 = time.perf_counter()
        build_graph(lat, lon)
        rows.append(
            {"what": "graph", "variant": f"Z={z}", "Z": z, "seconds": time.perf_counter() - t0}
        )
    return rows


def server_step_table(zs, p: int = 20) -> list[dict]:
    from strategies.grauc import grauc_problem

    rows = []
    rng = np.random.default_rng(0)
    for z in zs:
        lat = np.degrees(np.arcsin(rng.uniform(-1, 1, z)))
        lon = rng.uniform(-180, 180, z)
        graph = build_graph(lat, lon)
        problem = grauc_problem(graph, z, GrAUCConfig())
        state = admm.init_state(problem, rng.standard_normal((z, p)), 0.1, threshold=False)
        c = np.full(z, 1.0)
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            admm.global_component(problem, state, c)
            state, _ = admm.server_update(problem, state, state.beta + 0.01, 1e-6, 1e-6)
        rows.append(
            {
                "what": "server step",
                "variant": f"Z={z} p={p}",
                "Z": z,
                "seconds": (time.perf_counter() - t0) / reps,
            }
        )
    return rows


def run(out: str, quick: bool = False, flower: bool = True) -> pd.DataFrame:
    rows = rounds_table(quick)
    if flower:
        rows.append(flower_round_time())
    rows += gradient_table([(1000, 9000), (10000, 90000)] if not quick else [(1000, 9000)])
    rows += graph_table([100, 1000, 10000] if not quick else [100, 1000])
    rows += server_step_table([200, 2000])
    df = pd.DataFrame(rows)
    df.insert(
        0,
        "machine",
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    )
    if out:
        os.makedirs(out, exist_ok=True)
        df.to_csv(os.path.join(out, "bench.csv"), index=False)
    return df


def format_table(df: pd.DataFrame) -> str:
    """One block per measurement, each with only its own columns."""
    lines = [f"machine: {df['machine'].iloc[0]}"]
    with pd.option_context("display.width", 160, "display.float_format", lambda v: f"{v:.4g}"):
        for what, block in df.groupby("what", sort=False):
            block = block.drop(columns=["machine", "what"]).dropna(axis=1, how="all")
            lines += ["", f"[{what}]", block.to_string(index=False)]
    return "\n".join(lines)
