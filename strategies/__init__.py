"""Flower strategies, ADMM and quasi-Newton server steps shared by GrAUC-PFL and RowFed.

Importing the package sets ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` to 1 unless they are set (:func:`single_threaded_blas`): every matrix
here is small (p x p, a few thousand unknowns at most), and a multi-threaded BLAS competing
with Flower's and Ray's processes for the same cores ran 100x slower on a loaded 2-core
machine (a 200 x 200 by 200 x 20 product: 8 ms instead of 60 us).  It acts only when the
variable is read, i.e. before numpy is first imported, and is inherited by the Flower
processes this project starts.
"""

import contextlib
import os

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_blas(env=os.environ) -> None:
    for name in BLAS_THREAD_VARIABLES:
        env.setdefault(name, "1")


def quiet_flower() -> None:
    """Flower's own log at WARNING and above (its INFO lines per message and round are
    noise in a command's output, a study's workers and the tuning's pool); for a block
    only: :func:`flower_quieted`."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)


@contextlib.contextmanager
def flower_quieted(log_filter=None):
    """Inside the block, Flower's log at WARNING and above (and through ``log_filter``, a
    :class:`logging.Filter`, when given); its level and filters as they were after it."""
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    level = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(max(level, logging.WARNING))
    if log_filter is not None:
        FLOWER_LOGGER.addFilter(log_filter)
    try:
        yield
    finally:
        if log_filter is not None:
            FLOWER_LOGGER.removeFilter(log_filter)
        FLOWER_LOGGER.setLevel(level)


single_threaded_blas()
