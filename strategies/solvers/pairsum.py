"""Pair sums of GrAUC-PFL's surrogate in time linear in a site's rows (Flower-free).

The pairwise surrogate depends on the ``n x m`` pairs (positive ``i``, negative ``j``) only
through the score differences ``t_ij = s+_i - s-_j``, so every quantity it needs is a
one-dimensional kernel sum

    ``F_i = sum_j K(s+_i - s-_j) w_j``   (at the positives)   or
    ``G_j = sum_i K(s+_i - s-_j) w_i``   (at the negatives),

with a scalar or a ``p``-vector weight per row and ``K`` one of three smooth kernels
(:data:`KERNELS`).  :class:`ScoreGrid` computes them by *grid summation*: each score is
spread onto a uniform grid of spacing ``h`` by local Lagrange interpolation on ``q`` nodes,
the grid masses are convolved with the kernel sampled at the grid's offsets (FFT, or a dense
Toeplitz product on a small grid), and the result is interpolated back to the scores.  Cost
``O((n + m) q k + G log G k)`` for ``k`` weight columns and ``G`` grid nodes, against
``O(n m k)`` for the pair loop.

Accuracy (docs/methods.md 1.11).  The kernels are analytic in the strip ``|Im t| < pi``, so
the interpolation error falls geometrically with ``q`` at a fixed ``h``; the defaults
(:data:`SPACING`, :data:`NODES`) are chosen by measurement for an error near ``1e-13``
of a kernel sum's scale against the pair loop.  The error is absolute at that scale (the
FFT's rounding is about ``1e-16`` of pairs times the kernel's peak): a sum that is itself
tiny (every pair far into the kernel's flat tail) is not resolved relative to itself.

Far-apart scores cost nothing extra: every kernel is constant, to below ``1e-20``, beyond
``|t| >= GAP``, so a gap wider than ``GAP`` between neighbouring scores is shortened to
``GAP`` before the grid is laid, which bounds the grid by the scores' clumps rather than
their range.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.fft
import scipy.linalg
import scipy.sparse
from scipy.special import expit

#: Grid spacing ``h`` on the score scale (the kernels' own scale is 1).
SPACING = 0.04
#: Lagrange nodes ``q`` per score (an even number; the interpolant's degree is ``q - 1``).
NODES = 8
#: A gap between neighbouring scores wider than this is shortened to it (every kernel is
#: flat there to below 1e-20).
GAP = 60.0
#: Scores spanning fewer than this many grid nodes are laid as they are (no sort for
#: :func:`compressed`).
COMPRESS_NODES = 1 << 16
#: Grids up to this many nodes convolve by a dense Toeplitz product; larger ones by FFT.
DENSE_NODES = 512
#: The largest grid laid; beyond it (scores spread over ``~GRID_MAX * h`` with no gap to
#: shorten) :func:`score_grid` says no and the caller sums the pairs.
GRID_MAX = 1 << 22


def _sigmoid_neg(t: np.ndarray) -> np.ndarray:
    """``sigma(-t)``: the weight of a pair in the surrogate's gradient."""
    return expit(-t)


def _curvature(t: np.ndarray) -> np.ndarray:
    """``sigma(t) sigma(-t)``: the weight of a pair in the surrogate's Hessian."""
    a = np.abs(t)
    e = np.exp(-a)
    return e / (1.0 + e) ** 2


def _value_rest(t: np.ndarray) -> np.ndarray:
    """``log(1 + e^{-t}) + t sigma(-t)``, even in ``t`` and flat (to 0) far from 0: the
    surrogate's value is the sum of this kernel minus ``sum_ij t_ij sigma(-t_ij)``, which the
    gradient's sums give for free (:meth:`ScoreGrid.value_from`)."""
    a = np.abs(t)
    return np.log1p(np.exp(-a)) + a * expit(-a)


#: The kernels by name.
KERNELS = {"sigmoid": _sigmoid_neg, "curvature": _curvature, "value": _value_rest}


def _lagrange(y: np.ndarray, q: int) -> np.ndarray:
    """Weights ``L_k(y) = prod_{l != k} (y - l) / (k - l)``, ``k = 0..q-1``, for each ``y``,
    shape ``(q, N)``, by prefix and suffix products (no division by ``y - k``)."""
    out = np.empty((q, y.size))
    out[0] = 1.0
    d = np.empty_like(y)
    for k in range(1, q):  # prefix products prod_{l < k} (y - l)
        np.subtract(y, k - 1, out=d)
        np.multiply(out[k - 1], d, out=out[k])
    suffix = np.ones_like(y)
    for k in range(q - 1, -1, -1):  # times prod_{l > k} (y - l) / prod_{l != k} (k - l)
        denom = math.factorial(k) * math.factorial(q - 1 - k) * (-1.0) ** (q - 1 - k)
        np.multiply(out[k], suffix, out=out[k])
        out[k] /= denom
        if k:
            np.subtract(y, k, out=d)
            suffix *= d
    return out


