"""Folds within a site (docs/methods.md 3.4): light on imports, as a site's ClientApp
needs them for a federated tuning (:mod:`strategies.server.batch`)."""

from __future__ import annotations

import zlib

import numpy as np


def stratified_folds(y: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Fold index (``0 .. k-1``) per row of a binary outcome: each class shuffled and dealt
    round-robin, the negatives continuing where the positives stopped (so fold sizes differ
    by at most 1 and each class is spread as evenly as its count allows).

    Parameters
    ----------
    y : ndarray, shape (n,)
        The binary outcome (1 positive, 0 negative).
    k : int
        The number of folds.
    rng : numpy.random.Generator
        The stream the shuffles are drawn from.

    Returns
    -------
    ndarray of int64, shape (n,)
        Each row's fold.
    """
    fold = np.empty(len(y), dtype=np.int64)
    offset = 0
    for cls in (1, 0):
        idx = rng.permutation(np.flatnonzero(np.asarray(y) == cls))
        fold[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)
    return fold


def row_folds(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Fold index per row: the rows shuffled and dealt round-robin (sizes differ by <= 1).

    Parameters
    ----------
    n : int
        The number of rows.
    k : int
        The number of folds.
    rng : numpy.random.Generator
        The stream the shuffle is drawn from.

    Returns
    -------
    ndarray of int64, shape (n,)
        Each row's fold.
    """
    fold = np.empty(n, dtype=np.int64)
    fold[rng.permutation(n)] = np.arange(n) % k
    return fold


def site_folds(
    y: np.ndarray, k: int, seed: int, repeat: int, site: str, stratified: bool
) -> np.ndarray:
    """A site's own folds (a federated tuning: each site draws them from its own rows):
    :func:`stratified_folds` of a binary ``y`` or :func:`row_folds` of its ``len(y)`` rows,
    from a stream of ``(seed, repeat, site)`` alone, so they do not depend on which other
    sites take part nor on the engine.

    Parameters
    ----------
    y : ndarray, shape (n,)
        The site's outcome (its length is the number of rows).
    k : int
        The number of folds.
    seed, repeat : int
        The fold seed and the repeat of the cross-validation; with ``site``, they seed the
        stream.
    site : str
        The site's name.
    stratified : bool
        Stratify by the binary ``y`` (:func:`stratified_folds`) rather than deal the rows
        alone (:func:`row_folds`).

    Returns
    -------
    ndarray of int64, shape (n,)
        Each row's fold.
    """
    rng = np.random.default_rng([int(seed), int(repeat), zlib.crc32(str(site).encode()), 3])
    if stratified:
        return stratified_folds(y, k, rng)
    return row_folds(len(y), k, rng)


__all__ = ["row_folds", "site_folds", "stratified_folds"]
