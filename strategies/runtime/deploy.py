"""Deployment helpers: certificates and keys for a federation, and starting a SuperLink or a
SuperNode as a child process that the caller stops by pid.

``python -m strategies.runtime.deploy certs --out DIR --nodes 3 [--host HOST ...]`` writes

- ``ca.crt``/``ca.key``: a private certificate authority (keep ``ca.key`` offline);
- ``server.pem``/``server.key``: the SuperLink's TLS certificate, valid for ``localhost``,
  ``127.0.0.1`` and every ``--host``;
- ``node-K``/``node-K.pub``: one ECDSA (P-384) key pair per institution (SuperNode
  authentication; register the ``.pub`` with ``flwr supernode register``).

It uses ``openssl`` and ``ssh-keygen``, as Flower's own examples do.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from ..errors import InputError
from .processes import console_script, flower_env


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def make_certificates(out: str, hosts: list[str] | None = None, days: int = 365) -> dict:
    """CA, SuperLink certificate (SAN: localhost, 127.0.0.1, ``hosts``).

    Parameters
    ----------
    out : str
        The directory the files are written to (created if needed).
    hosts : list of str, optional
        More host names or IP addresses the SuperLink's certificate is valid for.
    days : int, optional
        How many days both certificates are valid.

    Returns
    -------
    dict
        The paths: ``ca`` (``ca.crt``), ``cert`` (``server.pem``) and ``key``
        (``server.key``).
    """
    os.makedirs(out, exist_ok=True)
    ca_key, ca_crt = os.path.join(out, "ca.key"), os.path.join(out, "ca.crt")
    key, csr, pem = (os.path.join(out, n) for n in ("server.key", "server.csr", "server.pem"))
    names = ["localhost", "127.0.0.1", *(hosts or [])]
    san = []
    for h in dict.fromkeys(names):
        try:
            ipaddress.ip_address(h)
            san.append(f"IP:{h}")
        except ValueError:
            san.append(f"DNS:{h}")
    _run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:4096",
            "-nodes",
            "-sha256",
            "-days",
            str(days),
            "-keyout",
            ca_key,
            "-out",
            ca_crt,
            "-subj",
            "/CN=pfl-geo federation CA",
        ]
    )
    _run(
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:4096",
            "-nodes",
            "-sha256",
            "-keyout",
            key,
            "-out",
            csr,
            "-subj",
            "/CN=pfl-geo superlink",
        ]
    )
    with tempfile.NamedTemporaryFile("w", suffix=".ext", delete=False) as ext:
        ext.write(
            f"subjectAltName={','.join(san)}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
    try:
        _run(
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                csr,
                "-CA",
                ca_crt,
                "-CAkey",
                ca_key,
                "-CAcreateserial",
                "-out",
                pem,
                "-days",
                str(days),
                "-sha256",
                "-extfile",
                ext.name,
            ]
        )
    finally:
        os.unlink(ext.name)
    os.chmod(ca_key, 0o600)
    os.chmod(key, 0o600)
    return {"ca": ca_crt, "cert": pem, "key": key}


def make_node_key(out: str, name: str) -> tuple[str, str]:
    """An ECDSA P-384 key pair for SuperNode authentication.

    Parameters
    ----------
    out : str
        The directory of the keys.
    name : str
        The private key's file name (and the key's comment); the public key's adds ``.pub``.
        A pair of that name already there is replaced.

    Returns
    -------
    tuple of str
        ``(private, public)`` paths.
    """
    path = os.path.join(out, name)
    for p in (path, path + ".pub"):
        if os.path.exists(p):
            os.remove(p)
    _run(["ssh-keygen", "-t", "ecdsa", "-b", "384", "-N", "", "-q", "-C", name, "-f", path])
    return path, path + ".pub"


# -- the commands of a deployment: one source for the docs, the operator and the tests ----
def superlink_command(
    host: str, port: int, certs_dir: str | None, database: str, auth: bool = True
) -> list[str]:
    """``flower-superlink`` serving Fleet, Control and runtime APIs on ``host:port``: TLS
    from ``certs_dir``, SuperNode authentication, its state in ``database``, and no
    dependency installation at run time (the app's dependencies are installed with the
    project).

    Parameters
    ----------
    host : str
        The address it binds (``--host``).
    port : int
        The port it listens on.
    certs_dir : str or None
        The directory of ``ca.crt``, ``server.pem`` and ``server.key``; ``None``: insecure.
    database : str
        Where its state is kept (``--database``).
    auth : bool, optional
        Whether SuperNodes must authenticate (``--enable-supernode-auth``).

    Returns
    -------
    list of str
        The command's words.
    """
    cmd = ["flower-superlink", "--host", host, "--port", str(port)]
    if certs_dir is None:
        cmd.append("--insecure")
    else:
        cmd += [
            "--ssl-ca-certfile",
            os.path.join(certs_dir, "ca.crt"),
            "--ssl-certfile",
            os.path.join(certs_dir, "server.pem"),
            "--ssl-keyfile",
            os.path.join(certs_dir, "server.key"),
        ]
    if auth:
        cmd.append("--enable-supernode-auth")
    return cmd + ["--database", database, "--disable-runtime-dependency-installation"]


#: The SuperNode's environment in a plan: its SuperExec looks for a new message every 0.1 s
#: instead of Flower's 1 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 0.01-60 s), up to 0.9 s
#: less per round (docs/performance.md, "Cost of a round").
SUPERNODE_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


def supernode_command(
    superlink: str, ca: str | None, private_key: str | None, port: int, node_config: str
) -> list[str]:
    """``flower-supernode`` of one site: connected to ``superlink``, its ClientApp served
    on ``127.0.0.1:port``.

    Parameters
    ----------
    superlink : str
        The SuperLink's address (``host:port``).
    ca : str or None
        The CA certificate (``--root-certificates``); ``None``: insecure.
    private_key : str or None
        The node's private key for SuperNode authentication; ``None``: none.
    port : int
        The local port (a different port for each SuperNode on one host).
    node_config : str
        The node config (``--node-config``), e.g. ``data-path="..." site="..." index=0``.

    Returns
    -------
    list of str
        The command's words.
    """
    cmd = ["flower-supernode", "--superlink", superlink]
    cmd += ["--insecure"] if ca is None else ["--root-certificates", ca]
    if private_key is not None:
        cmd += ["--auth-supernode-private-key", private_key]
    return cmd + ["--host", "127.0.0.1", "--port", str(port), "--node-config", node_config]


@dataclass
class PlanSite:
    """One institution of a deployment plan (paths as they are on its machine)."""

    site: str
    data_path: str
    lat: float | None = None
    lon: float | None = None
    key: str = ""  # its private key (``node-K`` by default; the ``.pub`` is registered)
    port: int = 0  # its SuperNode's local port (``9094 + K`` by default)


@dataclass
class Plan:
    """Every command of a deployment, in the order they are run."""

    connection: str
    superlink: list[str]
    flower_config: dict
    register: list[list[str]]
    supernodes: dict[str, list[str]]
    run_config: dict
    run: list[str]
    supernode_env: dict[str, str] = field(default_factory=lambda: dict(SUPERNODE_ENV))

    def text(self) -> str:
        """The plan as an operator reads it (shell commands and TOML, with headings)."""
        out = [
            "# 1. the SuperLink (coordinator's machine)",
            shell(self.superlink),
            "",
            "# 2. the connection, made the default (in $FLWR_HOME/config.toml, ~/.flwr by "
            "default),",
            "#    so that flwr ls / log / stop never start a local SuperLink of their own",
            *_commented(toml_text(self.flower_config)),
            "",
            "# 3. each hospital's public key, registered (coordinator's machine)",
            *(shell(cmd) for cmd in self.register),
            "",
            "# 4. each hospital's SuperNode (its own machine, its own data file)",
        ]
        env = [f"{k}={shlex.quote(v)}" for k, v in self.supernode_env.items()]
        for site, cmd in self.supernodes.items():
            out += [f"#    {site}", " ".join([*env, shell(cmd)])]
        out += [
            "",
            "# 5. the run (coordinator's machine); exits non-zero unless the run completed.",
            "#    run_config.toml:",
            *_commented(toml_text(self.run_config)),
            shell(self.run),
        ]
        return "\n".join(out) + "\n"


def _commented(text: str) -> list[str]:
    return [f"#    {ln}" if ln else "#" for ln in text.splitlines()]


def toml_text(doc: dict) -> str:
    import tomli_w

    return tomli_w.dumps(doc).strip()


def shell(cmd: list[str], width: int = 88) -> str:
    """``cmd`` quoted for a POSIX shell; when longer than ``width``, one ``--flag value``
    per continued line.

    Parameters
    ----------
    cmd : list of str
        The command's words; those before its first ``--`` option stay on the first line.
    width : int, optional
        The longest command kept on one line.

    Returns
    -------
    str
        The command line.
    """
    words = [shlex.quote(w) for w in cmd]
    line = " ".join(words)
    if len(line) <= width:
        return line
    k = 1
    while k < len(words) and not words[k].startswith("--"):  # the command, its arguments
        k += 1
    parts = [" ".join(words[:k])]
    while k < len(words):
        if words[k].startswith("-") and k + 1 < len(words) and not words[k + 1].startswith("-"):
            parts.append(f"{words[k]} {words[k + 1]}")
            k += 2
        else:
            parts.append(words[k])
            k += 1
    return " \\\n    ".join(parts)


def make_plan(
    address: str,
    certs_dir: str,
    sites: list[PlanSite],
    run_config: dict,
    connection: str = "hospitals",
    superlink_host: str = "0.0.0.0",
    database: str = "state.db",
    run_config_path: str = "run_config.toml",
    app_dir: str = ".",
    python: str = "python",
    keys_dir: str | None = None,
) -> Plan:
    """The commands of a deployment over ``sites`` with a SuperLink reached at ``address``,
    TLS from ``certs_dir`` and SuperNode authentication.

    Parameters
    ----------
    address : str
        ``host:port`` at which the SuperNodes reach the SuperLink; the SuperLink listens on
        its port.
    certs_dir : str
        The directory of :func:`make_certificates`'s files: the SuperLink's TLS, and
        ``ca.crt`` for the SuperNodes and the connection.
    sites : list of PlanSite
        The institutions, each with its own ``site``.  One without ``key`` gets
        ``node-K`` in ``keys_dir`` and one without ``port`` gets ``9093 + K`` (the K-th
        site, from 1).
    run_config : dict
        The run's keys (:func:`plan_run_config`); its ``task`` (default ``grauc``) sets the
        form of the node configs, and ``registration.sites`` is added.
    connection : str, optional
        The name of the ``[superlink.NAME]`` connection.
    superlink_host : str, optional
        The address the SuperLink binds.
    database : str, optional
        Where the SuperLink keeps its state.
    run_config_path : str, optional
        The run config's file in the run command.
    app_dir : str, optional
        The project directory in the run command.
    python : str, optional
        The interpreter of the run command.
    keys_dir : str, optional
        The directory of the default keys (and their ``.pub`` to register); default:
        ``certs_dir``.

    Returns
    -------
    Plan
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"address: expected HOST:PORT, got {address!r}")
    if not sites:
        raise InputError("sites: no site given")
    names = [s.site for s in sites]
    if len(set(names)) != len(names):
        raise InputError(f"sites: a site id appears twice: {names}")
    ca = os.path.join(certs_dir, "ca.crt")
    keys_dir = certs_dir if keys_dir is None else keys_dir
    task = str(run_config.get("task", "grauc"))
    supernodes, register = {}, []
    for k, s in enumerate(sites):
        key = s.key or os.path.join(keys_dir, f"node-{k + 1}")
        register.append(["flwr", "supernode", "register", key + ".pub", connection])
        if task == "rowfed":
            node = f'data-path="{s.data_path}" client="{s.site}" index={k}'
        else:
            node = f'data-path="{s.data_path}" site="{s.site}" lat={s.lat} lon={s.lon} index={k}'
        supernodes[s.site] = supernode_command(address, ca, key, s.port or 9094 + k, node)
    return Plan(
        connection=connection,
        superlink=superlink_command(superlink_host, int(port), certs_dir, database),
        flower_config={
            "superlink": {
                "default": connection,
                connection: {"address": address, "root-certificates": os.path.abspath(ca)},
            }
        },
        register=register,
        supernodes=supernodes,
        run_config={**run_config, "registration.sites": ",".join(names)},
        run=[
            python,
            "-m",
            "strategies.runtime.deploy",
            "run",
            app_dir,
            connection,
            "--run-config",
            run_config_path,
        ],
    )


