"""The Flower app: one ServerApp and one ClientApp that dispatch on ``task``.

``task = "grauc"`` runs :mod:`grauc_flower.app`, ``task = "rowfed"`` :mod:`rowfed_flower.app`;
each runs the comma-separated methods of ``method`` one after the other on the same
federation (:func:`run_methods`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING

from flwr.app import Context
from flwr.client import ClientApp
from flwr.common import log
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from .errors import InputError, at_site
from .runtime.engine import stopping_server
from .runtime.grid import PromptGrid

TASKS = ("grauc", "rowfed")

server_app = ServerApp()


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
    :class:`~strategies.runtime.grid.PromptGrid`), one after the other; returns
    ``{method: collect(method, strategy)}``."""
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


def _task(context: Context) -> str:
    task = str(context.run_config.get("task", "grauc"))
    if task not in TASKS:
        raise InputError(f"task: must be one of {', '.join(TASKS)}, got {task!r}")
    return task


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """The method's server side; bad input (a setting, or a site's data or node config) is
    logged as one line naming the field (and the site) and fails the run."""
    try:
        if _task(context) == "grauc":
            from grauc_flower.app import run
        else:
            from rowfed_flower.app import run
        run(grid, context)
    except InputError as exc:
        log(ERROR, "error: %s", exc)
        raise


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


def _site_of(node: dict) -> str:
    if "site" in node:
        return str(node["site"])
    if "client" in node:
        return str(node["client"])
    if "partition-id" in node:
        return f"partition {node['partition-id']}"
    return "(unnamed: no site in its node config)"


def _client_fn(context: Context):
    """The method's client for this node.  A node of a deployment (no ``partition-id``)
    must name its ``data-path``; an input error is marked with the site so the server can
    end the run naming it (:func:`strategies.errors.site_input_error`)."""
    node = context.node_config
    try:
        if "data-path" not in node and "partition-id" not in node:
            raise InputError(
                "data-path: missing from the SuperNode's node config "
                "(--node-config 'data-path=\"/path/site.csv\" ...')"
            )
        if _task(context) == "grauc":
            from grauc_flower.app import make_client
        else:
            from rowfed_flower.app import make_client
        return make_client(context)
    except InputError as exc:
        raise at_site(_site_of(node), exc) from None


client_app = ClientApp(client_fn=_client_fn)
