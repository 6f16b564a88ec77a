"""The data specs (FetchSpec, EmbedSpec) and the one source registry.

    python -m pytest -q tests/test_specs_data.py

- validation: each field's range / choices, the cross-field checks, strict ``from_dict``;
- the CLI: a bad value exits 2 with one line naming the flag;
- ``to_argv`` round trip through the real ``popri bench fetch`` / ``popri embed`` click commands
  (every option default is the spec's default: written once);
- the registry: a source registered in a test is listed by ``popri bench list`` and built by
  ``popri bench fetch`` with no other code changed.
"""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from popri.cli.options import build
from popri.core.errors import ConfigError, InputError
from popri.core.spec import default, to_argv
from popri.specs.data import EMBEDDER, EmbedSpec, FetchSpec

from conftest import click_command


_command = click_command


def _parse(spec_cls, path: tuple[str, ...], argv: list[str]):
    """The spec the real command would build from ``argv`` (parsed, not run)."""
    ctx = _command(*path).make_context(path[-1], argv, resilient_parsing=True)
    return build(spec_cls, **{f.name: ctx.params[f.name] for f in fields(spec_cls)
                              if f.metadata.get("cli", True)})


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kw, field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_words": -1}, "min_words"),
    ({"max_clients": 0}, "max_clients"),
    ({"max_samples_per_client": 0}, "max_samples_per_client"),
    ({"split": "random"}, "split"),
    ({"val_frac": 1.0}, "val_frac"),
    ({"test_frac": -0.1}, "test_frac"),
    ({"val_frac": float("nan")}, "val_frac"),
    ({"val_frac": 0.5, "test_frac": 0.5}, "val_frac"),
    ({"tokenizer": " "}, "tokenizer"),
    ({"date_from": "2001", "date_to": "2000-12-31"}, "date_from"),
])
def test_fetch_spec_rejects(kw, field):
    with pytest.raises(ConfigError) as e:
        FetchSpec(**kw)
    assert e.value.field == field


def test_fetch_spec_accepts_date_prefixes_and_edges():
    FetchSpec(date_from="2020-06", date_to="2020")  # a month inside the year: kept as before
    FetchSpec(val_frac=0.0, test_frac=0.0, min_words=0, max_tokens=1)
    assert FetchSpec().tokenizer == EMBEDDER == EmbedSpec().model == "all-MiniLM-L6-v2"


@pytest.mark.parametrize("kw, field", [
    ({"batch_size": 0}, "batch_size"), ({"model": ""}, "model"), ({"max_length": 0}, "max_length"),
])
def test_embed_spec_rejects(kw, field):
    with pytest.raises(ConfigError) as e:
        EmbedSpec(**kw)
    assert e.value.field == field


def test_from_dict_is_strict_and_coerces():
    assert FetchSpec.from_dict({"max_tokens": "32", "split": "date"}) == \
        FetchSpec(max_tokens=32, split="date")
    with pytest.raises(ConfigError, match="unknown key") as e:
        FetchSpec.from_dict({"max_token": 32}, "data")
    assert e.value.field == "data.max_token"
    with pytest.raises(ConfigError) as e:
        EmbedSpec.from_dict({"batch_size": 0}, "embed")
    assert e.value.field == "embed.batch_size"


def test_embed_default_model_reads_the_spec(monkeypatch):
    from popri.models import embed as E

    monkeypatch.delenv("POPRI_EMBED_MODEL", raising=False)
    assert E.default_model() == default(EmbedSpec, "model")
    assert E.embed_spec(None) == EmbedSpec()
    monkeypatch.setenv("POPRI_EMBED_MODEL", "other-model")
    assert E.default_model() == "other-model"
    assert E.embed_spec(None, batch_size=8) == EmbedSpec(model="other-model", batch_size=8)
    assert E.embed_spec(EmbedSpec(), normalize=None) == EmbedSpec()  # None keeps the field


def test_embed_cache_key_follows_model_content(tmp_path):
    """A model changed in place (same file names and sizes) gets a new key; batch size and
    device do not enter it."""
    from popri.models import embed as E

    m = tmp_path / "model"
    m.mkdir()
    (m / "weights.bin").write_bytes(b"\x00" * 64)
    spec = EmbedSpec(model=str(m))
    k1 = E.cache_key(spec, ["a", "b"])
    assert k1 == E.cache_key(spec.replace(batch_size=3, device="cpu"), ["a", "b"])
    assert k1 != E.cache_key(spec, ["b", "a"])
    assert k1 != E.cache_key(spec.replace(normalize=False), ["a", "b"])
    import os

    st = (m / "weights.bin").stat()
    (m / "weights.bin").write_bytes(b"\x01" * 64)
    os.utime(m / "weights.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert E.cache_key(spec, ["a", "b"]) != k1


# --------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("argv, flag", [
    (["bench", "fetch", "sotu", "--val-frac", "1.5"], "--val-frac"),
    (["bench", "fetch", "sotu", "--val-frac", "0.5", "--test-frac", "0.5"], "--val-frac"),
    (["bench", "fetch", "sotu", "--split", "random"], "--split"),
    (["bench", "fetch", "sotu", "--max-clients", "0"], "--max-clients"),
    (["bench", "fetch", "sotu", "--max-tokens", "0"], "--max-tokens"),
    (["embed", "x.jsonl", "--batch-size", "0"], "--batch-size"),
])
def test_cli_bad_value_exits_2_naming_the_flag(run_popri, tmp_path, argv, flag):
    p = run_popri([*argv, "--out", tmp_path / "out"])
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("popri: error:") and flag in lines[0]
    assert not (tmp_path / "out").exists()