def compressed(scores: np.ndarray, gap: float = GAP) -> np.ndarray:
    """The scores with every gap between sorted neighbours wider than ``gap`` shortened to
    ``gap``.  Differences below ``gap`` are kept exactly; those at or above it stay at or
    above it, where every kernel is flat.

    Parameters
    ----------
    scores : ndarray, shape (N,)
        The scores.
    gap : float, optional
        The widest gap kept.

    Returns
    -------
    ndarray, shape (N,)
        The shortened scores, in the order of ``scores``; the smallest is at 0.
    """
    order = np.argsort(scores, kind="stable")
    sorted_ = scores[order]
    steps = np.minimum(np.diff(sorted_), gap)
    out = np.empty_like(scores)
    out[order] = np.concatenate([[0.0], np.cumsum(steps)])
    return out


class GridTooLarge(ValueError):
    """The scores would need more than :data:`GRID_MAX` grid nodes."""


def score_grid(s_pos: np.ndarray, s_neg: np.ndarray) -> ScoreGrid | None:
    """The :class:`ScoreGrid` of these scores at the default spacing and nodes, or None when
    it would exceed :data:`GRID_MAX` nodes (then sum the pairs).

    Parameters
    ----------
    s_pos, s_neg : ndarray
        The scores of the positives and of the negatives.

    Returns
    -------
    ScoreGrid or None
        The grid; ``None`` also when a score is not finite.
    """
    if not (np.all(np.isfinite(s_pos)) and np.all(np.isfinite(s_neg))):
        return None  # the pair loop carries a non-finite score through as it is
    try:
        return ScoreGrid(s_pos, s_neg)
    except GridTooLarge:
        return None


