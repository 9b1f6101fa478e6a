"""The deployment plan (``python -m strategies.runtime.deploy plan``) and the launcher's
exit status (``strategies/runtime/launch.py``): a run that did not complete exits non-zero
with one line, through the real simulation engine."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT

from strategies.runtime import deploy
from strategies.runtime.launch import app_error, failure_message, run_id_of

SITES = "site,data_path,lat,lon\nA,/d/a.csv,40.0,-75.0\nB,/d/b.csv,41.0,-74.0\n"


def plan_main(tmp_path, monkeypatch, capsys, *args, sites=SITES):
    (tmp_path / "sites.csv").write_text(sites)
    monkeypatch.chdir(tmp_path)
    code = deploy.main(["plan", "--address", "link.example:9093", "--sites", "sites.csv", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def commands(text: str) -> list[list[str]]:
    """The shell commands of a printed plan, split as a shell would (without the variables
    a command sets for itself: :func:`environments`)."""
    return [cmd for _, cmd in environments(text)]


def environments(text: str) -> list[tuple[dict, list[str]]]:
    """Each command of a printed plan with the ``NAME=value`` words before it."""
    joined = text.replace("\\\n", " ")
    out = []
    for ln in joined.splitlines():
        if not ln.strip() or ln[0] == "#":
            continue
        words = shlex.split(ln)
        k = 0
        while k < len(words) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[k]):
            k += 1
        out.append((dict(w.split("=", 1) for w in words[:k]), words[k:]))
    return out


def test_the_plan_has_every_flag_an_operator_needs(tmp_path, monkeypatch, capsys):
    code, out, _ = plan_main(
        tmp_path, monkeypatch, capsys, "--out-dir", "/r/run1", "--write", "w", "--max-rounds", "7"
    )
    assert code == 0
    cmds = commands(out)
    link = cmds[0]
    assert link[0] == "flower-superlink"
    for flag in ("--enable-supernode-auth", "--disable-runtime-dependency-installation"):
        assert flag in link
    assert link[link.index("--port") + 1] == "9093"
    registers = [c for c in cmds if c[:3] == ["flwr", "supernode", "register"]]
    assert [c[3:] for c in registers] == [
        ["certs/node-1.pub", "hospitals"],
        ["certs/node-2.pub", "hospitals"],
    ]
    nodes = [c for c in cmds if c[0] == "flower-supernode"]
    # each SuperNode's SuperExec polls for new messages every 0.1 s, not Flower's 1 s
    envs = [e for e, c in environments(out) if c[0] == "flower-supernode"]
    assert envs == [{"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}] * 2
    assert all(e == {} for e, c in environments(out) if c[0] != "flower-supernode")
    ports = [c[c.index("--port") + 1] for c in nodes]
    assert len(set(ports)) == 2  # two SuperNodes on one host do not collide
    assert nodes[1][nodes[1].index("--node-config") + 1] == (
        'data-path="/d/b.csv" site="B" lat=41.0 lon=-74.0 index=1'
    )
    assert cmds[-1] == [
        "python",
        "-m",
        "strategies.runtime.deploy",
        "run",
        ".",
        "hospitals",
        "--run-config",
        "w/run_config.toml",
    ]
    with open(tmp_path / "w" / "config.toml", "rb") as fh:
        flower = tomllib.load(fh)
    assert flower["superlink"]["default"] == "hospitals"
    assert flower["superlink"]["hospitals"]["address"] == "link.example:9093"
    with open(tmp_path / "w" / "run_config.toml", "rb") as fh:
        rc = tomllib.load(fh)
    assert rc["grauc.max-rounds"] == 7 and rc["data.num-sites"] == 2
    assert rc["registration.sites"] == "A,B" and rc["out-dir"] == "/r/run1"


def test_a_rowfed_plan_names_the_client(tmp_path, monkeypatch, capsys):
    sites = "site,data_path,key,port\nc1,/d/1.csv,/keys/k1,9200\nc2,/d/2.csv,/keys/k2,9201\n"
    code, out, _ = plan_main(
        tmp_path, monkeypatch, capsys, "--task", "rowfed", "--responses", "Y1", sites=sites
    )
    assert code == 0
    nodes = [c for c in commands(out) if c[0] == "flower-supernode"]
    assert (
        nodes[0][nodes[0].index("--node-config") + 1] == 'data-path="/d/1.csv" client="c1" index=0'
    )
    assert nodes[0][nodes[0].index("--auth-supernode-private-key") + 1] == "/keys/k1"
    assert nodes[1][nodes[1].index("--port") + 1] == "9201"
    assert "rowfed-data.source = " not in out  # keys are quoted TOML
    assert '"rowfed-data.source" = "deployment"' in out


@pytest.mark.parametrize(
    ("args", "sites", "message"),
    [
        (["--address", "nohost"], SITES, "address: expected HOST:PORT, got 'nohost'"),
        ([], "site,lat\nA,1\n", "sites: column 'data_path' missing"),
        ([], "site,data_path,lat,lon\nA,/a,1,1\nA,/b,1,1\n", "sites: a site id appears twice"),
        ([], "site,data_path\nA,/a\n", "sites: lat and lon are needed for GrAUC-PFL (site A)"),
        ([], "site,data_path,lat,lon\nA,/a,north,1\n", "sites: site A: could not convert"),
        (["--out-dir", "rel"], SITES, "out-dir: must be an absolute path, got 'rel'"),
        (["--task", "other"], SITES, "argument --task: invalid choice"),
    ],
)
def test_bad_plan_input_is_one_line(tmp_path, monkeypatch, capsys, args, sites, message):
    (tmp_path / "sites.csv").write_text(sites)
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--sites", "sites.csv", *args]
    if "--address" not in args:
        argv += ["--address", "h:1"]
    try:
        code = deploy.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_the_launcher_reads_the_servers_error_line():
    log = (
        "Successfully started run 1234\n"
        "\x1b[92mINFO \x1b[0m:      starting\n"
        "\x1b[91mERROR \x1b[0m:     error: site H2: data: column 'y' must be 0 or 1\n"
        "Traceback (most recent call last):\n"
    )
    assert run_id_of(log) == "1234"
    assert app_error(log) == "error: site H2: data: column 'y' must be 0 or 1"
    assert (
        failure_message("finished:failed", "x", log) == "site H2: data: column 'y' must be 0 or 1"
    )
    assert failure_message("finished:stopped", "N/A", "") == (
        "run: stopped before it finished (flwr stop)"
    )
    assert failure_message("finished:failed", "N/A", "") == (
        "run: finished:failed: see the run's log (flwr log RUN_ID)"
    )
    assert run_id_of("no run") is None


@pytest.mark.slow
def test_a_failed_simulation_run_exits_non_zero_with_one_line(tmp_path):
    """The main job's launcher on Flower's simulation engine: a bad setting makes the
    ServerApp fail (its status finished:failed, though ``flwr run`` exits 0); the launcher
    exits 2 with the ServerApp's one line and no traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grauc_flower",
            "run",
            "--num-sites",
            "3",
            "--run-config",
            "grauc.lam=-1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RAY_ADDRESS": "local"},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == "error: lam: must be >= 0, got -1.0"
    assert "Traceback" not in proc.stderr


