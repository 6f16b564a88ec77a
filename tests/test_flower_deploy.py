"""Flower deployment runtime helpers (popri.federated.flower.deploy), issue 12.

    .venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests/test_flower_deploy.py
    .venv/bin/python -m pytest -q -p no:cacheprovider -m slow tests/test_flower_deploy.py

Unit tests check the certificates with a real TLS handshake, the node keys and the app directory
with flwr 1.41's own loaders/validators, and that cleanup ends a process tree that escaped into
its own session.  The slow tests run a real SuperLink + 3 SuperNodes on 127.0.0.1 (TLS + SuperNode
authentication) with the toy SecAgg+ app in tests/fixtures/flower_toy, and a timed-out run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from popri.federated import flower  # noqa: E402
from popri.federated.flower import deploy  # noqa: E402

TOY = Path(__file__).parent / "fixtures" / "flower_toy" / "flower_toy.py"


# --------------------------------------------------------------------------- certificates
def _handshake(certs: dict, cafile: Path, host: str = "127.0.0.1") -> None:
    """A TLS handshake over a socket pair: server = the SuperLink cert, client trusts cafile."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs["server_cert"], certs["server_key"])
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    errors: list[BaseException] = []

    def serve():
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.sendall(b"ok")
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=host) as c:
            assert c.recv(2) == b"ok"
    finally:
        t.join(10)


def test_make_certs_chain_and_san(tmp_path):
    from cryptography import x509

    certs = deploy.make_certs(tmp_path / "c", hosts=["10.1.2.3", "link.example.org"])
    assert set(certs) == {"ca_cert", "ca_key", "server_cert", "server_key"}
    ca = x509.load_pem_x509_certificate(certs["ca_cert"].read_bytes())
    srv = x509.load_pem_x509_certificate(certs["server_cert"].read_bytes())
    srv.verify_directly_issued_by(ca)  # raises on a broken chain
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not srv.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert ips == {"127.0.0.1", "10.1.2.3"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "link.example.org"}
    for key in ("ca_key", "server_key"):
        assert certs[key].stat().st_mode & 0o077 == 0
    # what flwr's clients do: verify the chain and the address they dial
    _handshake(certs, certs["ca_cert"], "127.0.0.1")
    _handshake(certs, certs["ca_cert"], "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, certs["ca_cert"], "10.9.9.9")  # not in the SAN


def test_make_certs_other_ca_is_rejected(tmp_path):
    certs = deploy.make_certs(tmp_path / "a")
    other = deploy.make_certs(tmp_path / "b")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, other["ca_cert"])


