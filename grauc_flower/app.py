"""The GrAUC-PFL side of the Flower app (``task = "grauc"``): thin adapters only.

:func:`run` is called by the ServerApp in :mod:`strategies.app`: it runs the methods of
``method`` (comma-separated among ``grauc, fedavg, individual, pooled``) on the same
federation, prints each site's AUC per method and writes the outputs when ``out-dir`` is
set.  :func:`make_client` is called by the ClientApp.
"""

from __future__ import annotations

import os

from flwr.app import Context
from flwr.serverapp import Grid

from strategies.config import grauc_config, grauc_methods
from strategies.errors import InputError

from . import sources
from .client import GrAUCClient


def run(grid: Grid, context: Context) -> dict:
    """Run the configured GrAUC-PFL methods through Flower.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid of SuperNodes.
    context : Context
        The run's context; its run config gives the methods, the settings, the data
        (``data.*``), the tuning (``tune.*``), the checkpoint and ``out-dir``.

    Returns
    -------
    dict of str to MethodResult
        ``{method: result}``.
    """
    # the server side's imports are here: a ClientApp starts for every message and needs
    # only the client and its data (measured: 0.5 s less per message)
    from strategies.config import registration_config, tune_config
    from strategies.runtime.engine import log_line, round_logger
    from strategies.runtime.flowerapp import out_dir, round_timeout, run_methods
    from strategies.server.registry import Registry

    from . import federation as fed

    rc = context.run_config
    cfg = grauc_config(rc)
    methods = grauc_methods(rc)
    spec = fed.DataSpec.from_run_config(rc)
    out = out_dir(rc)
    timeout = round_timeout(rc)
    sites = None
    n_sites = spec.n_sites
    features = tuple(f"x{k + 1}" for k in range(spec.n_features))
    if spec.source != "simulated" or "pooled" in methods:
        sites, features = fed.load_sites(spec)
        n_sites = len(sites)
    checkpoint = fed.checkpoint_settings(rc)
    registry = Registry(waiting=registration_config(rc))
    tc = tune_config(rc)
    tune, waves = None, 1
    if tc.by:
        from .federated_tuning import federated_options, tuning_waves

        if tc.by != "cv":
            raise InputError(f"tune.by: GrAUC-PFL is tuned by cv (gic is RowFed's), got {tc.by!r}")
        tune = federated_options(tc)
        waves = tuning_waves(tune)  # the round budget's factor (tune.max-fits)

    def strategy(method):
        if tune is not None:  # the tuning and the refit, as one batched run
            from .federated_tuning import tuned_strategy

            return tuned_strategy(
                method, cfg, n_sites, registry, tune, progress=log_line, timeout=timeout
            )
        return fed.make_strategy(
            method,
            cfg,
            n_sites,
            registry,
            sites,
            progress=round_logger(method, 1, fed.round_limit(method, cfg)),
            checkpoint=checkpoint,
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
    features = registry.features() or features
    print(fed.format_auc_table(results), flush=True)
    if out:
        for method, res in results.items():
            sub = out if len(results) == 1 else os.path.join(out, method)
            fed.write_result(sub, res, features, cfg)
            # the sites' places and counts from their registration (predict's new sites, the
            # report's map): the server has no rows
            where = fed.registered_sites_table(registry, res.sites)
            where.to_csv(os.path.join(sub, "sites.csv"), index=False)
        fed.auc_table(results).to_csv(os.path.join(out, "auc.csv"), index=False)
    return results


def make_client(context: Context):
    """The ClientApp's client: ``partition-id`` picks site ``z`` of the run's data; a
    SuperNode with ``data-path`` in its node config reads its own file."""
    rc = context.run_config
    cfg = grauc_config(rc)
    node = context.node_config
    if "data-path" in node:
        from .data import load_site_file

        data = load_site_file(str(node["data-path"]), node)
        from strategies.client.guards import Guards
        from strategies.runtime.flowerapp import node_index

        guards = Guards.from_node_config(node)
        return GrAUCClient(data, cfg.ridge, index=node_index(node), guards=guards).to_client()
    spec = sources.DataSpec.from_run_config(rc)
    sites, _ = sources.load_sites(spec)
    pid = int(node["partition-id"])
    if not 0 <= pid < len(sites):
        raise InputError(f"partition-id: must be in [0, {len(sites) - 1}], got {pid}")
    from strategies.client.guards import Guards
    from strategies.config import GuardsConfig

    guards = Guards.from_config(GuardsConfig.from_run_config(rc))  # the simulated sites'
    return GrAUCClient(sites[pid], cfg.ridge, index=pid, guards=guards).to_client()


__all__ = ["make_client", "run"]
