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

import argparse
import ipaddress
import os
import subprocess
import sys
import tempfile

from .simulation import _bin, flower_env, stop_process, wait_for_port  # noqa: F401


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def make_certificates(out: str, hosts: list[str] | None = None, days: int = 365) -> dict:
    """CA, SuperLink certificate (SAN: localhost, 127.0.0.1, ``hosts``).  Returns paths."""
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
    """An ECDSA P-384 key pair for SuperNode authentication: ``(private, public)`` paths."""
    path = os.path.join(out, name)
    for p in (path, path + ".pub"):
        if os.path.exists(p):
            os.remove(p)
    _run(["ssh-keygen", "-t", "ecdsa", "-b", "384", "-N", "", "-q", "-C", name, "-f", path])
    return path, path + ".pub"


def start_superlink(
    home: str,
    port: int,
    certs: dict | None,
    auth: bool,
    database: str | None = None,
    log_name: str = "superlink.log",
):
    """A SuperLink (deployment engine) on ``127.0.0.1:port``; TLS when ``certs`` is given."""
    cmd = [
        _bin("flower-superlink"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    if certs is None:
        cmd.append("--insecure")
    else:
        cmd += [
            "--ssl-ca-certfile",
            certs["ca"],
            "--ssl-certfile",
            certs["cert"],
            "--ssl-keyfile",
            certs["key"],
        ]
    if auth:
        cmd.append("--enable-supernode-auth")
    cmd += ["--database", database or os.path.join(home, "state.db")]
    log = open(os.path.join(home, log_name), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, env=flower_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc.log_path = log.name
    return proc


def start_supernode(
    home: str,
    superlink: str,
    port: int,
    node_config: str,
    ca: str | None,
    private_key: str | None,
    log_name: str,
):
    """A SuperNode connected to ``superlink`` serving its ClientApp on ``127.0.0.1:port``."""
    cmd = [
        _bin("flower-supernode"),
        "--superlink",
        superlink,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--node-config",
        node_config,
    ]
    cmd += ["--insecure"] if ca is None else ["--root-certificates", ca]
    if private_key is not None:
        cmd += ["--auth-supernode-private-key", private_key]
    log = open(os.path.join(home, log_name), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, env=flower_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc.log_path = log.name
    return proc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strategies.runtime.deploy")
    sub = parser.add_subparsers(dest="command", required=True)
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
    a = parser.parse_args(argv)
    try:
        paths = make_certificates(a.out, a.host, a.days)
        keys = [make_node_key(a.out, f"node-{k + 1}") for k in range(a.nodes)]
    except (RuntimeError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"CA certificate:   {paths['ca']}  (give to every institution)")
    print(f"SuperLink cert:   {paths['cert']}  key: {paths['key']}")
    for priv, pub in keys:
        print(f"SuperNode key:    {priv}  (public: {pub})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
