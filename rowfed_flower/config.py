"""RowFed's run configuration: one frozen, validated object (run-config keys ``rowfed.*``).

Every key has its default here and again, with the same value, in ``pyproject.toml``'s
``[tool.flwr.app.config]``; ``configs/*.toml`` and the fit command's options only override.
Errors are :class:`strategies.errors.InputError` whose one-line message names the key and
the allowed range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from strategies.config import _check, _check_finite, from_run_config, parse_methods, to_run_config
from strategies.errors import InputError
from strategies.penalties import DEFAULT_CONCAVITY, KINDS, Penalty

#: Method names accepted by ``method`` when ``task = "rowfed"``.
ROWFED_METHODS = ("rowfed", "nonfed", "fedavg", "perfl-lsma")
#: Run-config prefix of :class:`RowFedConfig`'s keys.
PREFIX = "rowfed"


@dataclass(frozen=True)
class RowFedConfig:
    """Settings of a RowFed fit and its baselines (run-config keys in brackets).

    Notes
    -----
    ``concavity = 0`` means the penalty's default (3 for MCP, 3.7 for SCAD; METHODS.md B.2).
    MCP needs ``concavity > 1/rho`` and SCAD ``concavity > 1 + 1/rho`` (the thresholds of
    B.3 are then unique minimizers); a schedule ``rho <- alpha rho`` with ``alpha >= 1``
    keeps this true in later rounds.
    """

    penalty: str = "lasso"  # [rowfed.penalty] lasso | mcp | scad
    concavity: float = 0.0  # [rowfed.concavity] iota; 0 = default (3 MCP, 3.7 SCAD)
    lam1: float = 0.05  # [rowfed.lam1] row-wise fusion level >= 0
    lam2: float = 0.02  # [rowfed.lam2] sparsity level >= 0
    sparsity: str = "entry"  # [rowfed.sparsity] entry | row
    graph: str = "all-pairs"  # [rowfed.graph] all-pairs | path to an edge CSV
    participation: float = 1.0  # [rowfed.participation] pi in (0, 1]
    rho: float = 1.0  # [rowfed.rho] initial ADMM penalty > 0
    alpha: float = 1.0  # [rowfed.alpha] rho <- alpha rho each round, >= 1
    algorithm: str = "auto"  # [rowfed.algorithm] auto | pqn | admm (auto: see resolved_algorithm)
    local_solver: str = "prox"  # [rowfed.local-solver] prox | linearized (algorithm admm)
    init: str = "ridge"  # [rowfed.init] oracle initial estimate: ridge | nonfed
    tol: float = 1e-6  # [rowfed.tol] absolute and relative residual tolerance > 0
    max_rounds: int = 1000  # [rowfed.max-rounds] ADMM round limit >= 1
    intercept: bool = True  # [rowfed.intercept] a free intercept per client and response
    standardize: str = "none"  # [rowfed.standardize] none | federated (pooled SD)
    fedavg_rounds: int = 100  # [rowfed.fedavg-rounds] FedAvg rounds >= 1
    fedavg_local_steps: int = 5  # [rowfed.fedavg-local-steps] local prox-gradient steps >= 1
    fedavg_lr: float = 0.0  # [rowfed.fedavg-lr] local step size; 0 = 1/L_m per client
    seed: int = 0  # [seed] participation draws

    def __post_init__(self) -> None:
        _check_finite(self)
        _check(self.penalty in KINDS, "penalty", f"must be one of {', '.join(KINDS)}", self.penalty)
        _check(self.concavity >= 0, "concavity", "must be >= 0 (0 = default)", self.concavity)
        _check(self.lam1 >= 0, "lam1", "must be >= 0", self.lam1)
        _check(self.lam2 >= 0, "lam2", "must be >= 0", self.lam2)
        _check(self.sparsity in ("entry", "row"), "sparsity", "must be entry or row", self.sparsity)
        _check(
            isinstance(self.graph, str) and self.graph != "",
            "graph",
            "must be all-pairs or a path to an edge CSV",
            self.graph,
        )
        _check(
            0 < self.participation <= 1,
            "participation",
            "must be in (0, 1]",
            self.participation,
        )
        _check(self.rho > 0, "rho", "must be > 0", self.rho)
        _check(
            self.algorithm in ("auto", "pqn", "admm"),
            "algorithm",
            "must be auto, pqn or admm",
            self.algorithm,
        )
        _check(
            self.algorithm != "pqn" or (self.penalty == "lasso" and self.participation == 1),
            "algorithm",
            "pqn needs penalty = lasso and participation = 1 (use admm)",
            self.algorithm,
        )
        _check(self.alpha >= 1, "alpha", "must be >= 1", self.alpha)
        _check(
            self.local_solver in ("prox", "linearized"),
            "local-solver",
            "must be prox or linearized",
            self.local_solver,
        )
        _check(self.init in ("ridge", "nonfed"), "init", "must be ridge or nonfed", self.init)
        _check(self.tol > 0, "tol", "must be > 0", self.tol)
        _check(self.max_rounds >= 1, "max-rounds", "must be >= 1", self.max_rounds)
        _check(
            isinstance(self.intercept, bool), "intercept", "must be true or false", self.intercept
        )
        _check(
            self.standardize in ("none", "federated"),
            "standardize",
            "must be none or federated",
            self.standardize,
        )
        _check(self.fedavg_rounds >= 1, "fedavg-rounds", "must be >= 1", self.fedavg_rounds)
        _check(
            self.fedavg_local_steps >= 1,
            "fedavg-local-steps",
            "must be >= 1",
            self.fedavg_local_steps,
        )
        _check(self.fedavg_lr >= 0, "fedavg-lr", "must be >= 0", self.fedavg_lr)
        iota = self.iota
        if self.penalty == "mcp":
            _check(
                iota > 1.0 / self.rho,
                "concavity",
                f"MCP needs concavity > 1/rho = {1.0 / self.rho:g}",
                iota,
            )
        if self.penalty == "scad":
            _check(
                iota > 1.0 + 1.0 / self.rho,
                "concavity",
                f"SCAD needs concavity > 1 + 1/rho = {1.0 + 1.0 / self.rho:g}",
                iota,
            )

    @property
    def iota(self) -> float:
        """The concavity in use (the penalty's default when ``concavity == 0``)."""
        return (
            float(self.concavity) if self.concavity > 0 else float(DEFAULT_CONCAVITY[self.penalty])
        )

    def penalty_obj(self) -> Penalty:
        """The :class:`Penalty` used for fusion and sparsity."""
        return Penalty(self.penalty, None if self.penalty == "lasso" else self.iota)

    @property
    def resolved_algorithm(self) -> str:
        """``auto``: the proximal quasi-Newton method (a handful of rounds) for the convex
        lasso with every client in every round; the paper's ADMM for MCP/SCAD (nonconvex:
        its fixed points are what the paper studies) and for partial participation."""
        if self.algorithm != "auto":
            return self.algorithm
        return "pqn" if self.penalty == "lasso" and self.participation == 1 else "admm"

    def replace(self, **changes) -> RowFedConfig:
        return dataclasses.replace(self, **changes)


def _bool(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InputError(f"{key}: expected true or false, got {value!r}")


def rowfed_config(run_config: dict) -> RowFedConfig:
    """:class:`RowFedConfig` from a Flower run config (keys ``rowfed.<name>`` and ``seed``)."""
    rc = dict(run_config)
    key = f"{PREFIX}.intercept"
    if key in rc:
        rc[key] = _bool(rc[key], "intercept")
    return from_run_config(RowFedConfig, rc, PREFIX)


def rowfed_run_config(cfg: RowFedConfig) -> dict:
    """The inverse of :func:`rowfed_config` (for ``flwr run --run-config``)."""
    return to_run_config(cfg, PREFIX)


def rowfed_methods(run_config: dict) -> list[str]:
    return parse_methods(run_config.get("method", "rowfed"), ROWFED_METHODS)


__all__ = [
    "ROWFED_METHODS",
    "RowFedConfig",
    "rowfed_config",
    "rowfed_methods",
    "rowfed_run_config",
]
