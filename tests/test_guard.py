"""One guard against a command overwriting its inputs (issue 9, section 2): popri/core/guard.py.

Unit tests of check_outputs, then one CLI test per command that writes files: exit 2, one line
``popri: error: OUT: output would overwrite input IN; choose another name``, and every file under
the test directory byte-identical afterwards (nothing read-and-replaced, nothing written).  The
guard runs before any model is loaded, so the model commands' tests are fast.

    python -m pytest -q tests/test_guard.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import write_jsonl
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.core.io import save_embedding_set, save_scores

MSG = "output would overwrite input {}; choose another name"


def clash(out, inp) -> str:
    return f"{out}: " + MSG.format(inp)


def refuses(outputs, inputs, out, inp, **kw):
    with pytest.raises(InputError) as e:
        check_outputs(outputs, inputs, **kw)
    assert e.value.path == str(out) and e.value.message == MSG.format(inp), str(e.value)


# --------------------------------------------------------------------------- unit
@pytest.fixture
def ds(tmp_path) -> Path:
    """A federated dataset directory (train/val/test.jsonl + manifest.json)."""
    d = tmp_path / "ds"
    d.mkdir()
    for split, n in (("train", 6), ("val", 4), ("test", 4)):
        write_jsonl(d / f"{split}.jsonl", [{"id": f"{split}{i}", "client_id": f"c{i % 3}",
                                            "text": f"the {split} text number {i} of the set"}
                                           for i in range(n)])
    (d / "manifest.json").write_text(json.dumps({"format": "test"}) + "\n")
    return d


def test_same_file_and_no_clash(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("x\n")
    refuses([a], [a], a, a)
    refuses([str(tmp_path / "." / "a.jsonl")], [a], tmp_path / "." / "a.jsonl", a)
    check_outputs([b], [a])  # a new file next to the input
    # an output that does not exist yet vs an input that does not exist either: by path
    refuses([tmp_path / "new.jsonl"], [tmp_path / "sub" / ".." / "new.jsonl"],
            tmp_path / "new.jsonl", tmp_path / "sub" / ".." / "new.jsonl")


def test_stdio_and_none_are_ignored(tmp_path):
    check_outputs(["-", None, ""], ["-", None])
    check_outputs([None, "-"], [tmp_path])
    check_outputs(["-", "-"], [])  # two outputs on stdout are not files


def test_embedding_set_output_sidecar_and_meta(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("{}\n")
    out = tmp_path / "t.npy"
    refuses([out], [src], out, src)  # NAME.jsonl sidecar of the embedding set
    refuses([out], [src], out, src, companions="embeddings")
    meta = tmp_path / "m.meta.json"
    meta.write_text("{}")
    refuses([tmp_path / "m.npy"], [meta], tmp_path / "m.npy", meta)
    # a score vector writes NAME.json only: texts NAME.jsonl next to it are not touched
    check_outputs([out], [src], companions="scores")
    check_outputs([out], [src], companions=False)


def test_score_vector_and_fred_sidecars(tmp_path):
    save_scores(tmp_path / "s.npy", np.zeros(3, dtype=np.float32), {"ids": ["a", "b", "c"]})
    side = tmp_path / "s.json"
    # prefs build --scores s.npy --out s.json: the input's sidecar
    refuses([side], [tmp_path / "s.npy"], side, side)
    # an output score vector over an existing JSON input (its sidecar)
    other = tmp_path / "r.json"
    other.write_text("{}")
    refuses([tmp_path / "r.npy"], [other], tmp_path / "r.npy", other, companions="scores")
    # FreD statistics NAME.npz write NAME.json
    refuses([tmp_path / "r.npz"], [other], tmp_path / "r.npz", other)
    # an input's companion that does not exist is not protected (fred --private e.npy --out e.npz)
    save_embedding_set(str(tmp_path / "e.npy"), np.zeros((2, 3)), [{"id": "a"}, {"id": "b"}], {})
    check_outputs([tmp_path / "e.npz"], [tmp_path / "e.npy"])
    # ... but its existing ones are
    refuses([tmp_path / "e.jsonl"], [tmp_path / "e.npy"], tmp_path / "e.jsonl", tmp_path / "e.jsonl")
    refuses([tmp_path / "e.meta.json"], [tmp_path / "e.npy"], tmp_path / "e.meta.json",
            tmp_path / "e.meta.json")


def test_symlink_and_hard_link(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text("precious\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(src)
    refuses([link], [src], link, src)
    refuses([src], [link], src, link)
    hard = tmp_path / "hard.jsonl"
    os.link(src, hard)
    refuses([hard], [src], hard, src)
    # a symlinked directory: the output does not exist yet, compared by resolved path
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    inp = tmp_path / "real" / "x.npy"
    refuses([tmp_path / "alias" / "x.npy"], [inp], tmp_path / "alias" / "x.npy", inp)


def test_directory_input(ds):
    # popri embed DIR --out DIR/train.npy: the sidecar DIR/train.jsonl is the train split
    refuses([ds / "train.npy"], [ds], ds / "train.npy", ds / "train.jsonl")
    refuses([ds / "manifest.json"], [ds], ds / "manifest.json", ds / "manifest.json")
    # a split that does not exist yet would be added to the dataset
    (ds / "val.jsonl").unlink()
    refuses([ds / "val.jsonl"], [ds], ds / "val.jsonl", ds / "val.jsonl")
    # any file directly inside (--split NAME reads NAME.jsonl)
    (ds / "extra.jsonl").write_text("{}\n")
    refuses([ds / "extra.jsonl"], [ds], ds / "extra.jsonl", ds / "extra.jsonl")
    # the directory itself
    refuses([ds], [ds], ds, ds)
    # new files of other names are fine, and so is a file deeper down
    check_outputs([ds / "emb.npy", ds / "sub" / "train.jsonl"], [ds], companions="embeddings")


def test_two_outputs_collide(tmp_path):
    a = tmp_path / "a.json"
    with pytest.raises(InputError) as e:
        check_outputs([tmp_path / "p.jsonl", a, a], [])
    assert e.value.path == str(a)
    assert e.value.message == f"output would overwrite another output {a}; choose another name"
    # an output and another's sidecar
    with pytest.raises(InputError, match="another output .*x.jsonl"):
        check_outputs([tmp_path / "x.npy", tmp_path / "x.jsonl"], [], companions="embeddings")
    check_outputs([tmp_path / "x.npy", tmp_path / "x.jsonl"], [], companions="scores")
    # different names through a symlinked directory
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    with pytest.raises(InputError, match="another output"):
        check_outputs([tmp_path / "real" / "o.jsonl", tmp_path / "alias" / "o.jsonl"], [])


# --------------------------------------------------------------------------- CLI
def snapshot(root: Path) -> dict:
    """sha256 of every file under root (a new or changed file shows)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def refused(run_popri, args, root: Path, out, inp):
    before = snapshot(root)
    assert before
    p = run_popri(args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"popri: error: {clash(out, inp)}"], p.stderr
    assert snapshot(root) == before
    return p


