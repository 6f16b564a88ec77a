"""What a Flower deployment of popri's apps needs on disk: certificates, SuperNode keys, the app
directory, the ``flwr`` CLI's connection config and the node config argument.

    python -c "from popri.federated.flower.deploy_files import make_certs; make_certs('certs')"
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_flower_deploy.py

docs/flower.md is the recipe for a multi-machine run; :mod:`popri.federated.flower.deploy` runs
the processes (SuperLink, SuperNodes, ``flwr run``) with these files, and on 127.0.0.1 for tests.

* :func:`make_certs` -- a self-signed CA and a server certificate (SANs 127.0.0.1, localhost and
  any extra hosts) for the SuperLink's single HTTPS port (Fleet, Control and Runtime APIs).
* :func:`make_node_keys` -- a SuperNode's authentication key pair (ECDSA P-384, OpenSSH format:
  ``flower-supernode --auth-supernode-private-key``, ``flwr supernode register PUB``).
* :func:`app_dir` -- the thin Flower app directory: a ``pyproject.toml`` whose components point
  at importable ``module:attr`` references (the popri apps in the installed package) and whose
  ``[tool.flwr.app.config]`` holds the run config keys (``--run-config`` may only override keys
  present there).
* :func:`write_flwr_config` -- the ``flwr`` CLI's SuperLink connection (``$FLWR_HOME/config.toml``;
  flwr 1.41 no longer reads ``[tool.flwr.federations]`` from the app's pyproject).
* :func:`node_config_arg` -- a SuperNode's ``--node-config`` string.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any

from popri.federated.flower import CLIENT_APP, SERVER_APP

CONNECTION = "popri"  # the SuperLink connection name written to $FLWR_HOME/config.toml
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# --------------------------------------------------------------------------- certificates
def make_certs(directory: str | Path, hosts: tuple[str, ...] | list[str] = (), *,
               days: int = 365) -> dict[str, Path]:
    """A self-signed CA and a server certificate for the SuperLink, as PEM files.

    The server certificate's subjectAltName always holds ``127.0.0.1`` and ``localhost`` (the
    SuperLink's own SuperExec reaches its Runtime API there, even behind ``--host 0.0.0.0``),
    plus ``hosts`` (IP addresses or DNS names the SuperNodes and the ``flwr`` CLI dial).
    Returns paths ``ca_cert``, ``ca_key``, ``server_cert``, ``server_key``; the keys are 0600.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc)
    start, end = now - _dt.timedelta(days=1), now + _dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "popri flower CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(ca_ski, critical=False)
               .sign(ca_key, hashes.SHA384()))

    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in ("127.0.0.1", "localhost", *hosts):
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(next(iter(
        [h for h in hosts if h] or ["localhost"]))))])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                         content_commitment=False, data_encipherment=False,
                                         key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_ski), critical=False)
            .sign(ca_key, hashes.SHA384()))

    pem = serialization.Encoding.PEM
    paths = {"ca_cert": out / "ca.crt", "ca_key": out / "ca.key",
             "server_cert": out / "server.pem", "server_key": out / "server.key"}
    paths["ca_cert"].write_bytes(ca_cert.public_bytes(pem))
    paths["server_cert"].write_bytes(cert.public_bytes(pem))
    for name, k in (("ca_key", ca_key), ("server_key", key)):
        _write_secret(paths[name], k.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return paths


def make_node_keys(directory: str | Path, name: str = "node") -> dict[str, Path]:
    """A SuperNode authentication key pair: ECDSA P-384 in OpenSSH format (what flwr 1.41 loads).

    ``private`` (``NAME``, 0600) goes to ``flower-supernode --auth-supernode-private-key``;
    ``public`` (``NAME.pub``) is registered on the SuperLink with ``flwr supernode register``.
    Same as ``ssh-keygen -t ecdsa -b 384 -N '' -f NAME``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = {"private": out / name, "public": out / f"{name}.pub"}
    _write_secret(paths["private"], key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()))
    paths["public"].write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b" popri\n")
    return paths


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


# --------------------------------------------------------------------------- app directory
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        return json.dumps(os.fspath(value))  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"run config values must be str/int/float/bool/list, got {type(value)}")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def flat_keys(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_keys(value, name + "."))
        else:
            out[name] = value
    return out


def toml_table(config: dict[str, Any]) -> str:
    """``key = value`` lines for a flat (or nested, flattened with dots) run config."""
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in flat_keys(config).items())


def app_dir(dest: str | Path, server: str = SERVER_APP, client: str = CLIENT_APP,
            config: dict[str, Any] | None = None, *, name: str = "popri-feedback",
            version: str = "1.0.0", publisher: str = "popri") -> Path:
    """Write the thin Flower app directory ``dest`` (a ``pyproject.toml``) and return it.

    ``server`` / ``client`` are ``module:attr`` references; a module not shipped inside ``dest``
    is imported from the Python environment of the machine that runs it (popri installed
    there).  ``config`` is ``[tool.flwr.app.config]``: the run config defaults, and the only keys
    ``flwr run --run-config`` can override (e.g. ``{"job": "/srv/popri/job"}``).  No runtime
    dependencies are declared: start the SuperLink with
    ``--disable-runtime-dependency-installation`` so it does not ``uv sync`` per run.
    """
    for ref in (server, client):
        mod, _, attr = ref.partition(":")
        if not mod or not attr:
            raise ValueError(f"component {ref!r} is not 'module:attr'")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
        raise ValueError(f"bad app name {name!r}")
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    text = (
        "# Flower app (FAB) for popri's client feedback; written by "
        "popri.federated.flower.deploy.app_dir\n"
        "[build-system]\nrequires = [\"hatchling\"]\nbuild-backend = \"hatchling.build\"\n\n"
        f"[project]\nname = {json.dumps(name)}\nversion = {json.dumps(version)}\n"
        "description = \"popri client feedback (DP synthetic text) over SecAgg+\"\n"
        "license = \"Apache-2.0\"\n"
        "dependencies = [\"flwr>=1.41.0,<1.42\"]\n\n"
        f"[tool.flwr.app]\npublisher = {json.dumps(publisher)}\n\n"
        f"[tool.flwr.app.components]\nserverapp = {json.dumps(server)}\n"
        f"clientapp = {json.dumps(client)}\n\n"
        "[tool.flwr.app.config]\n" + toml_table(config or {}))
    (out / "pyproject.toml").write_text(text, encoding="utf-8")
    return out


def app_config_keys(app: str | Path) -> set[str]:
    """The (flattened) run config keys an app directory declares."""
    import tomllib

    with open(Path(app) / "pyproject.toml", "rb") as fh:
        data = tomllib.load(fh)
    return set(flat_keys(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})))


def write_flwr_config(flwr_home: str | Path, address: str, *, root_certificates: str | Path
                      | None = None, name: str = CONNECTION) -> Path:
    """Write ``$FLWR_HOME/config.toml`` with one SuperLink connection ``name`` (the default).

    TLS when ``root_certificates`` (the CA file) is given, else ``insecure = true``.
    """
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    lines = [f"[superlink]\ndefault = {json.dumps(name)}\n\n", f"[superlink.{_toml_key(name)}]\n",
             f"address = {json.dumps(address)}\n"]
    if root_certificates is not None:
        lines.append(f"root-certificates = {json.dumps(str(Path(root_certificates).resolve()))}\n")
    else:
        lines.append("insecure = true\n")
    path = home / "config.toml"
    path.write_text("".join(lines), encoding="utf-8")
    return path


def node_config_arg(config: dict[str, Any]) -> str:
    """The ``--node-config`` value: ``key='value' k2=3`` (TOML literals; paths single-quoted)."""
    parts = []
    for key, value in flat_keys(config).items():
        if isinstance(value, (str, os.PathLike)):
            s = os.fspath(value)
            if "'" in s or "\n" in s:
                raise ValueError(f"node config value {s!r} may not contain ' or a newline")
            parts.append(f"{key}='{s}'")
        else:
            lit = _toml_value(value)
            if " " in lit:
                raise ValueError(f"node config value {value!r} must not contain spaces")
            parts.append(f"{key}={lit}")
    return " ".join(parts)
