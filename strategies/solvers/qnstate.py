"""The state of :mod:`strategies.solvers.pqn`'s federated proximal quasi-Newton method: each site's
kept point, loss, gradient and curvature model, the line search's step, the inner solver's
warm start; what a round returns (:class:`Step`).  Saved whole by checkpoints
(:meth:`QuasiNewtonState.arrays`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from .modelsolve import ModelSolution

#: Curvature models: BFGS (any smooth loss), secant (quadratic losses, matrix blocks), or
#: exact (the sites send their Hessians).
MODELS = ("bfgs", "secant", "exact")


@dataclass
class QuasiNewtonState:
    """The server's whole state; saved whole by checkpoints (:meth:`arrays`)."""

    x: np.ndarray  # (Z, p) accepted point
    value: np.ndarray  # (Z,) f_z(x_z)
    grad: np.ndarray  # (Z, p)
    hess: np.ndarray  # (Z, p, p) BFGS matrices
    paired: np.ndarray = field(metadata={"dtype": bool})  # (Z,): B_z has had its first pair
    trial: np.ndarray  # (Z, p) the point being evaluated
    direction: np.ndarray  # (Z, p)
    step: float = 1.0
    decrease: float = 0.0  # Delta < 0: the model's predicted change of F at step 1
    objective: float = np.inf  # F at the estimate (estimate_objective)
    evaluated: bool = False  # x has been evaluated (false before the first answers)
    frozen: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), metadata={"dtype": bool})
    round: int = 0
    inner: ModelSolution | None = None
    model: str = "bfgs"  # bfgs | secant (quadratic losses, matrix blocks) | exact (MODELS)
    curvature: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (Z,) B_z before pairs
    ss: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (Z, p, p) secant sums
    ys: np.ndarray = field(default_factory=lambda: np.zeros(0))
    min_rho: float = 0.0
    incremental: bool = False  # partial participation (module docstring)
    #: (Z,) answered once
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, bool), metadata={"dtype": bool})
    damping: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (Z,) mu_z
    first_damping: float = 0.0  # exact model: mu_z = first_damping tr(H_z)/p at first answer

    def copy(self) -> QuasiNewtonState:
        """A state that shares no array with this one: a round works on it, so the state
        it was given (a caller's, a checkpoint's) stays as it was."""
        own = {f.name: getattr(self, f.name).copy() for f in fields(self)
               if isinstance(getattr(self, f.name), np.ndarray)}  # fmt: skip
        return replace(self, **own)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every field as an array (a checkpoint's ``.npz`` entries), the inner solution's
        ``delta`` and ``u`` by split."""
        out = {f.name: np.asarray(getattr(self, f.name)) for f in fields(self) if f.name != "inner"}
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
        given = {}
        for f in fields(cls):
            if f.name == "inner":
                continue
            value = a[f.name] if f.name in a else _OLDER[f.name](a)
            if f.type == "np.ndarray":
                given[f.name] = np.asarray(value, f.metadata.get("dtype", float))
            else:
                given[f.name] = _SCALARS[f.type](value)
        return cls(inner=inner, **given)


_SCALARS = {"float": float, "bool": bool, "int": int, "str": str}

#: What a field absent from an older checkpoint was (they were added with partial
#: participation and the exact model's damping).
_OLDER = {
    "incremental": lambda a: False,
    "seen": lambda a: np.full(len(a["x"]), bool(a["evaluated"])),
    "damping": lambda a: np.zeros(len(a["x"])),
    "first_damping": lambda a: 0.0,
}


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
    return QuasiNewtonState(
        model=model,
        curvature=c.copy(),
        ss=np.zeros((n_sites, p, p) if model == "secant" else 0),  # the secant model's sums
        ys=np.zeros((n_sites, p, p) if model == "secant" else 0),
        min_rho=float(min_rho),
        incremental=bool(incremental),
        seen=np.zeros(n_sites, bool),
        damping=np.zeros(n_sites),
        first_damping=float(first_damping),
        x=x0.copy(),
        value=np.zeros(n_sites),
        grad=np.zeros_like(x0),
        hess=c[:, None, None] * np.eye(p)[None],
        paired=np.zeros(n_sites, bool),
        trial=x0.copy(),
        direction=np.zeros_like(x0),
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


def set_curvature(st: QuasiNewtonState, z: int, c: float) -> None:
    """``B_z = c I`` (and the secant model's bound ``c``) before site ``z``'s first pair.

    Parameters
    ----------
    st : QuasiNewtonState
        The state, changed in place.
    z : int
        The site.
    c : float
        The curvature, floored at 1e-8.
    """
    c = max(float(c), 1e-8)
    st.curvature[z] = c
    st.hess[z] = c * np.eye(st.x.shape[1])