def test_node_keys_load_as_flwr_loads_them(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    keys = deploy.make_node_keys(tmp_path, "n0")
    priv = load_ssh_private_key(keys["private"].read_bytes(), password=None)  # supernode side
    assert isinstance(priv, ec.EllipticCurvePrivateKey) and priv.curve.name == "secp384r1"
    registered = try_load_public_key(keys["public"])  # `flwr supernode register` side
    assert registered == public_key_to_bytes(priv.public_key())
    assert keys["private"].stat().st_mode & 0o077 == 0
    assert deploy.make_node_keys(tmp_path, "n1")["public"].read_bytes() != \
        keys["public"].read_bytes()


# --------------------------------------------------------------------------- app directory
def test_app_dir_pyproject_valid_for_flwr(tmp_path):
    from flwr.cli.config_utils import load_and_validate
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    cfg = {"job": "/srv/job dir/it's \"x\"\\y", "nodes": 3, "z": 0.5, "release": False,
           "nested": {"k": 1}}
    app = deploy.app_dir(tmp_path / "app", config=cfg)
    data = tomllib.loads((app / "pyproject.toml").read_text())
    comps = data["tool"]["flwr"]["app"]["components"]
    assert comps == {"serverapp": flower.SERVER_APP, "clientapp": flower.CLIENT_APP}
    assert data["tool"]["flwr"]["app"]["config"]["job"] == cfg["job"]
    assert deploy.app_config_keys(app) == {"job", "nodes", "z", "release", "nested.k"}
    config, errors = load_and_validate(app / "pyproject.toml", check_module=False)
    assert config is not None and not errors, errors
    # the run-config override file run_loopback writes, read back the way flwr reads it
    over = tmp_path / "over.toml"
    over.write_text(deploy.toml_table({"job": "/other", "z": 1.25}))
    fused = get_fused_config_from_dir(app, parse_config_args([str(over)]))
    assert fused == {"job": "/other", "nodes": 3, "z": 1.25, "release": False, "nested.k": 1}
    with pytest.raises(ValueError):
        deploy.app_dir(tmp_path / "bad", server="no_colon")


def test_app_dir_default_components_resolve(tmp_path):
    import importlib.util

    if importlib.util.find_spec("popri.apps.flower.server_app") is None:
        pytest.skip("popri's Flower apps not written yet")
    from flwr.cli.config_utils import load_and_validate

    app = deploy.app_dir(tmp_path / "app", config={"job": ""})
    config, errors = load_and_validate(app / "pyproject.toml", check_module=True)
    assert config is not None and not errors, errors  # what `flwr run` checks before shipping


def test_node_config_arg_round_trips_through_flwr():
    from flwr.common.config import parse_config_args

    cfg = {"data-path": "/data/client one/x.jsonl", "partition": 2, "w": 0.5, "on": True}
    arg = deploy.node_config_arg(cfg)
    assert "data-path='/data/client one/x.jsonl'" in arg
    assert parse_config_args([arg]) == cfg
    with pytest.raises(ValueError):
        deploy.node_config_arg({"data-path": "/it's"})


def test_write_flwr_config_read_by_flwr(tmp_path, monkeypatch):
    from flwr.cli.flower_config import read_superlink_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    certs = deploy.make_certs(tmp_path / "c")
    deploy.write_flwr_config(tmp_path / "home", "10.0.0.5:8000",
                             root_certificates=certs["ca_cert"])
    conn = read_superlink_connection(deploy.CONNECTION)
    assert conn.address == "10.0.0.5:8000" and not conn.insecure
    assert Path(conn.root_certificates) == certs["ca_cert"].resolve()
    deploy.write_flwr_config(tmp_path / "home", "127.0.0.1:9")
    assert read_superlink_connection(None).insecure  # the default connection


def test_binaries_from_this_interpreter():
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        assert deploy.flower_bin(name).parent == Path(sys.executable).parent
    with pytest.raises(FileNotFoundError):
        deploy.flower_bin("no-such-flower-binary")


def test_auth_needs_tls(tmp_path):
    with pytest.raises(ValueError):
        deploy.Loopback(tmp_path, [{}], tls=False, auth=True)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
@pytest.mark.parametrize("orphan", [False, True])
def test_stop_ends_a_tree_that_left_the_process_group(tmp_path, orphan):
    """A child that setsid()s away (as flower-superlink's SuperExec does) is still ended, also
    when its parent died first and it was re-parented (found by the environment mark)."""
    lb = deploy.Loopback(tmp_path, [{}], grace=2.0)
    pidfile = tmp_path / "grandchild.pid"
    code = ("import pathlib, subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " start_new_session=True); "
            f"pathlib.Path({str(pidfile)!r}).write_text(str(p.pid)); "
            f"time.sleep({0 if orphan else 120})")
    grandchild = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                proc = lb._start("tree", [sys.executable, "-c", code], tmp_path / "home")
                deadline = time.monotonic() + 20
                while not pidfile.exists() or not pidfile.read_text():
                    assert time.monotonic() < deadline, proc.log.read_text()
                    time.sleep(0.05)
                grandchild = int(pidfile.read_text())
                assert deploy._alive(grandchild)
                assert os.getsid(grandchild) == grandchild  # left the group and the session
                if orphan:
                    proc.popen.wait(20)
                    assert grandchild not in deploy._descendants([proc.popen.pid])
                raise KeyboardInterrupt  # a Ctrl-C inside `with Loopback(...)`
            finally:
                lb.stop()
        assert not deploy._alive(grandchild)
        assert proc.popen.returncode is not None
        assert lb.survivors() == set()
    finally:
        if grandchild and deploy._alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


# --------------------------------------------------------------------------- loopback (slow)
def _toy_app(tmp_path: Path, n: int) -> tuple[Path, list[Path]]:
    app = deploy.app_dir(tmp_path / "app", server="flower_toy:server_app",
                         client="flower_toy:client_app", config={"num-clients": n, "out": ""},
                         name="popri-toy")
    shutil.copy(TOY, app)  # shipped inside the FAB
    data = []
    for i in range(n):
        data.append(tmp_path / f"node{i}.txt")
        data[-1].write_text(f"{i + 1}\n")
    return app, data


