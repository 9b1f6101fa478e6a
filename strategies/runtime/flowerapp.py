"""What the two methods' Flower apps share (``grauc_flower/app.py``, ``rowfed_flower/app.py``):
the run-config keys every run reads, a node's place in the federation, and the server loop
that runs each method of ``method`` one after the other.  The dispatching ServerApp and
ClientApp (:mod:`strategies.app`) import the method apps; these import this module."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from logging import INFO, WARNING

from flwr.common import log
from flwr.server import ServerConfig
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from ..errors import InputError
from .engine import stopping_server
from .grid import PromptGrid


def round_timeout(run_config: dict) -> float | None:
    """``round-timeout`` in seconds (``None``: no limit): how long a round, and registration,
    wait for the sites."""
    value = float(run_config.get("round-timeout", 0.0))
    if value < 0:
        raise InputError(f"round-timeout: must be >= 0 (0 = no limit), got {value!r}")
    return value or None


def out_dir(run_config: dict) -> str:
    """``out-dir``: an absolute path, or empty (print only)."""
    path = str(run_config.get("out-dir", ""))
    if path and not os.path.isabs(path):
        raise InputError(f"out-dir: must be an absolute path, got {path!r}")
    return path


def run_methods(
    grid: Grid,
    methods: list[str],
    make_strategy: Callable[[str], object],
    max_rounds_for: Callable[[str], int],
    collect: Callable[[str, object], object],
    timeout: float | None,
) -> dict:
    """Each method through Flower's server loop on ``grid`` (polled for replies promptly:
    :class:`~strategies.runtime.grid.PromptGrid`), one after the other.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The ServerApp's grid (wrapped in a :class:`~strategies.runtime.grid.PromptGrid`
        unless it is one).
    methods : list of str
        The methods, in the order they run.
    make_strategy : callable
        ``make_strategy(method)``: the method's strategy.
    max_rounds_for : callable
        ``max_rounds_for(method)``: the method's round limit (Flower's ``num_rounds``).
    collect : callable
        ``collect(method, strategy)``: what the results keep of a finished method.
    timeout : float or None
        Flower's round timeout in seconds (``None``: no limit).

    Returns
    -------
    dict
        ``{method: collect(method, strategy)}``.
    """
    results = {}
    grid = grid if isinstance(grid, PromptGrid) else PromptGrid(grid)
    for method in methods:
        t0 = time.perf_counter()
        strategy = make_strategy(method)
        start_grid(
            grid=grid,
            server=stopping_server(strategy),
            config=ServerConfig(num_rounds=max_rounds_for(method), round_timeout=timeout),
        )
        results[method] = collect(method, strategy)
        log(INFO, "%s finished in %.1f s", method, time.perf_counter() - t0)
        missing = strategy.unanswered()
        if missing:
            log(WARNING, "%s: no answer at the end from site(s) %s", method, ", ".join(missing))
    return results


def node_index(node: dict) -> int:
    """The site's position in the federation's list from its node config (``index``; -1:
    none, the server orders such sites by id)."""
    value = node.get("index", -1)
    try:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        index = int(value)
    except (TypeError, ValueError):
        raise InputError(f"node-config: index must be an integer, got {value!r}") from None
    if index < -1:
        raise InputError(f"node-config: index must be >= 0 (or -1: none), got {index}")
    return index
