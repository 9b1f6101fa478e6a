"""The state of :mod:`strategies.solvers.pqn`'s federated proximal quasi-Newton method, as
small frozen records: what the server has learned of each site (:class:`SiteModels`), the
model step being tried (:class:`ModelStep`), the fit's fixed choices (:class:`QnSettings`),
and the round's flags around them (:class:`QuasiNewtonState`); what a round returns
(:class:`Step`).  A round builds new records and never writes into the arrays of the state
it was given (a caller's, a checkpoint's).  Saved whole by checkpoints
(:meth:`QuasiNewtonState.arrays`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from .modelsolve import ModelSolution

#: Curvature models: BFGS (any smooth loss), secant (quadratic losses, matrix blocks), or
#: exact (the sites send their Hessians).
MODELS = ("bfgs", "secant", "exact")


@dataclass(frozen=True)
class SiteModels:
    """What the server holds of each site (first axis: the sites): its kept point, its loss
    and gradient there, and its curvature model."""

    x: np.ndarray  # (Z, p) or (Z, p, q): the kept (accepted) point
    value: np.ndarray  # (Z,) f_z(x_z)
    grad: np.ndarray  # like x
    hess: np.ndarray  # (Z, p, p) the curvature models B_z
    paired: np.ndarray = field(metadata={"dtype": bool})  # (Z,): B_z has had its first pair
    curvature: np.ndarray  # (Z,) B_z = curvature_z I before the first pair
    ss: np.ndarray  # (Z, p, p) the secant model's sums (empty for the other models)
    ys: np.ndarray
    damping: np.ndarray  # (Z,) mu_z
    seen: np.ndarray = field(metadata={"dtype": bool})  # (Z,) answered once

    def copy(self) -> SiteModels:
        """The same models in arrays of their own (a round writes only into these)."""
        return replace(self, **{f.name: getattr(self, f.name).copy() for f in fields(self)})


@dataclass(frozen=True)
class ModelStep:
    """The model step and the line search along it: the point the sites evaluate next."""

    trial: np.ndarray  # like x: the point being evaluated
    direction: np.ndarray  # like x: the model step d
    step: float = 1.0  # the line search's t
    decrease: float = 0.0  # Delta < 0: the model's predicted change of F at step 1


@dataclass(frozen=True)
class QnSettings:
    """The fit's fixed choices (:func:`init_qn`)."""

    model: str = "bfgs"  # bfgs | secant | exact (MODELS)
    min_rho: float = 0.0
    incremental: bool = False  # partial participation (pqn's module docstring)
    first_damping: float = 0.0  # exact model: mu_z = first_damping tr(H_z)/p at first answer


@dataclass(frozen=True)
class QuasiNewtonState:
    """The server's whole state; saved whole by checkpoints (:meth:`arrays`)."""

    sites: SiteModels
    search: ModelStep
    settings: QnSettings = QnSettings()
    objective: float = np.inf  # F at the estimate (estimate_objective)
    evaluated: bool = False  # x has been evaluated (false before the first answers)
    frozen: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), metadata={"dtype": bool})
    round: int = 0
    inner: ModelSolution | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """Every field of every record as an array, by its own name (a checkpoint's
        ``.npz`` entries), the inner solution's ``delta`` and ``u`` by split."""
        out = {}
        for record in (self.sites, self.search, self.settings, self):
            for f in fields(record):
                if f.name not in _RECORDS and f.name != "inner":
                    out[f.name] = np.asarray(getattr(record, f.name))
        if self.inner is not None:
            out["inner_rho"] = np.array(self.inner.rho)
            out["inner_weights"] = np.array(self.inner.weights, dtype=float)
            for k, (d, u) in enumerate(zip(self.inner.delta, self.inner.u, strict=True)):
                out[f"inner_delta_{k}"] = d
                out[f"inner_u_{k}"] = u
        return out

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> QuasiNewtonState:
        """The state :meth:`arrays` gave, each field back to its type (a field an older
        checkpoint lacks: as that version ran, :data:`_OLDER`)."""
        inner = None
        if "inner_rho" in a:
            n = sum(1 for k in a if k.startswith("inner_delta_"))
            inner = ModelSolution(
                np.asarray(a["x"]) + np.asarray(a["direction"]),
                tuple(np.asarray(a[f"inner_delta_{k}"]) for k in range(n)),
                tuple(np.asarray(a[f"inner_u_{k}"]) for k in range(n)),
                float(a["inner_rho"]),
                0,
                tuple(float(w) for w in a.get("inner_weights", ())),  # older: one rho
            )
        records = {name: kind(**_read(kind, a)) for name, kind in _RECORDS.items()}
        return cls(inner=inner, **records, **_read(cls, a, skip=(*_RECORDS, "inner")))


