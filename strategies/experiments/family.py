"""What both methods' problem families share: rounds to a gap read off a fit's history, and
the distribution of a measurement over a family (median, 90th percentile, worst).

A *family* is a fixed list of problems, each generated from its own seed, that spans the
federations users bring (sizes, dimensions, balance, geography, penalty levels); the bench
and the round tests read their round counts over it, so that no default is chosen on one
problem (docs/performance.md, "The problem family")."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

#: The variants each member is measured with, for both methods: (name, changes to the
#: member's configuration).  ``learned`` is the default fit (curvature learned from the
#: gradients).
VARIANTS = (
    ("learned", {}),
    ("exact", {"curvature": "exact"}),
    ("participation 0.5", {"participation": 0.5}),
)


def gap_rounds(objectives: Sequence[float], fstar: float, level: float) -> float:
    """The first round after which every recorded objective is within ``level`` (relative)
    of ``fstar``.

    Parameters
    ----------
    objectives : sequence of float
        The objective after each round: round ``k`` is ``objectives[k - 1]``.
    fstar : float
        The reference objective.
    level : float
        The relative gap ``|f - fstar| / |fstar|`` to reach.

    Returns
    -------
    float
        The round; ``nan`` if the last objective is not within ``level`` (or none was
        recorded).
    """
    values = np.asarray(objectives, dtype=float)
    if values.size == 0:
        return float("nan")
    gaps = np.abs(values - fstar) / max(abs(fstar), 1e-300)
    bad = np.flatnonzero(~(gaps <= level))
    if bad.size == 0:
        return 1.0
    return float(bad[-1] + 2) if bad[-1] + 1 < values.size else float("nan")


def signed_gap_rounds(objectives: Sequence[float], fstar: float, level: float) -> float:
    """As :func:`gap_rounds` with the gap signed: ending *below* ``fstar`` counts as reaching
    it (a non-convex fit may end at a lower stationary point than the reference's).

    Parameters
    ----------
    objectives : sequence of float
        The objective after each round: round ``k`` is ``objectives[k - 1]``.
    fstar : float
        The reference objective.
    level : float
        The relative gap ``(f - fstar) / |fstar|`` to reach.

    Returns
    -------
    float
        The round; ``nan`` if the last objective is not within ``level`` (or none was
        recorded).
    """
    values = np.asarray(objectives, dtype=float)
    if values.size == 0:
        return float("nan")
    gaps = (values - fstar) / max(abs(fstar), 1e-300)
    bad = np.flatnonzero(~(gaps <= level))
    if bad.size == 0:
        return 1.0
    return float(bad[-1] + 2) if bad[-1] + 1 < values.size else float("nan")


def true_objectives(strategy, clients, max_rounds: int) -> list[float]:
    """Run a fused strategy in process and return the objective at its estimate after every
    round, from the clients' own losses there (a ``gradient`` instruction to each, with the
    fit's working configuration) and the penalty the fit minimizes (MCP/SCAD themselves,
    not their linearization): true values, where a fit's history may hold its models'
    predictions (``curvature = exact``, partial participation).

    Parameters
    ----------
    strategy : FusedSiteStrategy
        The fit's strategy; its ``progress`` hook is wrapped to record the estimate after
        each round.
    clients : list of NumPyClient
        One per site.
    max_rounds : int
        The round limit of the run.

    Returns
    -------
    list of float
        The true objective after each round.
    """
    from ..runtime.engine import run_inprocess

    betas: list[np.ndarray] = []
    report = strategy.progress

    def record(rnd, objective, res, elapsed) -> None:
        betas.append(np.array(strategy.coefficients_std(), dtype=float))
        if report is not None:
            report(rnd, objective, res, elapsed)

    strategy.progress = record
    run_inprocess(strategy, clients, max_rounds)
    work = strategy.work_config()
    order = strategy.registry.order()
    by_site = {}
    for client in clients:
        props = client.get_properties({})
        by_site[str(props["site"])] = client
    values = []
    for beta in betas:
        total = float(strategy.target.penalty_value(beta))
        for z, site in enumerate(order):
            config = {"task": "gradient", "site": site, **work}
            _, _, metrics = by_site[site].fit([beta[z]], config)
            total += float(metrics["loss"])
        values.append(total)
    return values


def distribution(values: Iterable[float]) -> dict[str, float]:
    """``median``, ``p90`` (the 90th percentile, linear interpolation), ``worst`` (the
    largest) and ``failed`` (how many did not get there, ``nan``) of ``values``; a failure
    counts as infinitely many rounds in the percentiles."""
    arr = np.array([float(v) for v in values], dtype=float)
    failed = int(np.sum(~np.isfinite(arr)))
    ranked = np.where(np.isfinite(arr), arr, math.inf)
    if ranked.size == 0:
        return {"median": math.nan, "p90": math.nan, "worst": math.nan, "failed": 0}

    ordered = np.sort(ranked)

    def pct(q: float) -> float:
        pos = q / 100.0 * (ordered.size - 1)
        lo, hi = int(math.floor(pos)), int(math.ceil(pos))
        if not math.isfinite(ordered[hi]):
            return math.inf
        return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))

    return {
        "median": pct(50.0),
        "p90": pct(90.0),
        "worst": float(ranked.max()),
        "failed": failed,
    }


def summarize(rows: list[dict], by: Sequence[str], columns: Sequence[str]) -> list[dict]:
    """The :func:`distribution` of some columns over the family's rows, per group.  A gap
    column (``rounds_to_1e-*``) leaves out the rows without a reference (``reference`` not
    finite), counted in ``no_reference``: a gap nobody can read is not a failure.

    Parameters
    ----------
    rows : list of dict
        The family's rows.
    by : sequence of str
        The columns whose values form the groups (e.g. the variant).
    columns : sequence of str
        The columns summarized (a missing value counts as a failure).

    Returns
    -------
    list of dict
        One row per group, in the order of first appearance: the ``by`` values,
        ``problems``, ``no_reference`` and, per column, ``<column>_median``,
        ``<column>_p90``, ``<column>_worst`` and ``<column>_failed``.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[b] for b in by), []).append(row)
    out = []
    for key, members in groups.items():
        summary = dict(zip(by, key, strict=True))
        summary["problems"] = len(members)
        known = [m for m in members if _finite(m.get("reference", 0.0))]
        summary["no_reference"] = len(members) - len(known)
        for col in columns:
            rows_of = known if col.startswith("rounds_to_1e-") else members
            d = distribution(m.get(col, math.nan) for m in rows_of)
            for stat, value in d.items():
                summary[f"{col}_{stat}"] = value
        out.append(summary)
    return out


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def measure_variants(
    recorded_run, data, cfg, fstar: float, variants, limit: int, fields: dict, rounds=gap_rounds
) -> list[dict]:
    """One row per variant: the rounds to a 1e-4 and a 1e-6 relative gap to ``fstar`` from a
    ``tol`` 1e-12 run's true objectives, and to the stopping rule of ``cfg`` with the gap
    there.  Without a reference (``fstar`` not finite: MCP/SCAD where the paper's ADMM did
    not converge) the gaps are ``nan`` and the tight run is skipped; :func:`summarize`
    leaves such rows out of the gaps' distributions.

    Parameters
    ----------
    recorded_run : callable
        ``recorded_run(data, cfg) -> (strategy, objectives)``: one fit and its true
        objective after each round.
    data : object
        The member's data, passed to ``recorded_run``.
    cfg : object
        The member's configuration (a method config with ``replace``).
    fstar : float
        The reference objective.
    variants : iterable of tuple
        ``(name, changes)`` each: the variant's name and its changes to ``cfg``
        (:data:`VARIANTS`).
    limit : int
        The round limit (``max_rounds``) of every run.
    fields : dict
        The member's description; it opens each row.
    rounds : callable, optional
        ``rounds(objectives, fstar, level)`` reads the gaps: :func:`gap_rounds`, or
        :func:`signed_gap_rounds` where ending below the reference counts.

    Returns
    -------
    list of dict
        One row per variant: ``what``, the ``fields``, ``variant``, ``reference``,
        ``rounds_to_1e-4``, ``rounds_to_1e-6``, ``rounds_to_stop`` (``nan`` when the fit did
        not converge) and ``gap_at_stop``.
    """
    rows = []
    for name, changes in variants:
        variant = cfg.replace(max_rounds=limit, **changes)
        stop, at_stop = recorded_run(data, variant)
        objectives: list[float] = []
        if math.isfinite(fstar):
            _, objectives = recorded_run(data, variant.replace(tol=1e-12))
        rows.append(
            {
                "what": "family",
                **fields,
                "variant": name,
                "reference": fstar,
                "rounds_to_1e-4": rounds(objectives, fstar, 1e-4),
                "rounds_to_1e-6": rounds(objectives, fstar, 1e-6),
                "rounds_to_stop": float(stop.rounds) if stop.converged else math.nan,
                "gap_at_stop": (at_stop[-1] - fstar) / abs(fstar) if at_stop else math.nan,
            }
        )
    return rows