def start(
    cmd: list[str], home: str, log_name: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """``cmd`` as a child process in its own session, its output in ``home/log_name``,
    Flower's scripts from this interpreter; stop it by pid
    (:func:`~strategies.runtime.simulation.stop_process`).

    Parameters
    ----------
    cmd : list of str
        A plan's command.
    home : str
        Flower's home (``FLWR_HOME``) and the log's directory.
    log_name : str
        The log file's name in ``home`` (stdout and stderr).
    env : dict of str to str, optional
        Added to its environment (a SuperNode's: :attr:`Plan.supernode_env`).

    Returns
    -------
    subprocess.Popen
        The process; its ``log_path`` is the log file's path.
    """
    log = open(os.path.join(home, log_name), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [console_script(cmd[0]), *cmd[1:]],
        env={**flower_env(home), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    proc.log_path = log.name
    return proc


def read_plan_sites(path: str) -> list[PlanSite]:
    """The sites of a plan from a CSV: ``site, data_path`` and optionally ``lat, lon``
    (GrAUC-PFL needs them), ``key`` (the private key's path at the site) and ``port``."""
    from ..datasets.tables import read_table

    frame = read_table(path, "sites", dtype=str, keep_default_na=False)
    for column in ("site", "data_path"):
        if column not in frame.columns:
            raise InputError(f"sites: column {column!r} missing from {path}")
    out = []
    for row in frame.to_dict("records"):
        try:
            lat = float(row["lat"]) if row.get("lat", "") != "" else None
            lon = float(row["lon"]) if row.get("lon", "") != "" else None
            port = int(row["port"]) if row.get("port", "") != "" else 0
        except ValueError as exc:
            raise InputError(f"sites: site {row['site']}: {exc}") from None
        out.append(PlanSite(row["site"], row["data_path"], lat, lon, row.get("key", ""), port))
    return out


def plan_run_config(args, sites: list[PlanSite]) -> dict:
    """The run config of a planned run (the keys an operator sets; the rest default).

    Parameters
    ----------
    args : argparse.Namespace
        The ``plan`` subcommand's options (read: ``task``, ``method``, ``max_rounds``,
        ``responses``, ``round_timeout``, ``tune``, ``folds``, ``cv_criterion``,
        ``out_dir``).
    sites : list of PlanSite
        The institutions (GrAUC-PFL needs each one's ``lat`` and ``lon``).

    Returns
    -------
    dict
        The run-config keys.
    """
    rc = {"task": args.task, "method": args.method or args.task}
    if args.task == "grauc":
        missing = [s.site for s in sites if s.lat is None or s.lon is None]
        if missing:
            raise InputError(f"sites: lat and lon are needed for GrAUC-PFL (site {missing[0]})")
        rc.update({"data.num-sites": len(sites), "grauc.max-rounds": args.max_rounds})
    else:
        rc.update(
            {
                "rowfed-data.source": "deployment",
                "rowfed-data.num-clients": len(sites),
                "rowfed-data.responses": args.responses,
                "rowfed.max-rounds": args.max_rounds,
            }
        )
    rc["round-timeout"] = float(args.round_timeout)
    if args.tune:  # the tuning inside the federation, then the refit (docs/methods.md 3.12)
        if args.tune.startswith("gic") and args.task != "rowfed":
            raise InputError(f"tune: {args.tune} is RowFed's; GrAUC-PFL is tuned by cv")
        rc.update(
            {"tune.by": args.tune, "tune.folds": args.folds, "tune.criterion": args.cv_criterion}
        )
    if args.out_dir:
        if not os.path.isabs(args.out_dir):
            raise InputError(f"out-dir: must be an absolute path, got {args.out_dir!r}")
        rc["out-dir"] = args.out_dir
    return rc


def _plan(a) -> int:
    sites = read_plan_sites(a.sites)
    rc_path = os.path.join(a.write, "run_config.toml") if a.write else "run_config.toml"
    plan = make_plan(a.address, a.certs, sites, plan_run_config(a, sites), run_config_path=rc_path)
    if a.write:
        import tomli_w

        os.makedirs(a.write, exist_ok=True)
        with open(os.path.join(a.write, "config.toml"), "wb") as fh:
            tomli_w.dump(plan.flower_config, fh)
        with open(os.path.join(a.write, "run_config.toml"), "wb") as fh:
            tomli_w.dump(plan.run_config, fh)
    sys.stdout.write(plan.text())
    return 0


def _launch(a) -> int:
    from .launch import RunFailed, flwr_run_checked

    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    try:
        flwr_run_checked(a.app, a.connection, env, ("--run-config", a.run_config), echo=True)
    except RunFailed as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    return 0


def main(argv=None) -> int:
    from .cli import Parser

    parser = Parser(prog="python -m strategies.runtime.deploy")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    c = sub.add_parser("certs", help="CA, SuperLink certificate and SuperNode keys")
    c.add_argument("--out", required=True)
    c.add_argument("--nodes", type=int, default=3)
    c.add_argument(
        "--host",
        action="append",
        default=[],
        help="the SuperLink's host name or IP as institutions reach it (repeatable)",
    )
    c.add_argument("--days", type=int, default=365)
    p = sub.add_parser("plan", help="every command of a deployment, for the operator")
    p.add_argument("--address", required=True, help="HOST:PORT of the SuperLink")
    p.add_argument("--certs", default="certs", help="the certs command's --out directory")
    p.add_argument("--sites", required=True, help="CSV: site,data_path[,lat,lon,key,port]")
    p.add_argument("--task", choices=("grauc", "rowfed"), default="grauc")
    p.add_argument("--method", default="", help="comma-separated (default: the task's own)")
    p.add_argument("--max-rounds", type=int, default=100)
    p.add_argument("--round-timeout", type=float, default=120.0)
    p.add_argument("--responses", default="", help="rowfed: response columns, comma-separated")
    p.add_argument("--out-dir", default="", help="absolute results directory on the coordinator")
    p.add_argument(
        "--tune",
        choices=("cv", "gic", "gic-nq"),
        default="",
        help="tune the levels inside the federation first (gic, gic-nq: RowFed), then refit",
    )
    p.add_argument("--folds", type=int, default=5, help="--tune cv: folds within each site")
    p.add_argument(
        "--cv-criterion", choices=("folds", "pooled", "loss"), default="folds", help="--tune cv"
    )
    p.add_argument("--write", default="", help="write config.toml and run_config.toml here")
    r = sub.add_parser("run", help="flwr run, exit status 1 unless the run completed")
    r.add_argument("app", help="the project directory")
    r.add_argument("connection", help="the [superlink.NAME] connection")
    r.add_argument("--run-config", required=True, help="a TOML file or KEY=VALUE pairs")
    a = parser.parse_args(argv)
    try:
        if a.command == "plan":
            return _plan(a)
        if a.command == "run":
            return _launch(a)
        paths = make_certificates(a.out, a.host, a.days)
        keys = [make_node_key(a.out, f"node-{k + 1}") for k in range(a.nodes)]
    except (InputError, RuntimeError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"CA certificate:   {paths['ca']}  (give to every institution)")
    print(f"SuperLink cert:   {paths['cert']}  key: {paths['key']}")
    for priv, pub in keys:
        print(f"SuperNode key:    {priv}  (public: {pub})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