def test_cli_embed_dataset_dir_sidecar_is_the_train_split(ds, tiny_st_model, tmp_path, run_popri):
    # the case: DIR/train.npy's sidecar DIR/train.jsonl replaced the texts, exit 0
    refused(run_popri, ["embed", ds, "--model", tiny_st_model, "--out", ds / "train.npy"],
            tmp_path, ds / "train.npy", ds / "train.jsonl")


def test_cli_gen_output_into_the_dataset(ds, tiny_lm, tmp_path, run_popri):
    # gen reads DIR/val.jsonl; --prompts-out DIR/train.jsonl would replace another split
    refused(run_popri, ["gen", ds, "--split", "val", "-K", "1", "-J", "1", "--model", tiny_lm,
                        "--prompts-out", ds / "train.jsonl"],
            tmp_path, ds / "train.jsonl", ds / "train.jsonl")


def test_cli_vary_stats_over_its_template(tiny_lm, tmp_path, run_popri):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "one two three four"}])
    tmpl = tmp_path / "tmpl.txt"
    tmpl.write_text("Say it again: {text}\n")
    refused(run_popri, ["vary", src, "--method", "paraphrase", "--model", tiny_lm,
                        "--template", tmpl, "--stats-out", tmpl, "--out", tmp_path / "v.jsonl"],
            tmp_path, tmpl, tmpl)


def test_cli_vary_lookahead_sidecar(tiny_lm, tmp_path, run_popri):
    src = write_jsonl(tmp_path / "pop.jsonl", [{"id": "a", "text": "one two three four"}])
    refused(run_popri, ["vary", src, "--method", "paraphrase", "--model", tiny_lm,
                        "--lookahead", "2", "--lookahead-out", tmp_path / "pop.npy"],
            tmp_path, tmp_path / "pop.npy", src)


def test_cli_expand_merged_into_the_dataset(ds, tiny_lm, tmp_path, run_popri):
    refused(run_popri, ["expand", ds, "-N", "2", "--out", tmp_path / "x", "--model", tiny_lm,
                        "--merged-out", ds / "train.jsonl"],
            tmp_path, ds / "train.jsonl", ds / "train.jsonl")


