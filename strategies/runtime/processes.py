"""The processes a run starts (SuperLink, SuperNodes, ``flwr``): free ports, the console
scripts beside this interpreter, Flower's environment, waiting for a port and stopping a
process by its pid (then its process group), for the simulation, the launcher and the
deployment alike."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def console_script(name: str) -> str:
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
    """Return once ``127.0.0.1:port`` accepts a connection.

    Parameters
    ----------
    port : int
        The port on ``127.0.0.1``.
    proc : subprocess.Popen
        The ``flower-superlink`` process that opens the port.
    timeout : float, optional
        Seconds to wait.

    Raises
    ------
    RuntimeError
        When ``proc`` exits first, or the port is not open within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"flower-superlink did not open port {port} within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process (by pid), wait, then SIGKILL its process group if still alive.

    Parameters
    ----------
    proc : subprocess.Popen
        A process started in its own session (its process group's id is its pid).
    grace : float, optional
        Seconds to wait after SIGTERM.
    """
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
