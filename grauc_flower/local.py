"""The individual (local-only) fit of an institution (Flower-free).

The ADMM local step of both methods is :func:`strategies.local.admm_update`; the AUC
surrogate's own exact step is :meth:`grauc_flower.auc.PairwiseLogistic.prox`.
"""

from __future__ import annotations

import numpy as np

from .auc import PairwiseLogistic, newton_minimize


def local_fit(f: PairwiseLogistic, x0: np.ndarray | None = None) -> np.ndarray:
    """``argmin_b f(b)``: the individual (local-only) fit."""
    p = f.x_pos.shape[1]
    start = np.zeros(p) if x0 is None else x0
    return newton_minimize(f, start)[0]
