"""Safeguarded Anderson acceleration of a fixed-point iteration over tuples of arrays
(the inner ADMM of :mod:`strategies.solvers.modelsolve`; docs/methods.md 1.4 step 3), and its use
on an ADMM's governing variables (:func:`splitting_step`)."""

from __future__ import annotations

import math

import numpy as np


class Anderson:
    """Safeguarded Anderson acceleration (type II) of a fixed-point iteration ``z <- T(z)``
    over tuples of arrays -- here the inner ADMM's state ``(delta, u)``.

    :meth:`step` takes a point ``z`` and its image ``T(z)`` and returns the next point: the
    combination ``T(z_k) - sum_i gamma_i (T(z_{i+1}) - T(z_i))`` of the last ``memory`` images
    whose residuals ``f = T(z) - z`` combine to the least norm (Walker & Ni 2011; for ADMM,
    Zhang & Peng 2019 and Fu, Zhang & Boyd 2020).  The safeguard: when the residual at an
    accelerated point is larger than at the point before, the plain image of that point is
    taken instead and the memory starts again: an extrapolation that makes the residual grow
    costs one iteration and is undone.  ``memory = 0`` is the plain iteration.  Stopping rules are
    unaffected: ADMM's residuals are certificates of the iterate they are computed from,
    whatever the point that iterate started from.  The differences are held in single
    precision (the step is memory-bound): that only perturbs which point is tried next, by
    a share 1e-7 of a step that shrinks to the tolerance, never the iterate a residual
    certifies."""

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self.reset()

    def reset(self) -> None:
        # differences of residuals and of images, by slot (a ring: the oldest is replaced)
        self.d_f: np.ndarray | None = None
        self.d_g: np.ndarray | None = None
        self.gram = np.zeros((self.memory, self.memory))
        self.count = 0  # differences held
        self.slot = 0  # where the next goes
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # (f, g) of the last point
        self.fallback: tuple | None = None  # the plain image, if the last point was combined
        self.norm = math.inf  # the residual at the last accepted point
        self.given: tuple | None = None  # the point returned last, and its flat form
        self.given_flat: np.ndarray | None = None

    def step(self, point: tuple, image: tuple) -> tuple:
        """The next point of the iteration from a point and its image.

        Parameters
        ----------
        point : tuple of tuple of ndarray
            The point ``z`` (groups of arrays); the point last returned may be passed as
            the same objects, whose flat form is then kept.
        image : tuple of tuple of ndarray
            Its image ``T(z)``, shaped as ``point``.

        Returns
        -------
        tuple of tuple of ndarray
            The combined point; ``image`` itself for the plain iteration (``memory = 0``,
            no difference held yet, or a failed combination), or the plain image of the
            point before when the safeguard undoes an extrapolation.
        """
        if self.memory == 0:
            return image
        g = _flat(image)
        same = self.given is not None and all(
            p is q for p, q in zip(point, self.given, strict=True)
        )
        f = g - (self.given_flat if same else _flat(point))
        norm = float(np.sqrt(f @ f))
        if self.fallback is not None and norm > self.norm:  # worse than where it started
            fallback = self.fallback
            self.reset()
            return fallback
        self.norm = norm
        n, k = self.count, self.slot
        if self.last is not None:
            if self.d_f is None:
                self.d_f = np.empty((self.memory, f.size), np.float32)
                self.d_g = np.empty((self.memory, f.size), np.float32)
            np.subtract(f, self.last[0], out=self.d_f[k])
            np.subtract(g, self.last[1], out=self.d_g[k])
            n = self.count = min(n + 1, self.memory)
            self.slot = (k + 1) % self.memory
        self.last = (f, g)
        if n == 0:
            self.fallback = None
            return self._give(image, g)
        rhs = (self.d_f[:n] @ f.astype(np.float32)).astype(float)
        self.gram[k, :n] = self.gram[:n, k] = self.d_f[:n] @ self.d_f[k]
        gram = self.gram[:n, :n]
        ridge = 1e-12 * float(np.trace(gram)) + 1e-300
        try:
            gamma = np.linalg.solve(gram + ridge * np.eye(n), rhs)
        except np.linalg.LinAlgError:
            self.reset()
            return image
        if not np.all(np.isfinite(gamma)):
            self.reset()
            return image
        combined = g - gamma.astype(np.float32) @ self.d_g[:n]
        self.fallback = image
        return self._give(_unflat(combined, image), combined)

    def _give(self, point: tuple, flat: np.ndarray) -> tuple:
        self.given, self.given_flat = point, flat
        return point


def splitting_step(accel: Anderson, point: tuple, image: tuple, proxes: tuple) -> tuple:
    """Anderson acceleration of an ADMM through its governing variables: the next point.

    ``point`` and ``image`` hold one ``(delta, u)`` pair per split, ``delta = prox(xi)`` and
    the scaled dual ``u = xi - delta`` of the split's threshold argument ``xi`` (``delta``
    ``None`` for a variable taken as it is).  Every such pair is a function of ``xi = delta +
    u`` alone, so the iteration is a fixed-point map of the ``xi`` (Douglas-Rachford's
    governing sequence): Anderson combines them, half the numbers of the pairs, and the
    pairs of a combined point are read back through ``proxes`` (one per split: ``xi ->
    delta``); docs/methods.md 1.4 step 3 and docs/performance.md have its measurements.

    Parameters
    ----------
    accel : Anderson
        The acceleration, whose memory the step updates.
    point, image : tuple of tuple
        A point and its image under the ADMM's iteration: one ``(delta, u)`` pair per
        split.
    proxes : tuple of callable or None
        Per split, ``xi -> delta``; ``None`` where ``delta`` is ``None``.

    Returns
    -------
    tuple of tuple
        The next point, one ``(delta, u)`` pair per split: ``image`` itself for a plain
        step.
    """
    xi_point = tuple(u if d is None else d + u for d, u in point)
    xi_image = (tuple(u if d is None else d + u for d, u in image),)
    nxt = accel.step((xi_point,), xi_image)
    if nxt is xi_image:  # the plain step
        return image
    out = []
    for xi, prox in zip(nxt[0], proxes, strict=True):
        if prox is None:
            out.append((None, xi))
        else:
            d = prox(xi)
            out.append((d, xi - d))
    return tuple(out)


def _flat(parts: tuple) -> np.ndarray:
    return np.concatenate([np.ravel(a) for group in parts for a in group])


def _unflat(flat: np.ndarray, like: tuple) -> tuple:
    out, at = [], 0
    for group in like:
        arrays = []
        for a in group:
            arrays.append(flat[at : at + a.size].reshape(a.shape))
            at += a.size
        out.append(tuple(arrays))
    return tuple(out)