@pytest.mark.slow
def test_loopback_tls_auth_three_supernodes_secagg_sum(tmp_path):
    app, data = _toy_app(tmp_path, 3)
    out = tmp_path / "sum.npy"
    t0 = time.monotonic()
    res = deploy.run_loopback(app, data, {"out": str(out)}, tls=True, auth=True,
                              timeout=240, startup_timeout=90, work_dir=tmp_path / "work")
    took = time.monotonic() - t0
    print(f"loopback: startup {res.startup_seconds:.1f}s, run {res.seconds:.1f}s, "
          f"total {took:.1f}s")
    assert res.ok and res.run_id
    np.testing.assert_allclose(np.load(out), np.full(8, 6.0), atol=1e-3)
    assert res.leftover == set() and deploy._marked(res.token) == set()
    link = res.logs["superlink"].read_text()
    assert "--enable-supernode-auth" in link and "https://127.0.0.1" in link
    for i in range(3):
        assert (res.work_dir / "logs" / f"register-{i}.log").read_text().count(
            "registered successfully") == 1
    assert took < 240


@pytest.mark.slow
def test_loopback_timeout_raises_and_ends_everything(tmp_path):
    app, data = _toy_app(tmp_path, 2)
    lb = deploy.Loopback(tmp_path / "work", [{"data-path": str(p)} for p in data], tls=False,
                         auth=False, startup_timeout=90)
    # 3 clients expected, 2 connected: the ServerApp waits, the run cannot finish
    with pytest.raises(deploy.DeployError, match="flwr-run.log"):
        with lb:
            lb.run(app, {"out": str(tmp_path / "never.npy"), "num-clients": 3}, timeout=6)
    assert lb.survivors() == set()
    assert deploy._marked(lb.token) == set()
    assert not (tmp_path / "never.npy").exists()


_LOOPBACK_SCORE = (
    "import sys\n"
    "from popri.federated.flower import deploy, engine\n"
    "def simulate(job, *, timeout):\n"
    "    r = deploy.loopback_job(job, timeout=timeout)\n"
    "    assert r.ok and not r.leftover, r\n"
    "    print(f'loopback: startup {r.startup_seconds:.1f}s run {r.seconds:.1f}s',"
    " file=sys.stderr)\n"
    "    return r.startup_seconds + r.seconds\n"
    "engine.simulate = simulate  # the simulation runtime -> a TLS + node-auth deployment\n"
    "from popri.cli.app import main\n"
    "sys.argv = ['popri', *sys.argv[1:]]\n"
    "main()\n")


@pytest.mark.slow
def test_popri_round_on_a_loopback_deployment_equals_in_process(tmp_path):
    """One POPri round through popri's own ServerApp/ClientApp on SuperLink + 4 SuperNodes."""
    import subprocess

    from popri.core import io

    rng = np.random.default_rng(0)
    io.save_embedding_set(tmp_path / "priv.npy", rng.normal(size=(150, 16)),
                          [{"id": f"p{i}", "client_id": f"c{i // 5}"} for i in range(150)],
                          meta={"model": "toy"})
    io.save_embedding_set(tmp_path / "syn.npy", rng.normal(size=(400, 16)),
                          [{"id": f"s{i}"} for i in range(400)], meta={"model": "toy"})
    base = ["score", "--private", str(tmp_path / "priv.npy"), "--synthetic",
            str(tmp_path / "syn.npy"), "--seed", "1", "--mode", "cosine", "-z", "0",
            "--clients-per-round", "12"]
    env = dict(os.environ, POPRI_THREADS="2")
    r = subprocess.run([sys.executable, "-m", "popri.cli.app", *base, "--out",
                        str(tmp_path / "a.npy")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-c", _LOOPBACK_SCORE, *base, "--out",
                        str(tmp_path / "b.npy"), "--engine", "flower", "--supernodes", "4",
                        "--secagg-mechanism", "ddg", "--flower-timeout", "300"],
                       capture_output=True, text=True, env=env, timeout=420)
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stderr[-400:])
    assert "loopback: startup" in r.stderr
    a, side_a = io.load_scores(tmp_path / "a.npy")
    b, side_b = io.load_scores(tmp_path / "b.npy")
    eng = side_b["params"]["engine"]
    assert eng["engine"] == "flower" and eng["survivors"] == 4
    assert np.abs(a - b).max() <= eng["quantisation_bound"] / side_a["params"]["denominator"] \
        + 1e-6
    assert side_b["ledger"][0]["mechanism"] == "distributed_discrete_gaussian"


