"""Chunk documents into samples of at most N tokens, packing whole sentences.

    python -m pytest -q tests/test_bench.py -k chunk

Rules (the same for every source):

1. Whitespace is normalised: paragraphs (blank-line separated) are kept as sentence boundaries,
   then every run of whitespace becomes one space (Unicode NFC first).
2. Sentences come from a regex splitter (``.``/``!``/``?`` + closing quotes, then a space and an
   upper-case letter, digit or opening quote; common abbreviations and initials do not end one).
3. Whole sentences are packed greedily while the chunk stays within ``max_tokens`` (sequence
   length 64 in "Private Federated Learning using Preference-Optimized Synthetic Data", POPri,
   arXiv:2504.16438, appendix B.1, and in "PrE-Text: Training Language Models on Private
   Federated Data in the Age of LLMs", PrE-Text, arXiv:2406.02958).  A sentence longer than that is cut at token boundaries,
   preferring the last boundary that starts a word; its tail is packed with what follows.
4. Chunks are substrings of the normalised ORIGINAL text (offsets from the tokenizer), so casing
   survives an uncased tokenizer.  Chunks with fewer than ``min_words`` words are dropped.
5. Chunks are re-tokenized on their own (all of them for BPE-like tokenizers, whose merges can
   differ at a chunk's edge; only those cut inside a word for whitespace-splitting ones such as
   WordPiece); one over the limit is cut again at its own token boundaries.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Sequence

import numpy as np

from popri.data.tokenize import Tokenizer

_PARA = re.compile(r"\n[ \t\r\f\v]*\n")
_END = re.compile(r"[.!?]+[\"'\)\]\u201d\u2019]*(?=\s+[\"'\(\[\u201c\u2018]?[A-Z0-9])")
_CLOSERS = "\"')]\u201d\u2019"
_ABBREV = {
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "gen", "gov", "sen", "rep", "hon", "rev",
    "col", "capt", "lt", "sgt", "no", "nos", "vs", "etc", "e.g", "i.e", "cf", "fig", "vol",
    "inc", "ltd", "co", "corp", "dept", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
    "sept", "oct", "nov", "dec", "mt", "ft", "approx", "al",
}


def normalize(text: str) -> tuple[str, list[int]]:
    """NFC + one space between words; returns the text and the offsets where paragraphs start."""
    text = unicodedata.normalize("NFC", text)
    paras = [" ".join(p.split()) for p in _PARA.split(text)]
    paras = [p for p in paras if p]
    starts, pos = [], 0
    for p in paras:
        starts.append(pos)
        pos += len(p) + 1
    return " ".join(paras), starts


def _is_abbrev(text: str, dot: int) -> bool:
    """Is the ``.`` at ``dot`` the end of an abbreviation or an initial (``U.S.``, ``J.``)?"""
    j = dot
    while j > 0 and not text[j - 1].isspace():
        j -= 1
    word = text[j:dot].strip("\"'([\u201c\u2018").lower()
    if not word:
        return False
    if word in _ABBREV:
        return True
    # single letters and dotted initials: "J." "U.S." "a.m."
    return len(word.replace(".", "")) <= 1 or bool(re.fullmatch(r"(?:[a-z]\.)+[a-z]", word))


def sentence_spans(text: str, para_starts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Character spans of the sentences of a normalised text."""
    cuts = set(p for p in para_starts if p > 0)
    for m in _END.finditer(text):
        if m.group(0).rstrip(_CLOSERS) == "." and _is_abbrev(text, m.start()):
            continue
        cuts.add(m.end() + 1)  # the next sentence starts after the single space
    bounds = sorted(c for c in cuts if 0 < c < len(text))
    spans, s = [], 0
    for c in bounds:
        spans.append((s, c - 1))
        s = c
    if s < len(text):
        spans.append((s, len(text)))
    return [(a, b) for a, b in spans if b > a]


def _cut_long(text: str, starts: np.ndarray, lo: int, hi: int, max_tokens: int) -> list[tuple[int, int]]:
    """Token ranges of at most ``max_tokens`` covering [lo, hi), cutting at word starts if possible."""
    out = []
    pos = lo
    while hi - pos > max_tokens:
        cut = pos + max_tokens
        for b in range(pos + max_tokens, pos, -1):
            st = int(starts[b])
            if st == 0 or text[st - 1] == " ":
                cut = b
                break
        out.append((pos, cut))
        pos = cut
    out.append((pos, hi))
    return out


