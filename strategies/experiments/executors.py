"""Where a study's tasks run: in this process, a pool of worker processes, or a Ray
cluster.  Each calls ``on_result(cell, rep, seed, outcome)`` as a task finishes."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from ..errors import InputError


def _import(path: str) -> Callable:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def execute_task(task_path: str, settings: dict, cell: dict, rep: int, seed: int):
    """Run one task (in a worker).

    Parameters
    ----------
    task_path : str
        The task function, ``"module:function"``, called as ``task(settings, cell, rep,
        seed)``.
    settings : dict
        The study config's tables but ``[design]``.
    cell : dict
        The design values (the task gets a copy).
    rep : int
        The replication.
    seed : int
        The task's seed.

    Returns
    -------
    tuple
        ``("ok", frames, seconds)`` with the task's frames and its time (the imports
        excluded), or ``("error", text, 0.0)`` with the exception and its traceback.
    """
    try:
        task = _import(task_path)  # imports are not the task's time
        t0 = time.perf_counter()
        frames = task(settings, dict(cell), rep, seed)
        return "ok", frames, time.perf_counter() - t0
    except Exception as exc:  # reported per task; the other tasks go on
        text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        return "error", text, 0.0


def run_local(task_path, settings, todo, workers, on_result):
    """Run the tasks in this process (one worker) or in a pool of spawned processes, and
    call ``on_result`` as each finishes.

    Parameters
    ----------
    task_path : str
        The task function, ``"module:function"`` (:func:`execute_task`).
    settings : dict
        The study config's tables but ``[design]``.
    todo : list of tuple
        The tasks, ``(cell, rep, seed)`` each.
    workers : int
        Worker processes; 1: one task after another in this process.
    on_result : callable
        ``on_result(cell, rep, seed, outcome)`` with :func:`execute_task`'s outcome.
    """
    if workers == 1:
        for cell, rep, seed in todo:
            on_result(cell, rep, seed, execute_task(task_path, settings, cell, rep, seed))
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        # one BLAS thread per worker: inherited from strategies.single_threaded_blas
        pending = {
            pool.submit(execute_task, task_path, settings, cell, rep, seed): (cell, rep, seed)
            for cell, rep, seed in todo
        }
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    cell, rep, seed = pending.pop(fut)
                    on_result(cell, rep, seed, fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """``host:port`` (or ``ray://host:port``) must accept a TCP connection: Ray itself
    retries an unreachable address for minutes.

    Parameters
    ----------
    address : str
        The Ray address; ``auto``, ``local`` and an address without a port are not checked.
    timeout : float, optional
        Seconds to wait for the connection.
    """
    import socket

    target = address.removeprefix("ray://")
    if address in ("auto", "local") or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        raise InputError(f"ray-address: cannot connect to {address!r}: {exc}") from None


def run_ray(task_path, settings, todo, address, on_result):
    """Run the tasks on a Ray cluster, one CPU each, and call ``on_result`` as each
    finishes; Ray is shut down at the end.

    Parameters
    ----------
    task_path : str
        The task function, ``"module:function"`` (:func:`execute_task`).
    settings : dict
        The study config's tables but ``[design]``.
    todo : list of tuple
        The tasks, ``(cell, rep, seed)`` each.
    address : str
        The Ray address; ``local`` starts a new local instance, anything else connects to
        an existing cluster (every node needs this project installed).
    on_result : callable
        ``on_result(cell, rep, seed, outcome)`` with :func:`execute_task`'s outcome.
    """
    try:
        import ray
    except ImportError:  # pragma: no cover - Ray comes with flwr[simulation]
        msg = "ray-address: Ray is not installed (pip install 'flwr[simulation]')"
        raise InputError(msg) from None
    import logging
    import warnings

    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            if address == "local":  # a new local instance, even when one is running
                ray.init(address="local", include_dashboard=False, **quiet)
            else:  # an existing cluster; every node needs this project installed
                ray.init(address=address, **quiet)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"ray-address: cannot connect to {address!r}: {first}") from None
    remote = ray.remote(num_cpus=1)(execute_task)
    refs = {
        remote.remote(task_path, settings, cell, rep, seed): (cell, rep, seed)
        for cell, rep, seed in todo
    }
    try:
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell, rep, seed = refs.pop(ref)
                on_result(cell, rep, seed, ray.get(ref))
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        ray.shutdown()
