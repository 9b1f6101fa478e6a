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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

CONNECTION = "pfl-sim"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    """The console script ``name`` next to this interpreter (falls back to PATH)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def flower_env(home: str) -> dict:
    """Environment for Flower's processes: ``FLWR_HOME``, this interpreter's scripts first on
    ``PATH`` (the SuperLink starts ``flower-superexec``, ``flwr-serverapp``...), a Ray of
    their own and one BLAS thread (both unless set)."""
    from .. import single_threaded_blas

    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "FLWR_HOME": home,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
    }
    # the simulation starts its own Ray instance: without this, Ray joins the cluster named
    # in <tmp>/ray/ray_current_cluster (left by any `ray start`, even a dead one: a hang)
    env.setdefault("RAY_ADDRESS", "local")
    single_threaded_blas(env)
    return env


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"flower-superlink did not open port {port} within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process (by pid), wait, then SIGKILL its process group if still alive."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: Ray workers it started
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@contextlib.contextmanager
def simulation_superlink(home: str):
    """A simulation SuperLink on free ports; yields the ``flwr`` connection name."""
    port = free_port()
    env = flower_env(home)
    log = open(os.path.join(home, "superlink.log"), "wb")  # noqa: SIM115
    cmd = [
        _bin("flower-superlink"),
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
    """``flwr run`` the app in ``app_dir`` on the simulation engine; returns its output.

    Raises :class:`~strategies.runtime.launch.RunFailed` (one line: the ServerApp's error,
    or Flower's status) unless the run's status is ``finished:completed``.  ``echo``: what
    of the stream to copy to stderr (``True``: all; a filter such as
    :class:`~strategies.runtime.launch.ProgressLines`).
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