@pytest.mark.slow
@pytest.mark.min_flower
def test_popri_and_pe_rounds_via_popri_score_federation_on_a_loopback_deployment(tmp_path):
    """The user's command for a deployment round: `popri score --engine flower --federation
    popri --supernodes 3` with NO --private -- each SuperNode holds one client's embeddings
    (its `data-path`).  A POPri (cosine) and a PE (nn-histogram) round on one SuperLink with TLS
    and node authentication; each equals the in-process round over the same three clients."""
    import subprocess

    from popri.core import io

    rng = np.random.default_rng(0)
    syn = rng.normal(size=(60, 16))
    io.save_embedding_set(tmp_path / "syn.npy", syn, [{"id": f"s{i}"} for i in range(60)],
                          meta={"model": "toy"})
    sizes, rows, emb, nodes = (5, 3, 4), [], [], []
    for c, k in enumerate(sizes):
        x = rng.normal(size=(k, 16))
        nodes.append(tmp_path / f"client{c}.npy")   # what the client's machine holds
        io.save_embedding_set(nodes[-1], x, [{"id": f"c{c}-{j}"} for j in range(k)],
                              meta={"model": "toy"})
        emb.append(x)
        rows += [{"id": f"c{c}-{j}", "client_id": f"c{c}"} for j in range(k)]
    io.save_embedding_set(tmp_path / "priv.npy", np.concatenate(emb), rows,
                          meta={"model": "toy"})  # the same clients, for the in-process check
    env = dict(os.environ, POPRI_THREADS="2")

    def score(*args, **kw):
        return subprocess.run([sys.executable, "-m", "popri.cli.app", "score", "--synthetic",
                               str(tmp_path / "syn.npy"), "--seed", "1", "-z", "0", *args],
                              capture_output=True, text=True, timeout=420, **kw)

    lb = deploy.Loopback(tmp_path / "work", [{"data-path": str(p)} for p in nodes], tls=True,
                         auth=True, startup_timeout=90)
    with lb:
        for mode in ("cosine", "nn-histogram"):
            out = tmp_path / f"{mode}-dep.npy"
            t0 = time.monotonic()
            r = score("--mode", mode, "--out", str(out), "--engine", "flower", "--federation",
                      deploy.CONNECTION, "--supernodes", "3", "--flower-timeout", "300",
                      env=dict(env, FLWR_HOME=str(lb.flwr_home)))
            print(f"{mode}: deployment round {time.monotonic() - t0:.1f}s")
            assert r.returncode == 0, r.stderr[-3000:]
            ref = score("--mode", mode, "--private", str(tmp_path / "priv.npy"), "--out",
                        str(tmp_path / f"{mode}-ref.npy"), env=env)
            assert ref.returncode == 0, ref.stderr[-2000:]
            a, side_a = io.load_scores(tmp_path / f"{mode}-ref.npy")
            b, side_b = io.load_scores(out)
            eng = side_b["params"]["engine"]
            assert eng["survivors"] == 3 and side_b["params"]["sampling"] == "none"
            assert side_b["params"]["reduce"] == side_a["params"]["reduce"] == "sum"
            assert np.abs(a - b).max() <= eng["quantisation_bound"] + 1e-6
            if mode == "nn-histogram":
                np.testing.assert_array_equal(a, b)
            led = side_b["ledger"][0]
            assert led["mechanism"] == "distributed_discrete_gaussian"
            assert led["sample_rate"] == 1.0
            # refusals: a deployment round reads no private data here
            bad = score("--mode", mode, "--out", str(tmp_path / "x.npy"), "--engine", "flower",
                        "--federation", deploy.CONNECTION, "--supernodes", "3", "--private",
                        str(tmp_path / "priv.npy"), env=env)
            assert bad.returncode == 2 and "SuperNodes" in bad.stderr
    assert lb.survivors() == set() and deploy._marked(lb.token) == set()
