"""RowFed's evaluation metrics and GIC tuning criterion (METHODS.md B.4, B.6; Flower-free).

Estimated variable-level clusters are read from the fusion split's ``delta`` (exact zeros),
never from ``Theta`` (whose fused rows agree only up to the ADMM tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.admm import fused_groups


def mse_est(theta_hat: np.ndarray, theta_true: np.ndarray) -> float:
    """Estimation error ``(1/(M p q)) sum_m ||Theta_hat_m - Theta*_m||_F^2`` (B.6).

    ``theta_hat``, ``theta_true`` of shape ``(M, p, q)``.
    """
    theta_hat = np.asarray(theta_hat, dtype=float)
    theta_true = np.asarray(theta_true, dtype=float)
    if theta_hat.shape != theta_true.shape:
        raise ValueError(f"theta_hat: shape {theta_hat.shape} != {theta_true.shape}")
    return float(np.mean((theta_hat - theta_true) ** 2))


def mse_pred(
    theta_hat: np.ndarray, x_test: Sequence[np.ndarray], y_test: Sequence[np.ndarray]
) -> float:
    """Prediction error ``(1/M) sum_m ||Y_m - X_m Theta_hat_m||_F^2 / (n_m q)`` (B.6).

    ``x_test[m]`` of shape ``(n_m, p)``, ``y_test[m]`` of shape ``(n_m, q)``.
    """
    errs = []
    for t, x, y in zip(theta_hat, x_test, y_test, strict=True):
        y = np.asarray(y, dtype=float).reshape(len(x), -1)
        errs.append(np.mean((y - np.asarray(x) @ t) ** 2))
    return float(np.mean(errs))


def rand_index(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Rand index of two partitions of the same items.

    Notes
    -----
    ``RI = (TP + TN) / C(M, 2)``: the share of item pairs on which the partitions agree
    (both together or both apart).  With fewer than two items ``RI = 1``.
    """
    a = np.asarray(labels_a).reshape(-1)
    b = np.asarray(labels_b).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"labels_b: shape {b.shape} != {a.shape}")
    if a.size < 2:
        return 1.0
    u, v = np.triu_indices(a.size, k=1)
    return float(np.mean((a[u] == a[v]) == (b[u] == b[v])))


def mean_rand_index(partitions_true: np.ndarray, partitions_est: np.ndarray) -> float:
    """RI of B.6: the Rand index of the client partitions of each row ``j``, averaged over
    rows.  Both arrays of shape ``(M, p)`` (column ``j``: cluster labels of the clients)."""
    t = np.asarray(partitions_true)
    e = np.asarray(partitions_est)
    if t.shape != e.shape or t.ndim != 2:
        raise ValueError(f"partitions: need equal (M, p) shapes, got {t.shape}, {e.shape}")
    return float(np.mean([rand_index(t[:, j], e[:, j]) for j in range(t.shape[1])]))


def row_clusters(edges: np.ndarray, delta: np.ndarray, n_sites: int) -> np.ndarray:
    """Variable-level clusters, shape ``(M, p)``, from the fusion split's ``delta``.

    Parameters
    ----------
    edges : ndarray, shape (n_edges, 2)
    delta : ndarray, shape (n_edges, p, q)
        ``delta_e(j)`` estimates ``theta_u(j) - theta_v(j)`` for ``e = (u, v)``.
    n_sites : int

    Notes
    -----
    Clients ``m, m'`` share row ``j`` when ``delta_mm'(j) = 0`` (B.3), closed transitively
    along paths of the graph (:func:`strategies.admm.fused_groups`).  Labels are numbered by
    first appearance in client order.
    """
    delta = np.asarray(delta, dtype=float)
    row_norm = np.sqrt(np.sum(delta * delta, axis=-1))  # (n_edges, p); 0 iff whole row is 0
    return fused_groups(edges, row_norm, n_sites)


def degrees_of_freedom(labels: np.ndarray, support: np.ndarray) -> int:
    """GIC's ``df = sum_j sum_{clusters c of row j} nnz(cluster row vector)`` (B.4).

    Parameters
    ----------
    labels : ndarray, shape (M, p)
        Cluster labels per row (:func:`row_clusters`).
    support : ndarray of bool, shape (M, p, q)
        Non-zero pattern of the estimate (e.g. the sparsity split's ``delta != 0``).

    Notes
    -----
    A cluster's row vector counts entry ``k`` as non-zero when any member has it non-zero
    **[choice]** (members agree at convergence; the union is the conservative count).
    """
    labels = np.asarray(labels)
    support = np.asarray(support, dtype=bool)
    m, p = labels.shape
    if support.shape[:2] != (m, p):
        raise ValueError(f"support: need shape ({m}, {p}, q), got {support.shape}")
    df = 0
    for j in range(p):
        for c in np.unique(labels[:, j]):
            df += int(np.any(support[labels[:, j] == c, j, :], axis=0).sum())
    return df


def gic(rss: float, n_total: int, p: int, q: int, n_sites: int, df: int) -> float:
    """Generalized information criterion (B.4; Fan & Tang 2013).

    Notes
    -----
    ``GIC = log(RSS / (N q)) + log(log N) log(p q M) df / N`` with ``RSS = sum_m
    ||Y_m - X_m Theta_hat_m||_F^2`` (each client uploads its own) and ``N = sum_m n_m``.
    """
    if not n_total > 1:
        raise ValueError(f"n_total: GIC needs N > 1 (log log N), got {n_total}")
    return float(
        np.log(rss / (n_total * q))
        + np.log(np.log(n_total)) * np.log(p * q * n_sites) / n_total * df
    )
