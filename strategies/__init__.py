"""Flower strategies, ADMM and quasi-Newton server steps shared by GrAUC-PFL and RowFed.

Importing the package sets ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` to 1 unless they are set (:func:`single_threaded_blas`): every matrix
here is small (p x p, a few thousand unknowns at most), and a multi-threaded BLAS competing
with Flower's and Ray's processes for the same cores ran 100x slower on a loaded 2-core
machine (a 200 x 200 by 200 x 20 product: 8 ms instead of 60 us).  It acts only when the
variable is read, i.e. before numpy is first imported, and is inherited by the Flower
processes this project starts.
"""

import os

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_blas(env=os.environ) -> None:
    for name in BLAS_THREAD_VARIABLES:
        env.setdefault(name, "1")


def quiet_flower() -> None:
    """Flower's own log at WARNING and above (its INFO lines per message and round are
    noise in a command's output, a study's workers and the tuning's pool)."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)


single_threaded_blas()
