"""Run the Flower app through Flower's simulation engine (``flwr run``), cleanly.

Starts a private simulation SuperLink on free loopback ports with its own ``$FLWR_HOME``,
points a ``[superlink.NAME]`` connection at it, calls ``flwr run APP NAME --stream`` and
stops the SuperLink (and with it Ray) by its pid, also when anything fails.  This is what
``flwr run .`` does with its managed local SuperLink, minus the detached process it leaves
behind (FLOWER.md).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile

import tomli_w

from .processes import console_script, flower_env, free_port, stop_process, wait_for_port

CONNECTION = "pfl-sim"


@contextlib.contextmanager
def simulation_superlink(home: str):
    """A simulation SuperLink on free ports; yields the ``flwr`` connection name."""
    port = free_port()
    env = flower_env(home)
    log = open(os.path.join(home, "superlink.log"), "wb")  # noqa: SIM115
    cmd = [
        console_script("flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--database",
        ":flwr-in-memory:",
        "--disable-runtime-dependency-installation",
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        with open(os.path.join(home, "config.toml"), "wb") as fh:
            tomli_w.dump(
                {
                    "superlink": {
                        "default": CONNECTION,
                        CONNECTION: {"address": f"127.0.0.1:{port}", "insecure": True},
                    }
                },
                fh,
            )
        wait_for_port(port, proc)
        yield CONNECTION
    finally:
        stop_process(proc)
        log.close()


def flwr_run(
    app_dir: str, run_config: dict, num_supernodes: int, timeout: float = 1800, echo=False
) -> str:
    """``flwr run`` the app in ``app_dir`` on the simulation engine.

    Raises :class:`~strategies.runtime.launch.RunFailed` (one line: the ServerApp's error,
    or Flower's status) unless the run's status is ``finished:completed``.

    Parameters
    ----------
    app_dir : str
        The Flower app's directory.
    run_config : dict
        The run config (written to a TOML file for ``--run-config``).
    num_supernodes : int
        The simulated SuperNodes (one CPU each).
    timeout : float, optional
        Seconds the run's stream may last (:func:`~strategies.runtime.launch.flwr_run_checked`).
    echo : bool or callable, optional
        What of the stream to copy to stderr (``True``: all; a filter such as
        :class:`~strategies.runtime.launch.ProgressLines`).

    Returns
    -------
    str
        The run's output.
    """
    from .launch import flwr_run_checked

    with tempfile.TemporaryDirectory(prefix="pfl-flwr-") as home:
        cfg_path = os.path.join(home, "run_config.toml")
        with open(cfg_path, "wb") as fh:
            tomli_w.dump(run_config, fh)
        with simulation_superlink(home) as name:
            return flwr_run_checked(
                app_dir,
                name,
                flower_env(home),
                (
                    "--run-config",
                    cfg_path,
                    "--federation-config",
                    f"num-supernodes={num_supernodes} client-resources-num-cpus=1",
                ),
                echo=echo,
                timeout=timeout,
            )
