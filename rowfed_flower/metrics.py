"""RowFed's evaluation metrics and GIC tuning criterion (docs/methods.md 2.7; Flower-free).

Estimated variable-level clusters are read from the fusion split's ``delta`` (exact zeros),
never from ``Theta`` (whose fused rows agree only up to the ADMM tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mse_est(theta_hat: np.ndarray, theta_true: np.ndarray) -> float:
    """Estimation error ``(1/(M p q)) sum_m ||Theta_hat_m - Theta*_m||_F^2`` (docs/methods.md 2.7).

    Parameters
    ----------
    theta_hat : ndarray, shape (M, p, q)
        The estimate.
    theta_true : ndarray, shape (M, p, q)
        The truth ``Theta*``.

    Returns
    -------
    float
    """
    theta_hat = np.asarray(theta_hat, dtype=float)
    theta_true = np.asarray(theta_true, dtype=float)
    if theta_hat.shape != theta_true.shape:
        raise ValueError(f"theta_hat: shape {theta_hat.shape} != {theta_true.shape}")
    return float(np.mean((theta_hat - theta_true) ** 2))


def mse_pred(
    theta_hat: np.ndarray, x_test: Sequence[np.ndarray], y_test: Sequence[np.ndarray]
) -> float:
    """Prediction error ``(1/M) sum_m ||Y_m - X_m Theta_hat_m||_F^2 / (n_m q)`` (§2.7).

    Parameters
    ----------
    theta_hat : ndarray, shape (M, p, q)
        The estimate.
    x_test : sequence of ndarray
        ``x_test[m]`` of shape ``(n_m, p)``.
    y_test : sequence of ndarray
        ``y_test[m]`` of shape ``(n_m, q)``.

    Returns
    -------
    float
    """
    errs = []
    for t, x, y in zip(theta_hat, x_test, y_test, strict=True):
        y = np.asarray(y, dtype=float).reshape(len(x), -1)
        errs.append(np.mean((y - np.asarray(x) @ t) ** 2))
    return float(np.mean(errs))


def rand_index(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Rand index of two partitions of the same items.

    Parameters
    ----------
    labels_a, labels_b : ndarray
        Each item's label in either partition (the same shape; flattened).

    Returns
    -------
    float

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
    """RI of §2.7: the Rand index of the client partitions of each row ``j``, averaged over
    rows.

    Parameters
    ----------
    partitions_true, partitions_est : ndarray, shape (M, p)
        Column ``j``: the cluster labels of the clients.

    Returns
    -------
    float
    """
    t = np.asarray(partitions_true)
    e = np.asarray(partitions_est)
    if t.shape != e.shape or t.ndim != 2:
        raise ValueError(f"partitions: need equal (M, p) shapes, got {t.shape}, {e.shape}")
    return float(np.mean([rand_index(t[:, j], e[:, j]) for j in range(t.shape[1])]))