def test_cli_expand_merged_over_a_shard(tiny_lm, tmp_path, run_popri):
    seeds = write_jsonl(tmp_path / "seeds.jsonl", [{"id": str(i), "text": f"seed text {i}"}
                                                   for i in range(4)])
    merged = tmp_path / "x" / "shard-00000.jsonl"
    before = snapshot(tmp_path)
    p = run_popri(["expand", seeds, "-N", "2", "--out", tmp_path / "x", "--model", tiny_lm,
                   "--merged-out", merged])
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"popri: error: {merged}: output would overwrite another output {merged}; choose "
        "another name"], p.stderr
    assert snapshot(tmp_path) == before and not (tmp_path / "x").exists()


def test_cli_pe_init_over_its_input(tmp_path, run_popri):
    pub = write_jsonl(tmp_path / "P.jsonl", [{"id": f"p{i}", "text": f"public text {i}"}
                                             for i in range(6)])
    refused(run_popri, ["pe", "init", pub, "--num", "3", "--out", pub], tmp_path, pub, pub)


def test_cli_pe_draw_over_its_population(tmp_path, run_popri):
    pop = write_jsonl(tmp_path / "P.jsonl", [{"id": f"r1-p{i}", "text": f"text {i}"}
                                             for i in range(4)])
    save_scores(tmp_path / "h.npy", np.array([0, 2, 1, 0], dtype=np.float32),
                {"ids": [f"r1-p{i}" for i in range(4)], "mode": "nn-histogram"})
    refused(run_popri, ["pe", "draw", "--population", pop, "--scores", tmp_path / "h.npy",
                        "--num", "3", "--out", pop], tmp_path, pop, pop)
    # --stats-out over the histogram's sidecar
    refused(run_popri, ["pe", "draw", "--population", pop, "--scores", tmp_path / "h.npy",
                        "--num", "3", "--stats-out", tmp_path / "h.json"],
            tmp_path, tmp_path / "h.json", tmp_path / "h.json")


def test_cli_pe_seeds_over_a_round(tmp_path, run_popri):
    s1 = write_jsonl(tmp_path / "s1.jsonl", [{"id": "r1-s0", "round": 1, "text": "a b c"}])
    s2 = write_jsonl(tmp_path / "s2.jsonl", [{"id": "r2-s0", "round": 2, "text": "d e f"}])
    refused(run_popri, ["pe", "seeds", s1, s2, "--out", s2], tmp_path, s2, s2)


def test_cli_prefs_build_over_the_score_sidecar(tmp_path, run_popri):
    S = [{"id": f"s{j}", "prompt_id": "p0", "sample_idx": j, "prompt": "P", "text": f"t{j}"}
         for j in range(3)]
    sp = write_jsonl(tmp_path / "samples.jsonl", S)
    save_scores(tmp_path / "s.npy", np.array([1, 3, 2], dtype=np.float32),
                {"ids": [s["id"] for s in S]})
    # the case: --scores s.npy --out s.json replaced the score sidecar
    refused(run_popri, ["prefs", "build", "--samples", sp, "--scores", tmp_path / "s.npy",
                        "--rejected-rank", "2", "--out", tmp_path / "s.json"],
            tmp_path, tmp_path / "s.json", tmp_path / "s.json")
    rep = tmp_path / "r.json"
    before = snapshot(tmp_path)
    p = run_popri(["prefs", "build", "--samples", sp, "--scores", tmp_path / "s.npy",
                   "--rejected-rank", "2", "--out", rep, "--report-out", rep])
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"popri: error: {rep}: output would overwrite another output {rep}; choose another name"]
    assert snapshot(tmp_path) == before


def _adapter(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}) + "\n")
    (d / "adapter_model.safetensors").write_bytes(b"weights")
    return d


def _pairs(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"P{k}", "chosen": "good text",
                                                   "rejected": "bad text"} for k in range(4)])


def test_cli_dpo_adapter_it_would_replace(tiny_lm, tmp_path, run_popri):
    ad = _adapter(tmp_path / "o" / "adapter")
    refused(run_popri, ["dpo", "--pairs", _pairs(tmp_path), "--model", tiny_lm, "--adapter", ad,
                        "--out", tmp_path / "o", "--max-steps", "1"], tmp_path, ad, ad)


def test_cli_sft_adapter_it_would_replace(tiny_lm, tmp_path, run_popri):
    ad = _adapter(tmp_path / "o" / "adapter")
    refused(run_popri, ["sft", "--pairs", _pairs(tmp_path), "--model", tiny_lm, "--adapter", ad,
                        "--out", tmp_path / "o", "--max-steps", "1"], tmp_path, ad, ad)