def test_progress_lines_keep_the_rounds_and_drop_flowers_log():
    """The stream as Flower prints it (coloured level, the round logger's message): round
    lines reformatted, the first of a method always, then at most one per interval."""
    from strategies.runtime.launch import ProgressLines

    def flower(level, msg):
        return f"\x1b[92m{level} \x1b[0m:      {msg}\n"

    keep = ProgressLines(every=3600)
    assert keep(flower("INFO", "configure_fit: strategy sampled 4 clients (out of 4)")) is None
    assert keep(flower("INFO", "[ROUND 2]")) is None
    first = flower("INFO", "grauc round 1/300: objective 9.718, predicted decrease 17.4 (1.3 s)")
    assert keep(first) == "grauc: round 1/300, objective 9.718, predicted decrease 17.4 (1.3 s)\n"
    assert keep(flower("INFO", "grauc round 2/300: objective 1.7 (1.4 s)")) is None  # too soon
    assert keep(flower("INFO", "perfl-lsma round 1/1000: objective 3 (0.1 s)")).startswith(
        "perfl-lsma: round 1/1000"
    )
    line = "registration: 1 of 2 sites after 30 s (S1); waiting for S2"
    assert keep(flower("INFO", line)) == line + "\n"
    every = ProgressLines(every=0)
    assert every(flower("INFO", "fedavg round 7/100: objective 1.5 (2.0 s)")) is not None
    assert every(flower("INFO", "fedavg round 8/100: objective 1.4 (2.1 s)")) is not None


def test_round_logger_lines_are_what_progress_reads(caplog):
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    from strategies.runtime.engine import ROUND_LINE, round_logger

    before = FLOWER_LOGGER.propagate
    FLOWER_LOGGER.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger=FLOWER_LOGGER.name):
            round_logger("rowfed", every=5, limit=1000)(5, 1.25, None, 3.0)
            round_logger("rowfed", every=5, limit=1000)(6, 1.0, None, 3.0)  # not every 5th
    finally:
        FLOWER_LOGGER.propagate = before
    messages = [r.getMessage() for r in caplog.records if "round" in r.getMessage()]
    assert messages == ["rowfed round 5/1000: objective 1.25 (3.0 s)"]
    assert ROUND_LINE.search(messages[0]).groups() == (
        "rowfed",
        "5",
        "1000",
        "objective 1.25 (3.0 s)",
    )
