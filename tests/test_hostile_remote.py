"""Issue 37, the openai backend (hostile probe of 0.3.0, rows G01-G22): a server that answers
garbage, echoes secrets, or never answers is one line (or a prompt exit on a signal), never a
traceback, a printed password or API key, or a process only SIGKILL ends.

Each test runs a real ``popri gen --backend openai`` against a small fake OpenAI-compatible
server (a threaded ``http.server`` on 127.0.0.1, port 0) that this module starts.

    python -m pytest tests/test_hostile_remote.py -q
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import assert_one_line_error, write_jsonl

pytest.importorskip("openai")

OMEGA = [f"The committee met on day {i} to discuss the budget for the coming year." for i in range(8)]
GOOD = "the members agreed to fund new roads and schools next spring"


class FakeServer:
    """``reply(handler, body) -> (status, content_type, bytes)``, or None to never answer."""

    def __init__(self):
        self.reply = lambda h, body: (200, "application/json", _completion(body))
        self.requests: list[tuple[str, dict, dict]] = []
        self.got = threading.Event()  # a request arrived
        self.release = threading.Event()  # hung handlers give up
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                fake.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                fake.got.set()
                ans = fake.reply(self, body)
                if ans is None:  # accept, never answer
                    fake.release.wait(120)
                    return
                status, ctype, data = ans
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _completion(body: dict, n: int | None = None) -> bytes:
    n = body.get("n", 1) if n is None else n
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                       "choices": [{"index": i, "text": f"{GOOD} {i}", "finish_reason": "stop"}
                                   for i in range(n)]}).encode()


def _json(obj) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(obj).encode()


@pytest.fixture
def fake():
    s = FakeServer()
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(tmp_path, tiny_lm, url, *extra) -> list[str]:
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"text": t} for t in OMEGA])
    return ["gen", str(omega), "-K", "1", "-J", "2", "--model", tiny_lm, "--backend", "openai",
            "--base-url", url, "--max-new-tokens", "8", "--min-words", "0",
            "--out", str(tmp_path / "out.jsonl"), *map(str, extra)]


def _gen(run_popri, tmp_path, tiny_lm, url, *extra, env=None):
    return run_popri(_argv(tmp_path, tiny_lm, url, *extra),
                     env={"POPRI_OPENAI_RETRIES": "0", **(env or {})})


def _one_line(p, rc: int, tmp_path) -> str:
    """The error contract with nothing on stdout (conftest), and no --out written."""
    err = assert_one_line_error(p, code=rc, no_stdout=True)
    assert not (tmp_path / "out.jsonl").exists()
    return err


# ---------------------------------------------------------------- held (G01, G09): still work
def test_g01_g09_held_a_valid_server_and_one_that_ignores_n(fake, tiny_lm, tmp_path, run_popri):
    p = _gen(run_popri, tmp_path, tiny_lm, fake.url, "-J", "3")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == [f"{GOOD} {i}" for i in range(3)]
    # G09: one choice whatever n says: each missing row is asked for with its own seed
    fake.requests.clear()
    fake.reply = lambda h, body: (200, "application/json", _completion(body, n=1))
    p = _gen(run_popri, tmp_path, tiny_lm, fake.url, "-J", "3")
    assert p.returncode == 0, p.stderr
    assert [b["n"] for _, _, b in fake.requests] == [3, 1, 1]
    assert len({b["seed"] for _, _, b in fake.requests}) == 3


# ---------------------------------------------------------------- G02 / G03 / G05 / G07
def test_g02_html_answer_is_one_line_naming_the_url(fake, tiny_lm, tmp_path, run_popri):
    fake.reply = lambda h, body: (200, "text/html", b"<html><body>Please log in</body></html>")
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, fake.url), 1, tmp_path)
    assert fake.url in err
    # the same behind a user:password@ URL: named without its password
    url = f"http://alice:s3cretpw@127.0.0.1:{fake.port}/v1"
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, url), 1, tmp_path)
    assert "s3cretpw" not in err and f"127.0.0.1:{fake.port}/v1" in err


@pytest.mark.parametrize("data", [b"{not json", b""], ids=["garbage", "empty"])
def test_g03_unparsable_json_answer_is_one_line(fake, tiny_lm, tmp_path, run_popri, data):
    fake.reply = lambda h, body: (200, "application/json", data)
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, fake.url), 1, tmp_path)
    assert fake.url in err


@pytest.mark.parametrize("obj", [{"id": "x", "object": "text_completion"}, {"choices": None}],
                         ids=["missing", "null"])
def test_g05_answer_without_choices_is_one_line(fake, tiny_lm, tmp_path, run_popri, obj):
    fake.reply = lambda h, body: _json(obj)
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, fake.url), 1, tmp_path)
    assert fake.url in err and "choices" in err


def test_g07_malformed_choice_is_one_line(fake, tiny_lm, tmp_path, run_popri):
    fake.reply = lambda h, body: _json({"choices": [{"index": "a", "text": 5}]})
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, fake.url), 1, tmp_path)
    assert fake.url in err


# ---------------------------------------------------------------- G10 / G13: secrets
def test_g10_the_api_key_is_never_printed(fake, tiny_lm, tmp_path, run_popri):
    def echo_auth(h, body):
        return 401, "application/json", json.dumps(
            {"error": {"message": f"bad key: {h.headers.get('Authorization')} "
                                  "(also seen: sk-OTHERTOKEN987654)"}}).encode()

    fake.reply = echo_auth
    p = _gen(run_popri, tmp_path, tiny_lm, fake.url, "--api-key-env", "MYKEY",
             env={"MYKEY": "sk-SECRET-123456"})
    err = _one_line(p, 1, tmp_path)
    assert fake.requests[0][1]["authorization"] == "Bearer sk-SECRET-123456"  # it was sent
    assert "SECRET-123456" not in err and "OTHERTOKEN987654" not in err and "HTTP 401" in err


def test_g13_the_url_password_is_never_printed(fake, tiny_lm, tmp_path, run_popri):
    # a closed port
    url = f"http://user:hunter2pass@127.0.0.1:{_free_port()}/v1"
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, url), 1, tmp_path)
    assert "hunter2pass" not in err and "cannot reach" in err and "user" in err
    # a server that answers 500 (and echoes the URL it was called at)
    fake.reply = lambda h, body: (500, "text/plain",
                                  f"boom at http://user:hunter2pass@{h.headers['Host']}".encode())
    url = f"http://user:hunter2pass@127.0.0.1:{fake.port}/v1"
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, url), 1, tmp_path)
    assert "hunter2pass" not in err and "HTTP 500" in err and f"127.0.0.1:{fake.port}/v1" in err
    # a malformed URL (exit 2) does not print it either
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, "ftp://user:hunter2pass@127.0.0.1/v1"),
                    2, tmp_path)
    assert "hunter2pass" not in err and "not an http(s) URL" in err


# ---------------------------------------------------------------- G17
@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:notaport/v1"],
                         ids=["ipv6", "port"])
def test_g17_malformed_url_is_exit_2_one_line(tiny_lm, tmp_path, run_popri, url):
    err = _one_line(_gen(run_popri, tmp_path, tiny_lm, url), 2, tmp_path)
    assert "base-url" in err or "base_url" in err


# ---------------------------------------------------------------- G22: signals
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_g22_a_server_that_never_answers_does_not_outlive_a_signal(fake, tiny_lm, tmp_path, sig):
    fake.reply = lambda h, body: None
    # PYTHONFAULTHANDLER: a SIGABRT makes a stuck child print every thread's stack (below)
    env = dict(os.environ, POPRI_THREADS="1", PYTHONFAULTHANDLER="1")
    ours = (signal.getsignal(signal.SIGINT), sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    # popri as a terminal starts it, Ctrl-C not ignored: a test run started in the background
    # of a non-interactive shell (`make test &`, nohup) has SIGINT ignored, which exec passes on
    # and which popri, as every Unix program, keeps (its failures of 2026-11-30 were that:
    # worker SIG_IGN, child SigIgn bit 2). A Python handler becomes SIG_DFL across exec.
    keep = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        p = subprocess.Popen([sys.executable, "-m", "popri.cli.app",
                              *_argv(tmp_path, tiny_lm, fake.url, "--concurrency", "2")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, keep)
    try:
        assert fake.got.wait(120), "popri never sent its request"
        time.sleep(0.3)
        p.send_signal(sig)
        try:  # promptly, not after the client's timeout; 20 s: two loaded test workers
            out, err = p.communicate(timeout=20)  # once took > 5 s on 2 busy cores
        except subprocess.TimeoutExpired:
            # say what it was doing (the signal dispositions, the stacks)
            try:
                status = [ln for ln in open(f"/proc/{p.pid}/status").read().splitlines()
                          if ln.startswith(("State", "Sig", "ShdPnd", "Threads"))]
            except OSError as e:
                status = [str(e)]
            p.send_signal(signal.SIGABRT)
            try:
                _, stacks = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                stacks = "(no answer to SIGABRT either)"
            pytest.fail(f"popri gen still running 20 s after {sig.name}; the test worker's "
                        f"SIGINT handler and blocked signals: {ours}; the child's {status}; "
                        f"its stacks:\n{stacks[-6000:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 128 + sig, err
    assert "Traceback" not in err and out == "" and not (tmp_path / "out.jsonl").exists()
    assert [x for x in os.listdir(tmp_path) if x not in ("omega.jsonl",)] == []


def test_g13_popri_run_hides_the_url_password_in_its_plan_and_commands(tmp_path, run_popri):
    """The stages' command lines (the log, RUN/commands.sh, the dry-run plan) show a
    --base-url with user info as user:***@host."""
    p = run_popri(["run", "--dry-run", "--set", f"run_dir={tmp_path / 'r'}",
                   "--set", "generator.backend=openai",
                   "--set", "generator.base_url=http://alice:hunter2pass@127.0.0.1:9/v1"],
                  check=True)
    assert "hunter2pass" not in p.stdout + p.stderr
    assert "http://alice:***@127.0.0.1:9/v1" in p.stdout
