"""``flwr run`` with an exit status to trust.

``flwr run --stream`` exits 0 even when the ServerApp failed or the run was stopped (Flower
1.42); the run's status (``flwr ls --run-id ID``) says what happened.  :func:`flwr_run_checked`
streams a run, reads its status and raises :class:`RunFailed` with one line unless the status
is ``finished:completed``: the ServerApp's own ``error: ...`` line when it logged one (a
setting, or a site's data, named), else Flower's status details.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable

from .processes import console_script, stop_process

COMPLETED = "finished:completed"
_RUN_ID = re.compile(r"Successfully started run (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_APP_ERROR = re.compile(r"ERROR\s*:\s*(error: .*)$")


class RunFailed(RuntimeError):
    """The run did not complete; the message is one line."""


def run_id_of(output: str) -> str | None:
    """The run id ``flwr run`` printed (``None`` when it did not start one)."""
    match = _RUN_ID.search(output)
    return match.group(1) if match else None


def app_error(output: str) -> str | None:
    """The last ``error: ...`` line the ServerApp logged, without Flower's log prefix."""
    found = None
    for line in _ANSI.sub("", output).splitlines():
        match = _APP_ERROR.search(line)
        if match:
            found = match.group(1).strip()
    return found


def run_status(connection: str, run_id: str, env: dict, timeout: float = 60) -> tuple[str, str]:
    """``(status, details)`` of run ``run_id`` on ``connection`` (``flwr ls``).

    Parameters
    ----------
    connection : str
        The ``[superlink.NAME]`` connection.
    run_id : str
        The run's id.
    env : dict
        The environment ``flwr ls`` runs in.
    timeout : float, optional
        Seconds ``flwr ls`` may take.

    Returns
    -------
    status, details : str
        The run's status (e.g. ``finished:completed``) and Flower's details of it (empty
        when it gives none).
    """
    proc = subprocess.run(
        [console_script("flwr"), "ls", connection, "--run-id", run_id, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        runs = json.loads(proc.stdout)["runs"]
        run = next(r for r in runs if str(r["run-id"]) == str(run_id))
    except (ValueError, KeyError, StopIteration):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        raise RunFailed(f"flwr ls: no status for run {run_id}: {' '.join(tail)}") from None
    return str(run["status"]), str(run.get("status-details", ""))


def failure_message(status: str, details: str, output: str) -> str:
    """One line saying why a run with ``status`` did not complete.

    Parameters
    ----------
    status : str
        The run's status (:func:`run_status`).
    details : str
        Flower's details of the status (empty or ``N/A``: none).
    output : str
        The output of ``flwr run``; the ServerApp's last ``error: ...`` line in it, when
        there is one, is the line (without ``error:``).

    Returns
    -------
    str
    """
    found = app_error(output)
    if found:
        return found.removeprefix("error: ")
    if status == "finished:stopped":
        return "run: stopped before it finished (flwr stop)"
    why = details if details and details != "N/A" else "see the run's log (flwr log RUN_ID)"
    return f"run: {status}: {why}".splitlines()[0]


class ProgressLines:
    """A filter for ``flwr run``'s stream that keeps what a person waiting wants to see: each
    method's round lines (``grauc: round 5/300, objective ...``; the first of each method,
    then at most one every ``every`` seconds) and the server's lines about missing sites.
    Flower's own INFO log is left out (``--verbose`` shows it)."""

    KEEP = ("registration:", "no answer at the end", "failed:", "tuning round", "cv:")

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.last: dict[str, float] = {}

    def __call__(self, line: str) -> str | None:
        from .engine import ROUND_LINE

        text = _ANSI.sub("", line).strip()
        text = re.sub(r"^(INFO|WARNING|ERROR)\s*:\s*", "", text)
        match = ROUND_LINE.search(text)
        if match:
            method, rnd, limit, rest = match.groups()
            now = time.monotonic()
            if method in self.last and now - self.last[method] < self.every:
                return None
            self.last[method] = now
            of = f"/{limit}" if limit else ""
            return f"{method}: round {rnd}{of}, {rest}\n"
        if any(k in text for k in self.KEEP):
            return text + "\n"
        return None


def stream_echo(quiet: bool, verbose: bool):
    """What of ``flwr run``'s stream a person sees: nothing, everything, or the progress
    (:class:`ProgressLines`).

    Parameters
    ----------
    quiet : bool
        Nothing (over ``verbose``).
    verbose : bool
        Everything.

    Returns
    -------
    bool or ProgressLines
        :func:`flwr_run_checked`'s ``echo``.
    """
    return False if quiet else True if verbose else ProgressLines()


def flwr_run_checked(
    app_dir: str,
    connection: str,
    env: dict,
    args: tuple[str, ...] = (),
    echo: bool | Callable[[str], str | None] = False,
    timeout: float | None = None,
) -> str:
    """``flwr run APP_DIR CONNECTION --stream ARGS``; returns its output when the run's
    status is ``finished:completed``, else raises :class:`RunFailed` (one line).

    Parameters
    ----------
    app_dir : str
        The Flower app's directory.
    connection : str
        The ``[superlink.NAME]`` connection the run goes to.
    env : dict
        The environment of ``flwr run`` and ``flwr ls``.
    args : tuple of str, optional
        More arguments of ``flwr run`` (e.g. ``("--run-config", path)``).
    echo : bool or callable, optional
        ``True``: the output is copied to stderr as it comes; a callable (e.g.
        :class:`ProgressLines`): what it returns for each line.
    timeout : float, optional
        Seconds the stream may last, checked at each line (``None``: no limit); past them
        the run fails.

    Returns
    -------
    str
        The run's output (stdout and stderr).
    """
    cmd = [console_script("flwr"), "run", app_dir, connection, "--stream", *args]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        for line in proc.stdout:
            lines.append(line)
            shown = echo(line) if callable(echo) else (line if echo else None)
            if shown:
                sys.stderr.write(shown)
                sys.stderr.flush()
            if deadline is not None and time.monotonic() > deadline:
                raise RunFailed(f"flwr run: did not finish within {timeout:.0f} s")
        proc.wait()
    finally:
        stop_process(proc, grace=5)
    output = "".join(lines)
    run_id = run_id_of(output)
    if run_id is None:
        tail = [ln for ln in _ANSI.sub("", output).splitlines() if ln.strip()][-1:]
        raise RunFailed(f"flwr run: no run started (exit {proc.returncode}): {' '.join(tail)}")
    for _ in range(50):  # the stream can end a moment before the status is written
        status, details = run_status(connection, run_id, env)
        if status.startswith("finished"):
            break
        time.sleep(0.2)
    if status != COMPLETED:
        raise RunFailed(failure_message(status, details, output))
    return output
