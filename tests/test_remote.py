"""The openai backend against a real OpenAI-compatible server: `transformers serve` on CPU,
started and stopped here, serving the tiny random Llama (and, by path, a merged LoRA checkpoint).

    python -m pytest tests/test_remote.py -q
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from popri.core.errors import ConfigError
from popri.specs.generation import GenSpec

from conftest import write_jsonl

OMEGA = [f"The committee met on day {i} to discuss the budget for the coming year." for i in range(8)]


def test_spec_wants_a_url_and_refuses_stray_openai_settings():
    with pytest.raises(ConfigError, match="needs the server's URL") as e:
        GenSpec(backend="openai")
    assert e.value.field == "base_url"
    with pytest.raises(ConfigError, match="openai-backend setting") as e:
        GenSpec(concurrency=4)
    assert e.value.field == "concurrency"
    GenSpec(backend="openai", base_url="http://127.0.0.1:1/v1", api="chat", concurrency=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_cmd() -> list[str] | None:
    try:
        from transformers.utils.import_utils import is_serve_available
    except ImportError:
        return None
    exe = Path(sys.executable).parent / "transformers"
    if not is_serve_available() or not exe.exists():
        return None
    if "serve" not in subprocess.run([str(exe), "--help"], capture_output=True, text=True).stdout:
        return None
    return [str(exe), "serve"]


@pytest.fixture(scope="module")
def served_lm(tiny_lm, tmp_path_factory) -> str:
    """The tiny Llama with ``do_sample: true`` in its generation config: transformers serve
    samples only when the model's own generation config says so (else it decodes greedily,
    whatever temperature the request names)."""
    import shutil

    d = tmp_path_factory.mktemp("served") / "model"
    shutil.copytree(tiny_lm, d)
    gc = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**gc, "do_sample": True}))
    return str(d)


@pytest.fixture(scope="module")
def server(served_lm, tmp_path_factory):
    """`transformers serve --port P`: a real OpenAI-compatible server, stopped afterwards."""
    cmd = _serve_cmd()
    if cmd is None:
        pytest.skip("transformers serve is not available (pip install 'transformers[serving]')")
    port = _free_port()
    logf = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    # the server's own packages may differ from the client's (testing the lowest openai client
    # against a server that needs a newer one): POPRI_TEST_SERVER_PYTHONPATH goes first for it
    if os.environ.get("POPRI_TEST_SERVER_PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [
            os.environ["POPRI_TEST_SERVER_PYTHONPATH"], os.environ.get("PYTHONPATH")]))
    with open(logf, "w") as log:
        # no pinned model: it loads what a request names (a merged adapter by its path too)
        p = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port)],
                             stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if p.poll() is not None:
                pytest.fail(f"transformers serve exited {p.returncode}:\n{logf.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"transformers serve did not come up:\n{logf.read_text()[-2000:]}")
        yield f"{url}/v1"
    finally:
        try:
            os.killpg(p.pid, 15)
            p.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
def test_gen_over_a_real_server_is_seeded_and_counted(server, served_lm, tmp_path, run_popri):
    tiny_lm = served_lm
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(OMEGA)])
    args = ["gen", omega, "-K", "2", "-J", "3", "--model", tiny_lm, "--backend", "openai",
            "--base-url", server, "--max-new-tokens", "8", "--min-words", "0", "--seed", "4",
            "--concurrency", "1"]
    p = run_popri([*args, "--out", tmp_path / "a.jsonl", "--stats-out", tmp_path / "a.json"])
    assert p.returncode == 0, p.stderr
    rows = _rows(tmp_path / "a.jsonl")
    assert [r["id"] for r in rows] == [f"r0-p{k}-s{j}" for k in range(2) for j in range(3)]
    assert all(r["text"] and r["model"] == tiny_lm for r in rows)
    st = json.loads((tmp_path / "a.json").read_text())
    assert st["backend"] == "openai" and st["generated_tokens"] > 0 and st["samples"] == 6
    assert st["rows_asked_again"] == 4  # 2 prompts x (J - 1): the server answered one choice
    # transformers serve ignores n: each row was asked for with its own seed, so a rerun with
    # the same seed (one request in flight) is the same file, and another seed is not
    assert run_popri([*args, "--out", tmp_path / "b.jsonl"]).returncode == 0
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    # another seed, 4 requests in flight: every row, other texts
    args[args.index("--seed") + 1] = "5"
    args[args.index("--concurrency") + 1] = "4"
    assert run_popri([*args, "--out", tmp_path / "c.jsonl"]).returncode == 0
    other = _rows(tmp_path / "c.jsonl")
    assert len(other) == 6 and [r["text"] for r in other] != [r["text"] for r in rows]


@pytest.mark.slow
def test_chat_api_and_merged_adapter_by_path(server, served_lm, tmp_path, run_popri):
    tiny_lm = served_lm
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_lm),
                        LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                                   init_lora_weights=False))
    pm.save_pretrained(tmp_path / "ad")
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"text": t} for t in OMEGA])
    base = ["gen", omega, "-K", "2", "-J", "2", "--model", tiny_lm, "--backend", "openai",
            "--base-url", server, "--max-new-tokens", "8", "--min-words", "0"]
    p = run_popri([*base, "--api", "chat", "--out", tmp_path / "chat.jsonl"])
    assert p.returncode == 0, p.stderr
    assert len(_rows(tmp_path / "chat.jsonl")) == 4
    # merge: the server loads the merged checkpoint by its path (the filesystem is shared)
    p = run_popri([*base, "--adapter", tmp_path / "ad", "--adapter-mode", "merge",
                   "--out", tmp_path / "merged.jsonl"])
    assert p.returncode == 0, p.stderr
    rows = _rows(tmp_path / "merged.jsonl")
    assert len(rows) == 4 and all(r["adapter"] == str(tmp_path / "ad") for r in rows)
    # lora: transformers serve has no /load_lora_adapter: one line naming the URL, nothing written
    p = run_popri([*base, "--adapter", tmp_path / "ad", "--out", tmp_path / "lora.jsonl"])
    assert p.returncode == 1 and "cannot load LoRA adapters" in p.stderr and server in p.stderr
    assert p.stderr.strip().count("\n") == 0 and not (tmp_path / "lora.jsonl").exists()


def test_server_down_is_one_line_naming_the_url(tiny_lm, tmp_path, run_popri):
    pytest.importorskip("openai")
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"text": t} for t in OMEGA])
    out = tmp_path / "keep.jsonl"
    out.write_text("precious\n")
    url = f"http://127.0.0.1:{_free_port()}/v1"
    p = run_popri(["gen", omega, "-K", "1", "-J", "2", "--model", tiny_lm, "--backend", "openai",
                   "--base-url", url, "--out", out], env={"POPRI_OPENAI_RETRIES": "0"})
    assert p.returncode == 1 and "cannot reach" in p.stderr and url in p.stderr, p.stderr
    assert p.stderr.strip().count("\n") == 0
    assert out.read_text() == "precious\n"
    p = run_popri(["gen", omega, "-K", "1", "--backend", "openai", "--base-url", "ftp:/x",
                   "--out", out])
    assert p.returncode == 2 and "not an http(s) URL" in p.stderr
