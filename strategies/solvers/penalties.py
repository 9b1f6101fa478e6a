"""Penalties and their ADMM thresholds (proximal maps).

A penalty is applied either entrywise or to groups (the last axis of an array).  Every group
threshold is the scalar rule applied to the group's Euclidean norm, times the group's
direction, with a guard at norm zero (ADMM differences start at exactly zero).

The ADMM code never branches on the penalty's name: it calls :meth:`Penalty.threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError

KINDS = ("lasso", "mcp", "scad")
DEFAULT_CONCAVITY = {"lasso": np.inf, "mcp": 3.0, "scad": 3.7}


def soft_threshold(x: np.ndarray, a: np.ndarray | float) -> np.ndarray:
    """Elementwise soft-threshold ``S(x, a) = sign(x) (|x| - a)_+``.

    Parameters
    ----------
    x : ndarray
        The values.
    a : ndarray or float
        The threshold, broadcast against ``x``.

    Returns
    -------
    ndarray
        ``S(x, a)``.
    """
    return np.sign(x) * np.maximum(np.abs(x) - a, 0.0)


def group_norms(x: np.ndarray, group: bool) -> np.ndarray:
    """``|x|`` entrywise, or the norm of each group along the last axis (kept as size 1).

    Parameters
    ----------
    x : ndarray
        The values.
    group : bool
        Norms of groups along the last axis rather than entrywise.

    Returns
    -------
    ndarray
        Shaped as ``x``, or with the last axis of size 1 for groups.
    """
    return np.sqrt(np.sum(x * x, axis=-1, keepdims=True)) if group else np.abs(x)


def _apply_rule(x: np.ndarray, new_norm: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """Return ``x * new_norm / norm`` with ``0`` where ``norm == 0`` (the zero-norm guard)."""
    safe = np.where(norm > 0.0, norm, 1.0)
    return np.where(norm > 0.0, x * (new_norm / safe), 0.0)


@dataclass(frozen=True)
class Penalty:
    """A sparsity-inducing penalty ``P_lam(r)`` of a norm ``r >= 0``.

    Parameters
    ----------
    kind : {"lasso", "mcp", "scad"}
    concavity : float
        MCP's or SCAD's concavity ``iota`` (ignored for the lasso).

    Notes
    -----
    Values (Fan & Li 2001; Zhang 2010)::

        lasso  P(r) = lam r
        MCP    P(r) = lam r - r^2 / (2 iota)      for r <= iota lam,  iota lam^2 / 2 beyond
        SCAD   P(r) = lam r                        for r <= lam
                      (2 iota lam r - r^2 - lam^2) / (2 (iota - 1))   for lam < r <= iota lam
                      lam^2 (iota + 1) / 2          beyond

    Thresholds ``argmin_x (rho/2)||x - v||^2 + P_lam(||x||)`` (docs/methods.md 2.3; the
    PerFL-RSR template), with ``S(v, a) = (1 - a/||v||)_+ v``::

        lasso  S(v, lam/rho)
        MCP    S(v, lam/rho) / (1 - 1/(iota rho))                 if ||v|| <= iota lam, else v
        SCAD   S(v, lam/rho)                                       if ||v|| <= lam (1 + 1/rho)
               S(v, iota lam/((iota-1) rho)) / (1 - 1/((iota-1) rho))   if ||v|| <= iota lam
               v                                                   otherwise

    MCP needs ``iota > 1/rho`` and SCAD ``iota > 1 + 1/rho`` for the threshold to be the
    unique minimizer (see :meth:`check_rho`).
    """

    kind: str = "lasso"
    concavity: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"penalty: must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.concavity is None:
            object.__setattr__(self, "concavity", float(DEFAULT_CONCAVITY[self.kind]))
        iota = float(self.concavity)
        if self.kind == "mcp" and not iota > 0:
            raise ValueError(f"concavity: MCP needs concavity > 0, got {iota}")
        if self.kind == "scad" and not iota > 1:
            raise ValueError(f"concavity: SCAD needs concavity > 1, got {iota}")

    @property
    def convex(self) -> bool:
        return self.kind == "lasso"

    def check_rho(self, rho: float) -> None:
        """Raise :class:`InputError` (a ``ValueError``) naming ``concavity`` when it is too
        small for this ``rho`` (the thresholds of docs/methods.md 2.3 are then not unique)."""
        iota = float(self.concavity)
        if self.kind == "mcp" and not iota > 1.0 / rho:
            raise InputError(
                f"concavity: MCP needs concavity > 1/rho = {1.0 / rho:g}, got {iota:g}"
            )
        if self.kind == "scad" and not iota > 1.0 + 1.0 / rho:
            raise InputError(
                f"concavity: SCAD needs concavity > 1 + 1/rho = {1.0 + 1.0 / rho:g}, got {iota:g}"
            )

    # -- scalar rules on norms ------------------------------------------------------------
    def value_of_norm(self, r: np.ndarray, lam: np.ndarray | float) -> np.ndarray:
        """Penalty ``P_lam(r)`` for norms ``r >= 0``.

        Parameters
        ----------
        r : ndarray
            The norms.
        lam : ndarray or float
            The level, broadcast against ``r``.

        Returns
        -------
        ndarray
            ``P_lam(r)``.
        """
        r = np.asarray(r, dtype=float)
        lam = np.asarray(lam, dtype=float)
        iota = float(self.concavity)
        if self.kind == "lasso" or not np.isfinite(iota):
            return lam * r
        if self.kind == "mcp":
            return np.where(r <= iota * lam, lam * r - r * r / (2 * iota), iota * lam**2 / 2)
        mid = (2 * iota * lam * r - r * r - lam**2) / (2 * (iota - 1))
        return np.where(r <= lam, lam * r, np.where(r <= iota * lam, mid, lam**2 * (iota + 1) / 2))

    def derivative_of_norm(self, r: np.ndarray, lam: np.ndarray | float) -> np.ndarray:
        """``P_lam'(r)`` for norms ``r >= 0`` (the right derivative at 0: ``lam``): the
        weights of the local linear approximation (Zou & Li 2008, "One-step sparse estimates
        in nonconcave penalized likelihood models", Ann. Statist. 36(4)).

            lasso  lam
            MCP    max(lam - r / iota, 0)
            SCAD   lam for r <= lam;  (iota lam - r) / (iota - 1) for lam < r <= iota lam;  0

        Parameters
        ----------
        r : ndarray
            The norms.
        lam : ndarray or float
            The level, broadcast against ``r``.

        Returns
        -------
        ndarray
            ``P_lam'(r)``, of the broadcast shape.
        """
        r = np.asarray(r, dtype=float)
        lam = np.asarray(lam, dtype=float)
        iota = float(self.concavity)
        if self.kind == "lasso" or not np.isfinite(iota):
            return np.broadcast_to(lam, np.broadcast_shapes(r.shape, lam.shape)).copy()
        if self.kind == "mcp":
            return np.maximum(lam - r / iota, 0.0)
        return np.where(r <= lam, lam, np.maximum(iota * lam - r, 0.0) / (iota - 1.0))

    def threshold_norm(self, r: np.ndarray, lam: np.ndarray | float, rho: float) -> np.ndarray:
        """The new norm ``argmin_{s>=0} (rho/2)(s - r)^2 + P_lam(s)`` for norms ``r``.

        Parameters
        ----------
        r : ndarray
            The norms.
        lam : ndarray or float
            The level, broadcast against ``r``.
        rho : float
            The ADMM penalty.

        Returns
        -------
        ndarray
            The thresholded norms.
        """
        r = np.asarray(r, dtype=float)
        lam = np.asarray(lam, dtype=float)
        iota = float(self.concavity)
        soft = np.maximum(r - lam / rho, 0.0)
        if self.kind == "lasso" or not np.isfinite(iota):
            return soft
        if self.kind == "mcp":
            return np.where(r <= iota * lam, soft / (1.0 - 1.0 / (iota * rho)), r)
        inner = np.maximum(r - iota * lam / ((iota - 1.0) * rho), 0.0) / (
            1.0 - 1.0 / ((iota - 1.0) * rho)
        )
        return np.where(r <= lam * (1.0 + 1.0 / rho), soft, np.where(r <= iota * lam, inner, r))

    # -- arrays ---------------------------------------------------------------------------
    def value(self, x: np.ndarray, lam: np.ndarray | float, group: bool) -> float:
        """``sum P_lam(|x|)`` (entrywise) or ``sum over groups P_lam(||x_g||)``.

        Parameters
        ----------
        x : ndarray
            The values.
        lam : ndarray or float
            The level; broadcasts against the group norms, e.g. shape ``(n_groups, 1)`` for
            a per-group weight (``x`` of shape ``(n_groups, k)``).
        group : bool
            Groups along the last axis rather than entrywise.

        Returns
        -------
        float
            The penalty.
        """
        return float(np.sum(self.value_of_norm(group_norms(x, group), lam)))

    def threshold(
        self, x: np.ndarray, lam: np.ndarray | float, rho: float, group: bool
    ) -> np.ndarray:
        """Proximal map of ``(1/rho) P_lam`` applied entrywise or per group (last axis).

        Parameters
        ----------
        x : ndarray
            The values.
        lam : ndarray or float
            The level, broadcast against the group norms.
        rho : float
            The ADMM penalty.
        group : bool
            Groups along the last axis rather than entrywise.

        Returns
        -------
        ndarray
            The thresholded values, shaped as ``x``; 0 where the norm is 0.
        """
        norm = group_norms(x, group)
        return _apply_rule(x, self.threshold_norm(norm, lam, rho), norm)