def _visible_starts(text: str, spans: np.ndarray) -> np.ndarray:
    """Token starts moved past leading spaces (byte-level BPE offsets include the space before
    a word), so a token belongs to the sentence of its first visible character."""
    starts = spans[:, 0].copy()
    if not len(starts) or not text:
        return starts
    space = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == 32
    lead = (starts < spans[:, 1]) & space[np.clip(starts, 0, len(text) - 1)]
    for i in np.flatnonzero(lead):
        st, en = int(starts[i]), int(spans[i, 1])
        while st < en and text[st] == " ":
            st += 1
        starts[i] = st
    return starts


def pack(text: str, spans: np.ndarray, sentences: Sequence[tuple[int, int]],
         max_tokens: int) -> list[tuple[int, int]]:
    """Greedy sentence packing of one normalised text: character spans of the chunks."""
    n = len(spans)
    if n == 0:
        return []
    starts, ends = _visible_starts(text, spans), spans[:, 1]
    ranges = []  # token index ranges of the chunks
    cur: list[int] | None = None
    for cs, ce in sentences:
        t0 = int(np.searchsorted(starts, cs, side="left"))
        t1 = int(np.searchsorted(starts, ce, side="left"))
        if t1 <= t0:
            continue
        if cur is not None and t1 - cur[0] <= max_tokens:
            cur[1] = t1
            continue
        if cur is not None:
            ranges.append(tuple(cur))
            cur = None
        if t1 - t0 <= max_tokens:
            cur = [t0, t1]
        else:
            pieces = _cut_long(text, starts, t0, t1, max_tokens)
            ranges.extend(pieces[:-1])
            cur = list(pieces[-1])
    if cur is not None:
        ranges.append(tuple(cur))
    return [(int(starts[a]), int(ends[b - 1])) for a, b in ranges]


def _inside_word(text: str, a: int, b: int) -> bool:
    """Does the chunk text[a:b] start or end inside a run of non-space characters?"""
    return (a > 0 and text[a - 1] != " ") or (b < len(text) and text[b] != " ")


def chunk_texts(texts: Sequence[str], tokenizer: Tokenizer, max_tokens: int,
                min_words: int = 0, progress=None) -> list[list[str]]:
    """Chunks of each text (``progress(n)`` is called as documents are done)."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    norm = [normalize(t) for t in texts]
    out: list[list[str]] = []
    suspect: list[list[bool]] = []  # chunks whose stand-alone token count must be re-checked
    step = 256
    for s in range(0, len(norm), step):
        block = norm[s:s + step]
        spans = tokenizer.spans([t for t, _ in block])
        for (t, paras), sp in zip(block, spans):
            cs = pack(t, sp, sentence_spans(t, paras), max_tokens)
            out.append([t[a:b].strip() for a, b in cs])
            suspect.append([not tokenizer.word_exact or _inside_word(t, a, b) for a, b in cs])
        if progress:
            progress(len(block))
    _enforce_limit(out, suspect, tokenizer, max_tokens)
    if min_words:
        out = [[c for c in chunks if len(c.split()) >= min_words] for chunks in out]
    return out


def _enforce_limit(chunked: list[list[str]], suspect: list[list[bool]], tokenizer: Tokenizer,
                   max_tokens: int) -> None:
    """Re-tokenize the suspect chunks alone; cut again any over the limit (in place).

    With a tokenizer that splits words on whitespace first (``word_exact``: WordPiece, the
    whitespace one) a chunk that starts and ends at word boundaries has exactly the tokens it
    was counted with, so only chunks cut inside a word are re-checked; otherwise all are.
    """
    todo = [(i, j) for i, fl in enumerate(suspect) for j, f in enumerate(fl) if f]
    for r in range(8):
        if not todo:
            return
        limit = max(1, max_tokens - r)  # a piece that re-tokenizes longer is cut shorter next time
        counts = tokenizer.count([chunked[i][j] for i, j in todo])
        over = [(i, j) for (i, j), k in zip(todo, counts) if k > max_tokens]
        if not over:
            return
        spans = dict(zip(over, tokenizer.spans([chunked[i][j] for i, j in over])))
        todo = []
        for i in sorted({i for i, _ in over}):
            row: list[str] = []
            for j, c in enumerate(chunked[i]):
                if (i, j) not in spans:
                    row.append(c)
                    continue
                sp = spans[(i, j)]
                vis = _visible_starts(c, sp)
                for a, b in _cut_long(c, vis, 0, len(sp), limit):
                    piece = c[int(vis[a]):int(sp[b - 1, 1])].strip()
                    if piece:
                        todo.append((i, len(row)))
                        row.append(piece)
            chunked[i] = row
    raise RuntimeError("could not bring every chunk under the token limit")
