"""RowFed on Flower (see README.md)."""

import strategies  # noqa: F401  (first: single-threaded BLAS before numpy loads)
