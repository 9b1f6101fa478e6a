"""The Flower app: one ServerApp and one ClientApp that dispatch on ``method``.

``method`` is one or more names, comma-separated: GrAUC-PFL's ``grauc``, ``fedavg``,
``individual``, ``pooled`` (run one after the other on the same federation), or RowFed's
``rowfed``, ``nonfed``, ``fedavg``, ``perfl-lsma`` when ``task = "rowfed"``.
"""

from __future__ import annotations

import os
import time
from logging import INFO

from flwr.app import Context
from flwr.client import ClientApp
from flwr.common import log
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from .engine import round_logger, stopping_server
from .errors import InputError
from .registry import Registry

server_app = ServerApp()


def _run_grauc(grid: Grid, context: Context) -> None:
    from grauc_flower import federation as fed

    rc = context.run_config
    cfg = fed.grauc_config(rc)
    methods = fed.grauc_methods(rc)
    spec = fed.DataSpec.from_run_config(rc)
    sites = None
    n_sites = spec.n_sites
    features = tuple(f"x{k + 1}" for k in range(spec.n_features))
    if spec.source != "simulated" or "pooled" in methods:
        sites, features = fed.load_sites(spec)
        n_sites = len(sites)
    round_timeout = float(rc.get("round-timeout", 0.0)) or None
    checkpoint = fed.checkpoint_settings(rc)
    registry = Registry()
    results = {}
    for method in methods:
        t0 = time.perf_counter()
        strategy = fed.make_strategy(
            method,
            cfg,
            n_sites,
            registry,
            sites,
            progress=round_logger(method),
            checkpoint=checkpoint,
        )
        start_grid(
            grid=grid,
            server=stopping_server(strategy),
            config=ServerConfig(
                num_rounds=fed.max_rounds_for(method, cfg), round_timeout=round_timeout
            ),
        )
        results[method] = fed.collect(method, strategy)
        log(INFO, "%s finished in %.1f s", method, time.perf_counter() - t0)
    features = registry.features() or features
    print(fed.format_auc_table(results), flush=True)
    for method, res in results.items():
        if res.extra.get("missing"):
            print(
                f"{method}: no answer at the end from site(s) "
                f"{', '.join(sorted(res.extra['missing']))}",
                flush=True,
            )
    out_dir = str(rc.get("out-dir", ""))
    if out_dir:
        if not os.path.isabs(out_dir):
            raise InputError(f"out-dir: must be an absolute path, got {out_dir!r}")
        for method, res in results.items():
            sub = out_dir if len(results) == 1 else os.path.join(out_dir, method)
            fed.write_result(sub, res, features, cfg)
        fed.auc_table(results).to_csv(os.path.join(out_dir, "auc.csv"), index=False)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    task = str(context.run_config.get("task", "grauc"))
    if task == "grauc":
        _run_grauc(grid, context)
    elif task == "rowfed":
        from rowfed_flower.app import run_rowfed

        run_rowfed(grid, context)
    else:
        raise InputError(f"task: must be grauc or rowfed, got {task!r}")


def _client_fn(context: Context):
    task = str(context.run_config.get("task", "grauc"))
    if task == "rowfed":
        from rowfed_flower.app import make_client

        return make_client(context)
    from grauc_flower import sources
    from grauc_flower.client import GrAUCClient

    rc = context.run_config
    cfg = sources.grauc_config(rc)
    node = context.node_config
    if "data-path" in node:
        from grauc_flower.data import load_site_file

        data = load_site_file(str(node["data-path"]), node)
        return GrAUCClient(data, cfg.ridge, index=int(node.get("index", -1))).to_client()
    spec = sources.DataSpec.from_run_config(rc)
    sites, _ = sources.load_sites(spec)
    pid = int(node["partition-id"])
    return GrAUCClient(sites[pid], cfg.ridge, index=pid).to_client()


client_app = ClientApp(client_fn=_client_fn)
