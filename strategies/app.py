"""The Flower app: one ServerApp and one ClientApp that dispatch on ``task``.

``task = "grauc"`` runs :mod:`grauc_flower.app`, ``task = "rowfed"`` :mod:`rowfed_flower.app`;
each runs the comma-separated methods of ``method`` one after the other on the same
federation (:func:`strategies.runtime.flowerapp.run_methods`).  Nothing imports this module
back: what the method apps share is :mod:`strategies.runtime.flowerapp`.
"""

from __future__ import annotations

from logging import ERROR

from flwr.app import Context
from flwr.client import ClientApp
from flwr.common import log
from flwr.server import ServerApp
from flwr.serverapp import Grid

from .errors import InputError, at_site

TASKS = ("grauc", "rowfed")

server_app = ServerApp()


def _task(context: Context) -> str:
    task = str(context.run_config.get("task", "grauc"))
    if task not in TASKS:
        raise InputError(f"task: must be one of {', '.join(TASKS)}, got {task!r}")
    return task


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """The method's server side; bad input (a setting, or a site's data or node config) is
    logged as one line naming the field (and the site) and fails the run.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid that carries the messages to the sites.
    context : flwr.app.Context
        The run's context; its run config's ``task`` (``grauc`` by default, or ``rowfed``)
        picks the method.
    """
    try:
        if _task(context) == "grauc":
            from grauc_flower.app import run
        else:
            from rowfed_flower.app import run
        run(grid, context)
    except InputError as exc:
        log(ERROR, "error: %s", exc)
        raise


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