#: The records a state is made of, by the field that holds each.
_RECORDS = {"sites": SiteModels, "search": ModelStep, "settings": QnSettings}

_SCALARS = {"float": float, "bool": bool, "int": int, "str": str}

#: What a field absent from an older checkpoint was (they were added with partial
#: participation and the exact model's damping).
_OLDER = {
    "incremental": lambda a: False,
    "seen": lambda a: np.full(len(a["x"]), bool(a["evaluated"])),
    "damping": lambda a: np.zeros(len(a["x"])),
    "first_damping": lambda a: 0.0,
}


def _read(kind, a: dict, skip: tuple = ()) -> dict:
    """The fields of record ``kind`` (but ``skip``) from checkpoint arrays ``a``, each as
    its type."""
    given = {}
    for f in fields(kind):
        if f.name in skip:
            continue
        value = a[f.name] if f.name in a else _OLDER[f.name](a)
        if f.type == "np.ndarray":
            given[f.name] = np.asarray(value, f.metadata.get("dtype", float))
        else:
            given[f.name] = _SCALARS[f.type](value)
    return given


def init_qn(
    x0: np.ndarray,
    curvature: np.ndarray | None = None,
    model: str = "bfgs",
    min_rho: float = 0.0,
    incremental: bool = False,
    first_damping: float = 0.0,
) -> QuasiNewtonState:
    """Start at ``x0``.

    Parameters
    ----------
    x0 : ndarray, shape (Z, p) or (Z, p, q)
        The start (matrix blocks for the ``secant`` model).
    curvature : ndarray, shape (Z,), optional
        ``B_z = curvature_z I`` until the first step pair (default 1; see
        :func:`set_curvature`).
    model : {"bfgs", "secant", "exact"}, optional
        The curvature model (:data:`MODELS`).
    min_rho : float, optional
        The model problem's least inner penalty (MCP, SCAD).
    incremental : bool, optional
        The per-site form (:mod:`strategies.solvers.pqn`'s module docstring).
    first_damping : float, optional
        With the exact model (in the per-site form), a site's first model is damped by this
        times its mean curvature (Levenberg-Marquardt's start ``mu_0 = tau * scale``, Madsen,
        Nielsen & Tingleff 2004, "Methods for non-linear least squares problems", §3.2,
        with ``tau = first_damping``).

    Returns
    -------
    QuasiNewtonState
        The state before the first answers.
    """
    if model not in MODELS:
        raise ValueError(f"model: must be one of {', '.join(MODELS)}, got {model!r}")
    x0 = np.array(x0, dtype=float)
    n_sites, p = x0.shape[:2]
    c = np.ones(n_sites) if curvature is None else np.asarray(curvature, float)
    sites = SiteModels(
        x=x0.copy(),
        value=np.zeros(n_sites),
        grad=np.zeros_like(x0),
        hess=c[:, None, None] * np.eye(p)[None],
        paired=np.zeros(n_sites, bool),
        curvature=c.copy(),
        ss=np.zeros((n_sites, p, p) if model == "secant" else 0),
        ys=np.zeros((n_sites, p, p) if model == "secant" else 0),
        damping=np.zeros(n_sites),
        seen=np.zeros(n_sites, bool),
    )
    return QuasiNewtonState(
        sites=sites,
        search=ModelStep(trial=x0.copy(), direction=np.zeros_like(x0)),
        settings=QnSettings(model, float(min_rho), bool(incremental), float(first_damping)),
        frozen=np.zeros(n_sites, bool),
    )


@dataclass(frozen=True)
class Step:
    """What one evaluation round did."""

    accepted: bool
    objective: float  # F at the estimate (incremental form: the models' prediction)
    decrease: float  # the stopping measure (_stop_measure): -Delta, or sum d^T B d
    converged: bool
    inner_iterations: int
    seconds: float = 0.0  # the server's time for the round (model updates, model solve)

    def describe(self) -> str:
        return f"stop measure {self.decrease:.3g}" + ("" if self.accepted else " (retry)")


def set_curvature(st: QuasiNewtonState, bounds: dict[int, float]) -> QuasiNewtonState:
    """``B_z = c_z I`` (and the secant model's bound ``c_z``) before site ``z``'s first pair.

    Parameters
    ----------
    st : QuasiNewtonState
        The state (unchanged).
    bounds : dict of int to float
        ``{z: c_z}``; each curvature is floored at 1e-8.

    Returns
    -------
    QuasiNewtonState
        The state with the sites' bounds set.
    """
    if not bounds:
        return st
    curvature, hess = st.sites.curvature.copy(), st.sites.hess.copy()
    for z, c in bounds.items():
        c = max(float(c), 1e-8)
        curvature[z] = c
        hess[z] = c * np.eye(st.sites.x.shape[1])
    return replace(st, sites=replace(st.sites, curvature=curvature, hess=hess))
