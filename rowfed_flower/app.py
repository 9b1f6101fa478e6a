"""The RowFed side of the Flower app (``task = "rowfed"``): thin adapters only.

:func:`run` is called by the ServerApp in :mod:`strategies.app`; it runs the methods
of ``method`` (comma-separated among ``rowfed, nonfed, fedavg, perfl-lsma``) one after the
other on the same federation, prints MSE-Est, MSE-Pred and RI per method and writes the
outputs when ``out-dir`` is set.  :func:`make_client` is called by the ClientApp.
"""

from __future__ import annotations

import os

from flwr.app import Context
from flwr.serverapp import Grid

from strategies.client.guards import Guards
from strategies.config import (
    GuardsConfig,
    registration_config,
    rowfed_config,
    rowfed_methods,
    tune_config,
)
from strategies.errors import InputError
from strategies.runtime.engine import log_line, round_logger
from strategies.runtime.flowerapp import node_index, out_dir, round_timeout, run_methods
from strategies.server.rowfed import dims, rowfed_registry

from . import federation as fed
from . import sources as rsources
from .client import RowFedClient

#: Log every this many rounds (and the last).
LOG_EVERY = 25


def run(grid: Grid, context: Context) -> dict:
    """Run the configured RowFed methods through Flower.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid that carries the messages to the clients.
    context : flwr.app.Context
        The run's context; its run config holds the settings (``rowfed.*``,
        ``rowfed-data.*``, ``tune.*``, ``method``, ``out-dir``, ...).

    Returns
    -------
    dict of str to MethodResult
        ``{method: MethodResult}`` (:class:`rowfed_flower.federation.MethodResult`).
    """
    rc = context.run_config
    for key in ("checkpoint.path", "checkpoint.resume"):
        if str(rc.get(key, "")):  # not silently ignored
            raise InputError(f'{key}: checkpoints are kept for task = "grauc" only')
    cfg = rowfed_config(rc)
    methods = rowfed_methods(rc)
    spec = rsources.DataSpec.from_run_config(rc)
    out = out_dir(rc)
    timeout = round_timeout(rc)
    # deployment: the server has no data; each SuperNode reads its own file
    data = None if spec.source == "deployment" else rsources.load_data(spec)
    n_sites = spec.num_clients if data is None else len(data.clients)
    registry = rowfed_registry(registration_config(rc))
    tc = tune_config(rc)
    tune, waves = None, 1
    if tc.by:
        from .federated_tuning import federated_options, tuning_waves

        tune = (tc.by, federated_options(tc))
        waves = tuning_waves(tune)  # the round budget's factor (tune.max-fits)

    def strategy(method):
        if tune is not None:  # the tuning and the refit, as one batched run
            from .federated_tuning import tuned_strategy

            return tuned_strategy(method, cfg, n_sites, registry, tune, log_line, timeout)
        return fed.make_strategy(
            method,
            cfg,
            n_sites,
            registry,
            progress=round_logger(method, LOG_EVERY, fed.round_limit(method, cfg)),
            timeout=timeout,
        )

    results = run_methods(
        grid,
        methods,
        strategy,
        lambda method: fed.max_rounds_for(method, cfg, tune is not None, waves),
        fed.collect,
        timeout,
    )
    if data is None:
        p, q = dims(registry, registry.order())
        names = registry.sites[registry.order()[0]].features or tuple(f"x{k + 1}" for k in range(p))
        responses = tuple(r for r in spec.responses.split(",") if r) or tuple(
            f"y{k + 1}" for k in range(q)
        )
        data = rsources.FederatedData(clients=(), features=tuple(names), responses=responses)
    summary = fed.summarize(results, data)
    print(fed.format_table(summary), flush=True)
    if out:
        for method, res in results.items():
            sub = out if len(results) == 1 else os.path.join(out, method)
            fed.write_result(sub, res, data, cfg)
        os.makedirs(out, exist_ok=True)
        summary.to_csv(os.path.join(out, "summary.csv"), index=False)
    return results


def make_client(context: Context):
    """The ClientApp's client: ``partition-id`` picks client ``m`` of the run's data; a
    SuperNode with ``data-path`` in its node config reads its own file (the fit command's
    format, responses from ``rowfed-data.responses``; ``client`` in the node config picks
    one client when the file holds several)."""
    rc = context.run_config
    node = context.node_config
    spec = rsources.DataSpec.from_run_config(rc)
    if "data-path" in node:
        data = rsources.read_fit_csv(str(node["data-path"]), spec.responses, spec.client_column)
        wanted = str(node.get("client", ""))
        pick = [c for c in data.clients if c.site == wanted] if wanted else list(data.clients)
        if len(pick) != 1:
            raise InputError(
                f"data-path: need exactly one client (set 'client' in the node config), "
                f"found {len(pick)}"
            )
        index = node_index(node)
        guards = Guards.from_node_config(node)
        return RowFedClient(pick[0], index, data.features, guards).to_client()
    data = rsources.load_data(spec)
    pid = int(node["partition-id"])
    if not 0 <= pid < len(data.clients):
        raise InputError(f"partition-id: must be in [0, {len(data.clients) - 1}], got {pid}")
    guards = Guards.from_config(GuardsConfig.from_run_config(rc))  # the simulated sites'
    return RowFedClient(data.clients[pid], pid, data.features, guards).to_client()


__all__ = ["make_client", "run"]
