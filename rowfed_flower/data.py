"""RowFed data: the simulation of §2.8 (Flower-free; the real data: :mod:`rowfed_flower.realdata`,
the client graph: :mod:`rowfed_flower.graph`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.solvers.problems import canonical_labels

#: Row ``j < 6`` of the true ``Theta`` has ``N_CLUSTERS[j]`` client clusters (docs/methods.md 2.8).
N_CLUSTERS = (1, 1, 2, 2, 3, 3)
#: Entries of a cluster's row vector and their probabilities (about a third zero, §2.8).
ENTRY_VALUES = (-1.0, -0.5, 0.0, 0.5, 1.0)
ENTRY_PROBS = (1 / 6, 1 / 6, 1 / 3, 1 / 6, 1 / 6)


def ar1_covariance(d: int, r: float = 0.5) -> np.ndarray:
    """``Sigma_ij = r^|i - j|`` (``d x d``).

    Parameters
    ----------
    d : int
        The dimension.
    r : float, optional
        The correlation of neighbours.

    Returns
    -------
    ndarray, shape (d, d)
    """
    idx = np.arange(d)
    return r ** np.abs(idx[:, None] - idx[None, :])


@dataclass(frozen=True)
class SimulatedData:
    """Output of :func:`simulate`.

    ``x_train[m]`` ``(n_train, p)``, ``y_train[m]`` ``(n_train, q)`` (same for test),
    ``theta`` the true ``Theta*`` ``(M, p, q)``, ``partitions`` ``(M, p)``: the true cluster
    label of client ``m`` for row ``j`` (one cluster for zero rows).
    """

    x_train: list[np.ndarray]
    y_train: list[np.ndarray]
    x_test: list[np.ndarray]
    y_test: list[np.ndarray]
    theta: np.ndarray
    partitions: np.ndarray


def true_theta(
    n_sites: int,
    p: int,
    q: int,
    rng: np.random.Generator,
    n_clusters: Sequence[int] = N_CLUSTERS,
) -> tuple[np.ndarray, np.ndarray]:
    """True ``Theta*`` ``(M, p, q)`` and row partitions ``(M, p)`` of docs/methods.md 2.8.

    Parameters
    ----------
    n_sites : int
        ``M``, the clients.
    p, q : int
        The predictors and responses.
    rng : numpy.random.Generator
        Draws the clusters' vectors and the clients' assignments.
    n_clusters : sequence of int, optional
        ``K_j`` of the non-zero rows (see Notes); entries beyond ``p`` are ignored.

    Returns
    -------
    theta : ndarray, shape (M, p, q)
        ``Theta*``.
    partitions : ndarray of int, shape (M, p)
        Client ``m``'s cluster label for row ``j`` (one cluster for zero rows).

    Notes
    -----
    **[choice]** (the paper's design is lost): rows ``j < len(n_clusters)`` are non-zero,
    the rest zero.  Row ``j`` has ``K_j = n_clusters[j]`` clusters; each cluster's q-vector
    has i.i.d. entries from ``ENTRY_VALUES`` with probabilities ``ENTRY_PROBS``, redrawn
    until the ``K_j`` vectors are non-zero and distinct (so the true partition is the one
    drawn).  Clients are assigned to clusters by a fresh random permutation per row, cut
    into ``K_j`` near-equal parts (``K_j <= M`` clusters, none empty), independently across
    rows.
    """
    theta = np.zeros((n_sites, p, q))
    parts = np.zeros((n_sites, p), dtype=np.int64)
    for j, k in enumerate(n_clusters[:p]):
        k = min(int(k), n_sites)
        while True:
            vecs = rng.choice(ENTRY_VALUES, size=(k, q), p=ENTRY_PROBS)
            nonzero = np.all(np.any(vecs != 0, axis=1))
            distinct = len({tuple(v) for v in vecs}) == k
            if nonzero and distinct:
                break
        lab = np.empty(n_sites, dtype=np.int64)
        lab[rng.permutation(n_sites)] = np.arange(n_sites) % k
        lab = canonical_labels(lab)
        parts[:, j] = lab
        theta[:, j, :] = vecs[lab]
    return theta, parts


def simulate(
    n_sites: int,
    n_train: int,
    n_test: int,
    p: int,
    q: int,
    seed: int,
    corr: float = 0.5,
    noise: float = 1.0,
    n_clusters: Sequence[int] = N_CLUSTERS,
) -> SimulatedData:
    """The docs/methods.md 2.8 simulation: ``Y_m = X_m Theta*_m + E_m``.

    Parameters
    ----------
    n_sites : int
        ``M`` (paper: 10, 20, 50).
    n_train, n_test : int
        Samples per client.
    p, q : int
    seed : int
        ``numpy.random.default_rng(seed)`` drives everything.
    corr : float
        ``Sigma_x = (corr^|i-j|)`` (``p x p``) and ``Sigma_e = (corr^|i-j|)`` (``q x q``).
    noise : float
        ``E_m`` rows ``~ N(0, noise^2 Sigma_e)``.
    n_clusters : sequence of int
        ``K_j`` of the non-zero rows (see :func:`true_theta`).

    Returns
    -------
    SimulatedData
    """
    rng = np.random.default_rng(seed)
    theta, parts = true_theta(n_sites, p, q, rng, n_clusters)
    lx = np.linalg.cholesky(ar1_covariance(p, corr))
    le = np.linalg.cholesky(ar1_covariance(q, corr))
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("xtr", "ytr", "xte", "yte")}
    for m in range(n_sites):
        for n, kx, ky in ((n_train, "xtr", "ytr"), (n_test, "xte", "yte")):
            x = rng.standard_normal((n, p)) @ lx.T
            e = noise * rng.standard_normal((n, q)) @ le.T
            out[kx].append(x)
            out[ky].append(x @ theta[m] + e)
    return SimulatedData(out["xtr"], out["ytr"], out["xte"], out["yte"], theta, parts)
