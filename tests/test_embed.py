import json

import numpy as np

from conftest import write_jsonl


def test_tiny_model_embeds_and_caches(tiny_st_model, tmp_path, run_popri):
    src = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "text": "hello world"},
                                            {"id": "b", "text": "the union is strong", "client_id": "c1"}])
    run_popri(["embed", src, "--model", tiny_st_model, "--out", tmp_path / "e.npy"], check=True)
    emb = np.load(tmp_path / "e.npy")
    assert emb.shape == (2, 32) and emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    rows = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert rows == [{"id": "a"}, {"id": "b", "client_id": "c1"}]
    meta = json.loads((tmp_path / "e.meta.json").read_text())
    assert meta["normalize"] is True and meta["dim"] == 32
    # second run comes from the cache and is identical
    p2 = run_popri(["embed", src, "--model", tiny_st_model, "--out", tmp_path / "e2.npy"], check=True)
    assert "from cache" in p2.stderr
    assert np.array_equal(np.load(tmp_path / "e2.npy"), emb)


def test_embed_to_stdout_is_jsonl_only(tiny_st_model, tmp_path, run_popri):
    src = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "text": "hello"}])
    p = run_popri(["embed", "-", "--model", tiny_st_model, "--out", "-"],
                  input=src.read_text(), check=True)
    lines = p.stdout.splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert row["id"] == "a" and len(row["embedding"]) == 32 and "text" not in row


def test_embed_refuses_to_clobber_input(tiny_st_model, tmp_path, run_popri):
    src = write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "text": "hello"}])
    before = src.read_text()
    p = run_popri(["embed", src, "--model", tiny_st_model, "--out", tmp_path / "t.npy"])
    assert p.returncode == 2 and "would overwrite" in p.stderr
    assert src.read_text() == before and not (tmp_path / "t.npy").exists()


def test_malformed_line_names_file_and_line(tiny_st_model, tmp_path, run_popri):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": \n')
    p = run_popri(["embed", src, "--model", tiny_st_model, "--out", tmp_path / "o.npy"])
    assert p.returncode == 2
    assert f"{src}:2" in p.stderr and "malformed JSON" in p.stderr
    assert p.stderr.count("\n") == 1  # one clear line, no traceback
    assert not list(tmp_path.glob("o*"))