def test_cli_train_downstream_over_the_dataset(ds, tiny_lm, tmp_path, run_popri):
    # --out DIR --force would replace the whole dataset directory by the checkpoint
    refused(run_popri, ["train-downstream", ds, "--val", ds, "--out", ds, "--force", "--model",
                        tiny_lm, "--max-steps", "1"], tmp_path, ds, ds)


def test_cli_train_downstream_input_inside_out(tiny_lm, tmp_path, run_popri):
    (tmp_path / "o").mkdir()
    syn = write_jsonl(tmp_path / "o" / "syn.jsonl", [{"text": "a synthetic text"}] * 4)
    refused(run_popri, ["train-downstream", syn, "--out", tmp_path / "o", "--force", "--model",
                        tiny_lm, "--max-steps", "1"], tmp_path, syn, syn)


def test_cli_eval_accuracy_per_client_over_the_split(ds, tiny_lm, tmp_path, run_popri):
    refused(run_popri, ["eval", "accuracy", "--model", tiny_lm, "--data", ds, "--split", "test",
                        "--per-client-out", ds / "test.jsonl"],
            tmp_path, ds / "test.jsonl", ds / "test.jsonl")


def test_cli_bench_fetch_over_its_source(ds, tmp_path, run_popri):
    src = ds / "train.jsonl"
    refused(run_popri, ["bench", "fetch", src, "--client-column", "client_id", "--tokenizer",
                        "whitespace", "--out", ds, "--force"], tmp_path, src, src)


def test_cli_run_dir_is_the_dataset(ds, tmp_path, run_popri):
    refused(run_popri, ["run", "--set", f"run_dir={ds}", "--set", f"data.dir={ds}"],
            tmp_path, ds, ds)


# score, aggregate and fred stats call the guard from their release code
# (popri/feedback/release.py, popri/cli/commands/aggregate.py, popri/cli/commands/fred.py).
def test_cli_score_sidecar_over_the_manifest(ds, tiny_st_model, tmp_path, run_popri):
    syn = write_jsonl(tmp_path / "syn.jsonl", [{"id": f"s{i}", "text": f"synthetic {i}"}
                                               for i in range(3)])
    refused(run_popri, ["score", "--private", ds, "--synthetic", syn, "--model", tiny_st_model,
                        "--noise-multiplier", "1", "--seed", "0", "--out", ds / "manifest.npy"],
            tmp_path, ds / "manifest.npy", ds / "manifest.json")


def test_cli_aggregate_over_its_input(tmp_path, run_popri):
    pc = tmp_path / "clients.npy"
    save_scores(pc, np.zeros((2, 3), dtype=np.float32),
                {"kind": "per-client", "ids": ["a", "b", "c"], "clients": ["c1", "c2"],
                 "mode": "cosine", "params": {}, "ledger": []})
    refused(run_popri, ["aggregate", pc, "--out", pc], tmp_path, pc, pc)


def test_cli_fred_stats_sidecar_over_the_manifest(ds, tiny_st_model, tmp_path, run_popri):
    refused(run_popri, ["fred", "stats", "--private", ds, "--non-private", "--model",
                        tiny_st_model, "--out", ds / "manifest.npz"],
            tmp_path, ds / "manifest.npz", ds / "manifest.json")


def test_a_users_file_named_like_a_companion_is_never_overwritten(tmp_path, run_popri):
    """Hostile case D02 (issue 66): `popri embed other.jsonl --out victim.npy` replaced the
    user's victim.jsonl (their samples) with the embedding set's row sidecar.  A companion
    that exists without its output beside it was not written with it: refused, kept."""
    from popri.core.errors import InputError
    from popri.core.guard import check_outputs

    victim = tmp_path / "victim.jsonl"
    victim.write_text('{"id": "a", "text": "my own samples"}\n')
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "b", "text": "other text"}\n')
    p = run_popri(["embed", other, "--out", tmp_path / "victim.npy"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "would overwrite" in p.stderr and "victim.jsonl" in p.stderr
    assert victim.read_text() == '{"id": "a", "text": "my own samples"}\n'
    assert not (tmp_path / "victim.npy").exists()
    for comp, kind in (("s.json", "scores"), ("e.meta.json", "embeddings")):
        (tmp_path / comp).write_text("{}")
        out = tmp_path / (comp.split(".")[0] + ".npy")
        with pytest.raises(InputError, match="would overwrite"):
            check_outputs([out], [], companions=kind)
        out.write_bytes(b"")  # the output beside it: a pair popri wrote, replaced as before
        check_outputs([out], [], companions=kind)
