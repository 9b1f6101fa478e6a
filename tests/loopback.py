"""Flower's Deployment Engine on loopback, for the deployment tests: a SuperLink with TLS and
SuperNode authentication, one SuperNode per site, each with its own data file.  Every process
is started and stopped by its pid, also when a test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import tomli_w
from conftest import ROOT

from grauc_flower.data import simulate
from strategies.runtime.deploy import PlanSite, make_plan, start
from strategies.runtime.processes import (
    console_script,
    flower_env,
    free_port,
    stop_process,
    wait_for_port,
)

FEATURES = ["age", "bmi", "sbp"]
#: The marks of a deployment test module (``pytestmark = MARKS``): the certificates and
#: SuperNode keys are made with openssl and ssh-keygen.
MARKS = [
    pytest.mark.deployment,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
        reason="openssl and ssh-keygen are needed",
    ),
]


class Federation:
    """The documented deployment (:func:`strategies.runtime.deploy.make_plan`, the commands
    docs/deployment.md shows) on loopback: a SuperLink with TLS and SuperNode
    authentication, a default connection, registered keys, one SuperNode per site, runs
    through the plan's launcher; every process started and stopped by its pid."""

    def __init__(self, root: str, pki: dict, n_sites: int = 3, base: dict | None = None) -> None:
        self.root = root
        self.home = os.path.join(root, "flwr-home")
        os.makedirs(self.home, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[str, subprocess.Popen] = {}
        self.sites = simulate(n_sites=n_sites, n_features=len(FEATURES), n_train=40, seed=31337)
        self.certs = pki["certs"]
        self.keys = pki["keys"]  # the last key is never registered
        for s in self.sites:
            frame = pd.DataFrame(s.x_train, columns=FEATURES)
            frame.insert(0, "y", s.y_train)
            frame.to_csv(self.data_path(s.site), index=False)
        self.port = free_port()
        self.run_config_path = os.path.join(root, "run_config.toml")
        self.plan = make_plan(
            f"127.0.0.1:{self.port}",
            pki["dir"],
            [
                PlanSite(s.site, self.data_path(s.site), s.lat, s.lon, port=free_port())
                for s in self.sites
            ],
            base or {"task": "grauc", "method": "grauc", "data.num-sites": n_sites},
            superlink_host="127.0.0.1",
            database=os.path.join(self.home, "state.db"),
            run_config_path=self.run_config_path,
            app_dir=ROOT,
            python=sys.executable,
        )
        self.superlink = start(self.plan.superlink, self.home, "superlink.log")
        self.procs.append(self.superlink)
        try:  # a failure here (a refused registration) still stops the SuperLink by its pid
            wait_for_port(self.port, self.superlink)
            with open(os.path.join(self.home, "config.toml"), "wb") as fh:
                tomli_w.dump(self.plan.flower_config, fh)
            for cmd in self.plan.register:
                self.flwr(*cmd[1:])
        except BaseException:
            self.close()
            raise

    def data_path(self, site: str) -> str:
        return os.path.join(self.root, f"{site}.csv")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [console_script("flwr"), *args],
            env=flower_env(self.home),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc

    def start_node(self, k: int, node_config: str | None = None) -> subprocess.Popen:
        """Site ``k``'s SuperNode as planned (``node_config`` replaces its node config)."""
        site = self.sites[k].site
        cmd = list(self.plan.supernodes[site])
        if node_config is not None:
            cmd[cmd.index("--node-config") + 1] = node_config
        proc = start(
            cmd, self.home, f"supernode-{k}-{len(self.procs)}.log", self.plan.supernode_env
        )
        self.procs.append(proc)
        self.nodes[site] = proc
        return proc

    def launch(self, run_config: dict) -> subprocess.Popen:
        """The plan's run command (the project's launcher) with ``run_config`` added."""
        with open(self.run_config_path, "wb") as fh:
            tomli_w.dump({**self.plan.run_config, **run_config}, fh)
        proc = subprocess.Popen(
            self.plan.run,
            cwd=ROOT,
            env=flower_env(self.home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, run_config: dict, timeout: float = 900) -> tuple[int, str]:
        """Launch and wait: ``(exit status, output)``."""
        proc = self.launch(run_config)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, grace=5)