def _kept(keep: str | None, name: str) -> list[dict] | None:
    """The rows a member's earlier measurement kept in ``keep`` (``None``: none)."""
    import os

    import pandas as pd

    path = os.path.join(keep, f"{name}.csv") if keep else ""
    if not path or not os.path.isfile(path):
        return None
    return pd.read_csv(path).to_dict("records")


def _keep(keep: str | None, name: str, rows: list[dict]) -> None:
    """Write a member's rows to ``keep/<name>.csv`` (whole or not at all)."""
    import os

    import pandas as pd

    if not keep:
        return
    os.makedirs(keep, exist_ok=True)
    path = os.path.join(keep, f"{name}.csv")
    pd.DataFrame(rows).to_csv(path + ".part", index=False)
    os.replace(path + ".part", path)


def run_family(
    measure, members, by: Sequence[str], quick: bool = False, keep: str | None = None
) -> list[dict]:
    """Measure every member of a family, with a progress line per member (members left,
    seconds so far and an estimate of those left) on stdout.

    Parameters
    ----------
    measure : callable
        ``measure(member)``: the member's rows (a list of dict).
    members : iterable
        The family's members, each with a ``name``.
    by : sequence of str
        The columns whose values group the summary rows (:func:`summarize`).
    quick : bool, optional
        Only every third member.
    keep : str, optional
        A directory where each member's rows are written as soon as they are measured
        (``<member>.csv``) and read back instead of measuring again, so that a family too
        long for one sitting is measured over several (remove the directory to measure
        anew).

    Returns
    -------
    list of dict
        The members' rows, then one ``what = family-summary`` row per value of ``by`` with
        the :func:`distribution` of the rounds to a 1e-6 gap and to the stopping rule.
    """
    import time

    chosen = list(members)[::3] if quick else list(members)
    rows: list[dict] = []
    t0 = time.perf_counter()
    measured = 0
    for k, member in enumerate(chosen, start=1):
        got = _kept(keep, member.name)
        how = ", kept"
        if got is None:
            got, how = measure(member), ""
            _keep(keep, member.name, got)
            measured += 1
        rows += got
        spent = time.perf_counter() - t0
        left = spent / measured * (len(chosen) - k) if measured else 0.0
        line = f"family: {k}/{len(chosen)} {member.name} ({spent:.0f} s{how}, "
        print(f"{line}about {left:.0f} s left)", flush=True)
    summary = summarize(rows, by, ["rounds_to_1e-6", "rounds_to_stop"])
    return rows + [{"what": "family-summary", **row} for row in summary]


__all__ = [
    "VARIANTS",
    "run_family",
    "distribution",
    "gap_rounds",
    "measure_variants",
    "signed_gap_rounds",
    "summarize",
    "true_objectives",
]
