"""`popri expand` / popri.methods.pe.expand: sharded PrE-Text Expand, filtering, dedupe, resume, CLI.

    python -m pytest -q tests/test_expand.py            # fast (fake engine, tiny random Llama)
    python -m pytest -q -m slow tests/test_expand.py    # real smollm2-135m
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest

from conftest import REPO, write_jsonl
from popri.methods.pe import expand as ex
from popri.models import generation as g
from popri.core.errors import InputError, MissingResourceError

SEEDS = [
    "We must invest in clean energy to secure jobs for the next generation of Americans.",
    "Tonight I ask the Congress to pass a budget that keeps our promises to our veterans.",
    "Our schools need more teachers, and our teachers need the support of every community.",
    "The state of our union is strong because the American people are strong.",
    "We will not rest until every family can afford a doctor when a child is sick.",
    "Trade must be fair, and American workers must be able to compete on a level field.",
    "Our alliances have kept the peace for decades, and we will stand by our friends.",
    "Small businesses create most of the new jobs in this country, so let us help them grow.",
    "I propose a new program to rebuild our roads, bridges, railways and airports.",
    "No nation can be secure while its citizens live in fear of crime in their own streets.",
]


@pytest.fixture
def seeds_file(tmp_path):
    return write_jsonl(tmp_path / "seeds.jsonl", [{"id": f"seed{i}", "text": t}
                                                  for i, t in enumerate(SEEDS)])


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("POPRI_THREADS", "1")
    yield
    torch.set_num_threads(before)


def records():
    return [{"id": f"seed{i}", "text": t} for i, t in enumerate(SEEDS)]


def shard_bytes(d):
    return {f: (d / f).read_bytes() for f in sorted(os.listdir(d)) if f.startswith("shard-")}


def all_rows(d):
    return [json.loads(line) for f, b in shard_bytes(d).items() for line in b.decode().splitlines()]


def stable(manifest):
    """The manifest without timings (which differ between runs)."""
    drop = {"seconds", "tokens_per_s", "samples_per_s"}
    m = {k: v for k, v in manifest.items() if k not in drop and k != "seeds"}
    m["shards"] = [{k: v for k, v in e.items() if k != "seconds"} for e in manifest["shards"]]
    return m


# --------------------------------------------------------------------------- fake engine
class FakeEngine:
    """Deterministic stand-in for a backend: the text depends on (shard, chunk, row) as a seeded
    sampler's would; ~10% are too short, and 200 possible texts make duplicates (also across
    shards) common."""

    name = "fake"
    tok = None

    def __init__(self, interrupt_at=None, junk=False):
        self.calls, self.interrupt_at, self.junk = [], interrupt_at, junk

    def text(self, prompt, k, key):
        v = g.derive_seed(k, *key) % 200
        if self.junk or v % 10 == 0:
            return "too short\nOriginal Text Sample 5"
        return f"Sample number {v}  says\nthe budget is tight.\nOriginal Text Sample 5\nmore"

    def run(self, prompts, keys, attempt, tick):
        if attempt == self.interrupt_at and self.calls and self.calls[-1][0] == attempt:
            raise KeyboardInterrupt  # killed in the middle of shard `attempt`
        self.calls.append((attempt, list(keys), list(prompts)))
        out = [(self.text(p, attempt, key), 7) for p, key in zip(prompts, keys)]
        tick(len(out), 7 * len(out))
        return out


def run_fake(tmp_path, name, engine=None, **kw):
    args = dict(num_samples=40, shard_size=8, model="fake-model", seed=0, batch_size=4,
                source="seeds.jsonl")
    args.update(kw)
    return ex.expand(records(), out_dir=str(tmp_path / name), engine=engine or FakeEngine(), **args)


def test_hashset_plan_and_hash():
    s = ex.HashSet()
    hs = [ex.text_hash(f"text {i}") for i in range(1000)]
    for h in hs[:600]:
        s.add(h)
    s.flush()
    for h in hs[600:900]:
        s.add(h)
    assert all(h in s for h in hs[:900]) and not any(h in s for h in hs[900:])
    s.flush()
    assert len(s) == 900 and s.sorted.nbytes == 8 * 900 and list(s.sorted) == sorted(hs[:900])
    assert ex.text_hash("a b") == ex.text_hash("a b") != ex.text_hash("a  b")
    assert ex.plan(20, 8) == [8, 8, 4] and ex.plan(16, 8) == [8, 8] and ex.plan(3, 8) == [3]


def test_filters_dedupe_ids_and_manifest(tmp_path):
    eng = FakeEngine()
    m = run_fake(tmp_path, "d", eng)
    d = tmp_path / "d"
    assert m["status"] == "complete" and m["rows"] == 40 and m["shortfall"] == 0
    assert sorted(os.listdir(d)) == ["manifest.json"] + [ex.shard_name(k) for k in range(5)]
    rows = all_rows(d)
    assert [r["id"] for r in rows] == [f"x{i}" for i in range(40)]
    texts = [r["text"] for r in rows]
    assert len(set(texts)) == 40  # no duplicates, also across shards
    ids = {f"seed{i}" for i in range(len(SEEDS))}
    for r in rows:
        assert list(r) == ["id", "text", "seed_ids", "model"] and r["model"] == "fake-model"
        assert len(r["text"].split()) >= 4 and "Original" not in r["text"] and "  " not in r["text"]
        assert len(set(r["seed_ids"])) == 3 and set(r["seed_ids"]) <= ids
    # every kept row came from the prompt whose examples it records
    c = m["counts"]
    assert c["kept"] == 40 and c["filtered"].get("short", 0) > 0 and c["duplicates"] > 0
    assert c["prompts"] == c["kept"] + sum(c["filtered"].values()) + c["duplicates"] + c["surplus"]
    assert c["prompts"] == sum(len(keys) for _, keys, _ in eng.calls)
    assert m["generated_tokens"] == 7 * c["prompts"] and m["samples_per_s"] > 0
    on_disk = json.loads((d / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(m))
    for e in on_disk["shards"]:
        assert e["sha256"] == __import__("hashlib").sha256((d / e["file"]).read_bytes()).hexdigest()
    # chunks: at most --batch-size prompts; keys (chunk, row); the shard index is the "attempt"
    assert all(len(keys) <= 4 for _, keys, _ in eng.calls)
    assert {a for a, _, _ in eng.calls} == set(range(5))
    first = [keys for a, keys, _ in eng.calls if a == 0][0]
    assert first == [(0, 0), (0, 1), (0, 2), (0, 3)]


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    run_fake(tmp_path, "a")
    run_fake(tmp_path, "b")
    run_fake(tmp_path, "c", seed=1)
    a, b, c = (shard_bytes(tmp_path / n) for n in "abc")
    assert a == b and a != c


def test_interrupt_then_resume_is_byte_identical(tmp_path):
    full = run_fake(tmp_path, "full")
    with pytest.raises(KeyboardInterrupt):
        run_fake(tmp_path, "cut", FakeEngine(interrupt_at=2))
    d = tmp_path / "cut"
    assert sorted(os.listdir(d)) == ["manifest.json", "shard-00000.jsonl", "shard-00001.jsonl"]
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "running" and len(m["shards"]) == 2
    eng = FakeEngine()
    again = run_fake(tmp_path, "cut", eng)
    assert min(a for a, _, _ in eng.calls) == 2  # continued after the last finished shard
    assert shard_bytes(d) == shard_bytes(tmp_path / "full")
    assert stable(again) == stable(full)
    # a rerun of a finished run generates nothing and changes nothing
    before = (d / "manifest.json").read_bytes()
    eng2 = FakeEngine()
    assert stable(run_fake(tmp_path, "cut", eng2)) == stable(full) and eng2.calls == []
    assert (d / "manifest.json").read_bytes() == before


def test_lost_last_shard_is_regenerated_and_more_samples_extend(tmp_path):
    run_fake(tmp_path, "full", num_samples=32)
    d = tmp_path / "cut"
    run_fake(tmp_path, "cut", num_samples=32)
    # a kill between the shard's rename and the manifest update: the manifest does not list it
    m = json.loads((d / "manifest.json").read_text())
    m["shards"] = m["shards"][:2]
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "shard-00003.jsonl").unlink()
    (d / ".shard-00003.jsonl.abc.tmp").write_text("half")
    run_fake(tmp_path, "cut", num_samples=32)
    assert shard_bytes(d) == shard_bytes(tmp_path / "full")
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
    # all shards full: a larger N continues and equals a fresh run of that N
    run_fake(tmp_path, "cut", num_samples=44)
    run_fake(tmp_path, "fresh44", num_samples=44)
    assert shard_bytes(d) == shard_bytes(tmp_path / "fresh44") and len(all_rows(d)) == 44
    # ... but the last shard was cut to 4 rows for N=44: N=48 needs --force
    with pytest.raises(InputError, match="num_samples"):
        run_fake(tmp_path, "cut", num_samples=48)


def test_changed_config_refused_unless_force(tmp_path):
    run_fake(tmp_path, "d", num_samples=16)
    d = tmp_path / "d"
    before = shard_bytes(d)
    for kw, field in [({"seed": 1}, "config.seed"), ({"min_words": 5}, "config.min_words"),
                      ({"batch_size": 2}, "config.batch_size"), ({"model": "other"}, "config.model")]:
        with pytest.raises(InputError) as e:
            run_fake(tmp_path, "d", num_samples=16, **kw)
        assert e.value.field == field and e.value.path == str(d / "manifest.json")
        assert shard_bytes(d) == before
    recs = records()[:-1]
    with pytest.raises(InputError, match="seeds_sha256"):
        ex.expand(recs, out_dir=str(d), engine=FakeEngine(), num_samples=16, shard_size=8,
                  model="fake-model", batch_size=4)
    run_fake(tmp_path, "d", num_samples=12, seed=1, force=True)
    run_fake(tmp_path, "s1", num_samples=12, seed=1)
    assert shard_bytes(d) == shard_bytes(tmp_path / "s1") and len(shard_bytes(d)) == 2
    # a modified shard is detected
    p = d / "shard-00000.jsonl"
    p.write_bytes(p.read_bytes().replace(b"Sample", b"Simple", 1))
    with pytest.raises(InputError, match="changed since it was written"):
        run_fake(tmp_path, "d", num_samples=12, seed=1)


def test_shortfall_stops_at_attempt_cap(tmp_path):
    eng = FakeEngine(junk=True)
    m = run_fake(tmp_path, "d", eng, num_samples=20, attempt_factor=2.0)
    assert m["status"] == "short" and m["rows"] == 0 and m["shortfall"] == 20
    assert len(m["shards"]) == 1 and m["shards"][0]["prompts"] == 16  # 2 x the shard's 8
    assert (tmp_path / "d" / "shard-00000.jsonl").read_bytes() == b""
    eng2 = FakeEngine(junk=True)
    assert run_fake(tmp_path, "d", eng2, num_samples=20, attempt_factor=2.0)["status"] == "short"
    assert eng2.calls == []


def test_too_few_seeds_and_bad_template():
    with pytest.raises(InputError, match="2 distinct") as e:
        ex.expand([{"id": 0, "text": "a b"}, {"id": 1, "text": " a  b"}, {"id": 2, "text": "c"}],
                  num_samples=1, out_dir="unused", model="m", engine=FakeEngine(), source="s.jsonl")
    assert e.value.path == "s.jsonl" and e.value.field == "text"
    with pytest.raises(InputError, match="template"):
        ex.expand(records(), num_samples=1, out_dir="unused", model="m", engine=FakeEngine(),
                  template="{sample1} {sample2}")
    assert not os.path.exists("unused")


# --------------------------------------------------------------------------- real backends
@pytest.fixture(scope="module")
def tiny_loaded(tiny_lm):
    from popri.models.llm import load_causal_lm

    return load_causal_lm(tiny_lm)


def tiny_engine(tiny_lm, tiny_loaded, seed, batch_size=4, max_new_tokens=16):
    m, tok = tiny_loaded
    return g.TransformersBackend(tiny_lm, None, device="cpu", bf16=False, batch_size=batch_size,
                                 seed=seed, marker=g.MARKER, model_obj=m, tokenizer_obj=tok,
                                 params={"temperature": 1.0, "top_p": 1.0,
                                         "max_new_tokens": max_new_tokens})


def test_tiny_lm_shards_and_determinism(tiny_lm, tiny_loaded, tmp_path):
    kw = dict(num_samples=20, shard_size=8, model=tiny_lm, batch_size=4, max_new_tokens=16,
              max_tokens=12, bf16=False)
    for name, seed in [("a", 0), ("b", 0), ("c", 3)]:
        m = ex.expand(records(), out_dir=str(tmp_path / name), seed=seed,
                      engine=tiny_engine(tiny_lm, tiny_loaded, seed), **kw)
        assert m["status"] == "complete" and [e["rows"] for e in m["shards"]] == [8, 8, 4]
    rows = all_rows(tmp_path / "a")
    assert len(rows) == 20 and len({r["text"] for r in rows}) == 20
    assert all(len(r["text"].split()) >= 4 for r in rows)
    tok = tiny_loaded[1]
    assert all(len(tok(r["text"], add_special_tokens=False)["input_ids"]) <= 12 for r in rows)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert shard_bytes(tmp_path / "a") != shard_bytes(tmp_path / "c")


def fake_vllm(monkeypatch):
    log = {"llm": [], "generate": []}

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, **kw):
            log["llm"].append(kw)

        def generate(self, prompts, sampling_params=None, lora_request=None, use_tqdm=True):
            log["generate"].append((list(prompts), sampling_params))
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(
                text=f" Words of sample {sp.kw['seed']} here.\nOriginal Text Sample 5",
                token_ids=[1] * 9)]) for sp in sampling_params]

    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return log


def test_vllm_backend_requests(monkeypatch, tiny_lm, tmp_path):
    log = fake_vllm(monkeypatch)
    m = ex.expand(records(), num_samples=10, shard_size=6, out_dir=str(tmp_path / "v"),
                  model=tiny_lm, backend="vllm", seed=5, temperature=1.0, top_p=1.0)
    assert m["status"] == "complete" and m["config"]["batch_size"] == 2048
    (kw,) = log["llm"]  # loaded once for both shards
    assert kw["model"] == tiny_lm and kw["seed"] == 5 and kw["dtype"] == "bfloat16"
    assert kw["max_model_len"] % 64 == 0
    from popri.models.llm import load_tokenizer

    t = load_tokenizer(tiny_lm)
    longest = max(len(t(g.fill_template(g.DEFAULT_TEMPLATE, [a, b, c]))["input_ids"])
                  for a in SEEDS for b in SEEDS for c in SEEDS if len({a, b, c}) == 3)
    assert kw["max_model_len"] >= longest + 85
    assert [len(p) for p, _ in log["generate"]] == [6, 4]  # one call per shard (chunk)
    for k, (prompts, sps) in enumerate(log["generate"]):
        for i, sp in enumerate(sps):
            assert sp.kw == {"n": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": 85,
                             "stop": ["Original Text Sample"], "seed": g.derive_seed(5, k, 0, i)}
        assert all(p.startswith("List of 6 diverse original text samples:\n") for p in prompts)
    rows = all_rows(tmp_path / "v")
    assert rows[0]["text"] == f"Words of sample {g.derive_seed(5, 0, 0, 0)} here."
    assert m["generated_tokens"] == 9 * 10


def test_vllm_missing_exit_3_nothing_written(monkeypatch, tiny_lm, tmp_path, seeds_file, run_popri):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(MissingResourceError, match="pip install 'popri\\[gpu\\]'"):
        ex.expand(records(), num_samples=4, out_dir=str(tmp_path / "v"), model=tiny_lm,
                  backend="vllm")
    assert not (tmp_path / "v").exists()
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # the CLI, where vllm really is missing
        p = run_popri(["expand", seeds_file, "-N", "4", "--out", tmp_path / "v", "--backend",
                       "vllm", "--model", tiny_lm])
        assert p.returncode == 3 and "backend 'vllm' needs the vllm package" in p.stderr
        assert p.stderr.count("\n") == 1 and p.stdout == "" and not (tmp_path / "v").exists()


# --------------------------------------------------------------------------- CLI
def test_cli_pipe_merged_out_and_stdout(seeds_file, tiny_lm, tiny_loaded, tmp_path):
    env = {**os.environ, "POPRI_THREADS": "1"}
    popri = f"{sys.executable} -m popri.cli.app"
    args = (f"-N 12 --shard-size 5 --model {tiny_lm} --max-new-tokens 16 --max-tokens 12 "
            f"--batch-size 4 --no-bf16 --seed 2")
    cmd = (f"cat {seeds_file} | {popri} expand - {args} --out {tmp_path / 'p'} --merged-out - | "
           f"{sys.executable} -c \"import sys, json; rows = [json.loads(l) for l in sys.stdin]; "
           f"print(len(rows), len({{r['text'] for r in rows}}))\"")
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "12 12\n"
    assert "expand: 12/12 samples in 3 shard(s)" in p.stderr
    # the same from a file, merged into a file: stdout is the directory; same shards as in-process
    q = subprocess.run([sys.executable, "-m", "popri.cli.app", "expand", str(seeds_file),
                        *args.split(), "--out", str(tmp_path / "f"), "--merged-out",
                        str(tmp_path / "all.jsonl")], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=900)
    assert q.returncode == 0, q.stderr
    assert q.stdout == f"{tmp_path / 'f'}\n"
    merged = (tmp_path / "all.jsonl").read_bytes()
    assert merged == b"".join(shard_bytes(tmp_path / "f").values())
    assert shard_bytes(tmp_path / "f") == shard_bytes(tmp_path / "p")
    ex.expand(records(), out_dir=str(tmp_path / "i"), num_samples=12, shard_size=5, model=tiny_lm,
              batch_size=4, max_new_tokens=16, max_tokens=12, bf16=False, seed=2,
              engine=tiny_engine(tiny_lm, tiny_loaded, 2))
    assert shard_bytes(tmp_path / "i") == shard_bytes(tmp_path / "f")


def test_cli_bad_input_and_config_change(seeds_file, tiny_lm, tmp_path, run_popri):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "x y"}, {"id": "b", "txt": "z"}])
    p = run_popri(["expand", bad, "-N", "4", "--out", tmp_path / "o", "--model", tiny_lm])
    assert p.returncode == 2 and p.stderr == f"popri: error: {bad}:2: field 'text': missing required field\n"
    assert not (tmp_path / "o").exists() and p.stdout == ""
    p = run_popri(["expand", seeds_file, "-N", "4", "--out", tmp_path / "o", "--backend", "tgi"])
    assert p.returncode == 2 and "field '--backend': must be one of" in p.stderr
    assert not (tmp_path / "o").exists()
    base = ["expand", seeds_file, "-N", "6", "--shard-size", "4", "--out", tmp_path / "o",
            "--model", tiny_lm, "--max-new-tokens", "12", "--no-bf16"]
    run_popri(base, check=True)
    before = shard_bytes(tmp_path / "o")
    p = run_popri([*base, "--temperature", "0.5"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert f"{tmp_path / 'o' / 'manifest.json'}: field 'config.temperature': was 1.0, now 0.5" in p.stderr
    assert shard_bytes(tmp_path / "o") == before
    p = run_popri([*base, "--merged-out", seeds_file])
    assert p.returncode == 2 and "output would overwrite input" in p.stderr


def test_cli_sigkill_then_resume_equals_uninterrupted(seeds_file, tiny_lm, tiny_loaded, tmp_path):
    d = tmp_path / "k"
    args = [sys.executable, "-m", "popri.cli.app", "expand", str(seeds_file), "-N", "48",
            "--shard-size", "4", "--batch-size", "4", "--model", tiny_lm, "--max-new-tokens", "40",
            "--max-tokens", "24", "--no-bf16", "--out", str(d)]
    env = {**os.environ, "POPRI_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300

    def shards_recorded() -> int:  # the shard file lands before the manifest records it
        try:
            return len(json.loads((d / "manifest.json").read_text()).get("shards", []))
        except (OSError, ValueError):
            return 0

    while shards_recorded() < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "running" and len(m["shards"]) < 12, "the run was not interrupted"
    p = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    assert "resuming after" in p.stderr
    ex.expand(records(), out_dir=str(tmp_path / "u"), num_samples=48, shard_size=4, batch_size=4,
              model=tiny_lm, max_new_tokens=40, max_tokens=24, bf16=False,
              engine=tiny_engine(tiny_lm, tiny_loaded, 0, max_new_tokens=40))
    assert shard_bytes(d) == shard_bytes(tmp_path / "u") and len(shard_bytes(d)) == 12
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]


# --------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_real_smollm2_expands_sotu_like_seeds(tmp_path):
    m = ex.expand(records(), num_samples=8, shard_size=4, out_dir=str(tmp_path / "r"),
                  model="smollm2-135m", seed=0, batch_size=8)
    assert m["status"] == "complete" and m["rows"] == 8
    rows = all_rows(tmp_path / "r")
    assert len({r["text"] for r in rows}) == 8
    for r in rows:
        assert len(r["text"].split()) >= 4 and "Original Text Sample" not in r["text"]
    print(f"\nsmollm2-135m expand: {m['samples_per_s']} samples/s, {m['tokens_per_s']} tokens/s, "
          f"{m['counts']}")
    shutil.rmtree(tmp_path / "r")