class ScoreGrid:
    """Both classes' scores on one uniform grid: kernel sums over all pairs in linear time.

    Parameters
    ----------
    s_pos, s_neg : ndarray
        The scores of the positives (``n``) and the negatives (``m``).
    spacing : float
        Grid spacing ``h``.
    nodes : int
        Lagrange nodes ``q`` per score (even).

    Notes
    -----
    With ``P+`` (``n x G``) and ``P-`` (``m x G``) the sparse interpolation matrices
    (``q`` non-zeros a row) and ``T_ab = K((a - b) h)`` the kernel's Toeplitz matrix on the
    grid, ``sum_j K(s+_i - s-_j) w_j ~ (P+ T P-^T w)_i``; at the negatives it is
    ``P- T^T P+^T w``.  A total ``sum_ij K(t_ij) u_i^T v_j`` needs no interpolation back:
    ``(P+^T u)^T T (P-^T v)``.
    """

    def __init__(
        self,
        s_pos: np.ndarray,
        s_neg: np.ndarray,
        spacing: float = SPACING,
        nodes: int = NODES,
    ) -> None:
        s_pos = np.asarray(s_pos, dtype=float)
        s_neg = np.asarray(s_neg, dtype=float)
        if nodes % 2:
            raise ValueError(f"nodes: must be even, got {nodes}")
        self.n, self.m = s_pos.size, s_neg.size
        self.h = float(spacing)
        self.q = int(nodes)
        u = np.concatenate([s_pos, s_neg])
        if u.size:
            u = u - u.min()
            if float(u.max()) / self.h > COMPRESS_NODES:
                u = compressed(u)
        if u.size and float(u.max()) / self.h + 2 * self.q > GRID_MAX:
            raise GridTooLarge(f"scores span {float(u.max()):.3g} without gaps to shorten")
        # grid coordinate z = u / h + offset, so that every score's q nodes lie inside
        z = u / self.h + (self.q // 2 - 1)
        base = np.floor(z).astype(np.int64)
        frac = z - base
        self.size = int(base.max()) + self.q if u.size else self.q
        start = (base - (self.q // 2 - 1)).astype(np.int32)
        weights = _lagrange(frac + (self.q // 2 - 1), self.q).T
        cols = start[:, None] + np.arange(self.q, dtype=np.int32)[None, :]
        self._pos = self._matrix(weights[: self.n], cols[: self.n])
        self._neg = self._matrix(weights[self.n :], cols[self.n :])
        self._fft_len = scipy.fft.next_fast_len(2 * self.size - 1, real=True)
        # per (kernel, reverse): the dense Toeplitz matrix, or the FFT of its circulant
        self._spectra: dict[tuple[str, bool], np.ndarray] = {}
        self._unit: dict[str, np.ndarray] = {}

    def _matrix(self, weights: np.ndarray, cols: np.ndarray) -> scipy.sparse.csr_matrix:
        rows = weights.shape[0]
        indptr = np.arange(0, rows * self.q + 1, self.q, dtype=np.int64)
        return scipy.sparse.csr_matrix(
            (weights.ravel(), cols.ravel(), indptr), shape=(rows, self.size)
        )

    # -- the grid convolution ------------------------------------------------------------
    def _samples(self, kernel: str, reverse: bool) -> np.ndarray:
        """``K(d h)`` for ``d = -(G-1) .. G-1`` (``K(-d h)`` when ``reverse``)."""
        d = np.arange(-(self.size - 1), self.size, dtype=float) * self.h
        return KERNELS[kernel](-d if reverse else d)

    def _convolve(self, kernel: str, mass: np.ndarray, reverse: bool = False) -> np.ndarray:
        """``F_a = sum_b K((a - b) h) M_b`` (``K((b - a) h)`` when ``reverse``) on the grid;
        ``mass`` has shape ``(G,)`` or ``(G, k)``."""
        g = self.size
        key = (kernel, reverse)
        if g <= DENSE_NODES:  # the Toeplitz matrix, built once per kernel and direction
            toe = self._spectra.get(key)
            if toe is None:
                k = self._samples(kernel, reverse)
                toe = self._spectra[key] = scipy.linalg.toeplitz(k[g - 1 :], k[g - 1 :: -1])
            return toe @ mass
        spec = self._spectra.get(key)
        if spec is None:
            k = self._samples(kernel, reverse)
            circ = np.zeros(self._fft_len)
            circ[:g] = k[g - 1 :]
            circ[self._fft_len - (g - 1) :] = k[: g - 1]
            spec = scipy.fft.rfft(circ)
            self._spectra[key] = spec
        fm = scipy.fft.rfft(mass, n=self._fft_len, axis=0)
        if mass.ndim == 2:
            fm *= spec[:, None]
        else:
            fm *= spec
        return scipy.fft.irfft(fm, n=self._fft_len, axis=0)[:g]

    def _mass(self, side: str, w: np.ndarray | None) -> np.ndarray:
        """``P^T w`` of one class (``side`` "pos" or "neg"); unit weights spread once."""
        matrix = self._pos if side == "pos" else self._neg
        if w is not None:
            return matrix.T @ w
        if side not in self._unit:
            self._unit[side] = matrix.T @ np.ones(matrix.shape[0])
        return self._unit[side]

    # -- the sums ------------------------------------------------------------------------
    def at_pos(self, kernel: str, w_neg: np.ndarray | None = None) -> np.ndarray:
        """``sum_j K(s+_i - s-_j) w_j`` for each positive ``i``.

        Parameters
        ----------
        kernel : {"sigmoid", "curvature", "value"}
            The kernel ``K`` (:data:`KERNELS`).
        w_neg : ndarray, shape (m,) or (m, k), optional
            The negatives' weights; ``None``: ``w = 1``.

        Returns
        -------
        ndarray, shape (n,) or (n, k)
            The sum at each positive.
        """
        return self._pos @ self._convolve(kernel, self._mass("neg", w_neg))

    def at_neg(self, kernel: str, w_pos: np.ndarray | None = None) -> np.ndarray:
        """``sum_i K(s+_i - s-_j) w_i`` for each negative ``j``.

        Parameters
        ----------
        kernel : {"sigmoid", "curvature", "value"}
            The kernel ``K`` (:data:`KERNELS`).
        w_pos : ndarray, shape (n,) or (n, k), optional
            The positives' weights; ``None``: ``w = 1``.

        Returns
        -------
        ndarray, shape (m,) or (m, k)
            The sum at each negative.
        """
        return self._neg @ self._convolve(kernel, self._mass("pos", w_pos), reverse=True)

    def total(
        self, kernel: str, u_pos: np.ndarray | None = None, v_neg: np.ndarray | None = None
    ) -> np.ndarray | float:
        """``sum_ij K(t_ij) u_i v_j^T`` over all pairs.

        Parameters
        ----------
        kernel : {"sigmoid", "curvature", "value"}
            The kernel ``K`` (:data:`KERNELS`).
        u_pos : ndarray, shape (n,) or (n, k), optional
            The positives' weights; ``None``: unit weights.
        v_neg : ndarray, shape (m,) or (m, l), optional
            The negatives' weights; ``None``: unit weights.

        Returns
        -------
        float or ndarray, shape (k, l)
            A number for scalar weights, a ``k x l`` matrix for ``(n, k)`` and ``(m, l)``
            weights.
        """
        left = self._mass("pos", u_pos)
        right = self._mass("neg", v_neg)
        out = left.T @ self._convolve(kernel, right)
        return float(out) if np.ndim(out) == 0 else out