def test_fetch_options_default_to_the_spec():
    params = {p.name: p for p in _command("bench", "fetch").params}
    for f in fields(FetchSpec):
        assert params[f.name].default == default(FetchSpec, f.name), f.name
    params = {p.name: p for p in _command("embed").params}
    for f in fields(EmbedSpec):
        if f.metadata.get("cli", True):
            assert params[f.name].default == default(EmbedSpec, f.name), f.name


@pytest.mark.parametrize("spec", [
    FetchSpec(),
    FetchSpec(max_tokens=32, min_words=0, tokenizer="whitespace", max_samples_per_client=8,
              max_clients=5, split="date", val_frac=0.25, test_frac=1 / 3, date_from="1900",
              date_to="1999-12-31"),
])
def test_fetch_spec_to_argv_round_trip_through_bench_fetch(spec):
    argv = to_argv(spec)
    assert _parse(FetchSpec, ("bench", "fetch"), ["sotu", "--out", "d", *argv]) == spec


@pytest.mark.parametrize("spec", [EmbedSpec(), EmbedSpec(model="m", normalize=False,
                                                         batch_size=7)])
def test_embed_spec_to_argv_round_trip_through_embed(spec, monkeypatch):
    monkeypatch.delenv("POPRI_EMBED_MODEL", raising=False)
    argv = to_argv(spec)
    assert "--max-length" not in argv and "--device" not in argv  # config-only settings
    assert _parse(EmbedSpec, ("embed",), ["in.jsonl", "--out", "o.npy", *argv]) == spec


# --------------------------------------------------------------------------- registry
def _run_in_process(argv: list[str]) -> None:
    _command().main(args=argv, prog_name="popri", standalone_mode=False)


def test_registered_source_is_listed_and_fetched(monkeypatch, tmp_path, capsys):
    """Adding a source = one loader + one registry entry: nothing else changes."""
    from popri.data import sources

    monkeypatch.setattr(sources, "SOURCES", dict(sources.SOURCES))  # restored after the test
    for v in ("POPRI_THREADS", "POPRI_CONFIG", "POPRI_QUIET"):
        monkeypatch.delenv(v, raising=False)
    seen = {}

    @sources.register_source("toy", client="one user", origin="this test")
    def load_toy(source: str | None = None) -> sources.SourceData:
        seen["source"] = source
        docs = [sources.Document(f"u{i % 4}", f"Toy sentence number {i} is here. It has a "
                                              f"second sentence too.", f"2024-01-0{1 + i % 4}")
                for i in range(12)]
        return sources.SourceData("toy", "toy 1", docs, {"origin": "test"})

    assert "toy" in sources.SOURCES and sources.SOURCES["toy"].options() == {"source"}
    _run_in_process(["bench", "list", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["toy"] == {"name": "toy", "client": "one user", "origin": "this test",
                           "available": True, "detail": "registered"}
    assert {"sotu", "shakespeare", "debian", "biorxiv", "congress", "pubmed"} <= set(rows)

    out = tmp_path / "toy"
    _run_in_process(["bench", "fetch", "toy", "--out", str(out), "--tokenizer", "whitespace",
                     "--max-tokens", "16", "--val-frac", "0.25", "--test-frac", "0.25",
                     "--source", "here"])
    assert seen["source"] == "here"
    man = json.loads((out / "manifest.json").read_text())
    assert man["source"]["name"] == "toy" and man["source"]["origin"] == "test"
    assert sum(c["clients"] for c in man["counts"].values()) == 4
    assert man["chunking"]["max_tokens"] == 16 and man["split"]["val_frac"] == 0.25

    with pytest.raises(InputError, match="--hub-id does not apply to source 'toy'"):
        _run_in_process(["bench", "fetch", "toy", "--out", str(tmp_path / "x"),
                         "--hub-id", "a/b"])
    with pytest.raises(ValueError, match="already registered"):
        sources.register_source("toy", client="c", origin="o")(load_toy)
    with pytest.raises(InputError, match="unknown source 'nope': use one of sotu, .*toy"):
        sources.get_source("nope")
