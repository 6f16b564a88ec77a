"""Few-shot prompts, and the cleaning and degeneracy check of what the generator wrote.

    python -c "from popri.models.prompts import build_prompts; print(build_prompts(['a b', 'c d', 'e f'], 1, seed=0)[0]['prompt'])"

The text side of Algorithm 1 line 3 of "Private Federated Learning using Preference-Optimized
Synthetic Data" (POPri, arXiv:2504.16438) and of ``Expand`` in "PrE-Text: Training Language
Models on Private Federated Data in the Age of LLMs" (PrE-Text, arXiv:2406.02958).

Prompts (POPri B.2 / Figure 5, PrE-Text Figure 3, the POPri reference ``generation_prompt.txt``):
each prompt shows ``shots`` (3) distinct, whitespace-normalised texts of the initial population
Omega as "Original Text Sample 1..3" and ends with "Original Text Sample 4"; the model writes
sample 4.  A generation is cut at the next "Original Text Sample" (a partial marker left at the
end by the token limit is dropped too), whitespace-normalised and truncated to ``max_tokens``
tokens of the generator's tokenizer (64, POPri's ``trunc_len``).  :func:`degeneracy` says why a
cleaned sample is unusable (empty, short, repetitive, a copy of a shot).

Pure Python and numpy (no torch): split out of ``popri.models.generation`` (issue 38), which
re-exports every name.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

import numpy as np

from popri.core.errors import InputError
from popri.data.tokenize import hf_counter, prefix_for_tokens
from popri.specs.generation import MARKER, GenSpec

DEFAULT_TEMPLATE = (
    "List of 6 diverse original text samples:\n"
    "Original Text Sample 1\n{sample1}\n"
    "Original Text Sample 2\n{sample2}\n"
    "Original Text Sample 3\n{sample3}\n"
    "Original Text Sample 4\n"
)
# degeneracy thresholds (documented in `popri gen --help`)
TOP_WORD_SHARE = 0.5      # one word making up more than half of the words
LOOP_MIN_WORDS = 10       # ... or, from 10 words on,
LOOP_TRIGRAM_SHARE = 0.5  # fewer than half of the word trigrams distinct
COPY_WORDS = 8            # first 8 words found verbatim in the prompt = copied example


def normalise_ws(text: str) -> str:
    return " ".join(str(text).split())


# --------------------------------------------------------------------------- prompts
def template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def check_template(template: str, shots: int) -> None:
    """Placeholders must be exactly the shots: ``{sample1}..{sampleN}`` (or ``{0}..{N-1}``)."""
    try:
        fields = template_fields(template)
    except ValueError as e:
        raise InputError(f"malformed template ({e}); write literal braces as {{{{ and }}}}",
                         field="template") from None
    used = set()
    for f in fields:
        m = re.fullmatch(r"sample(\d+)|(\d+)", f)
        if not m:
            raise InputError(f"unknown placeholder {{{f}}}: use {{sample1}}..{{sample{shots}}}",
                             field="template")
        idx = int(m.group(1)) - 1 if m.group(1) else int(m.group(2))
        if not 0 <= idx < shots:
            raise InputError(f"placeholder {{{f}}} is beyond the {shots} shots (--shots)",
                             field="template")
        used.add(idx)
    if len(used) != shots:
        raise InputError(f"template uses {len(used)} of {shots} shots; every one of "
                         f"{{sample1}}..{{sample{shots}}} must appear (or change --shots)",
                         field="template")


def read_template(path: str | None, check) -> str | None:
    """A prompt template from a file (None when no file is given), checked by ``check(text)``;
    any problem is one InputError naming the file."""
    if not path:
        return None
    from pathlib import Path

    if not Path(path).is_file():
        raise InputError("no such file", path=path)
    text = Path(path).read_text(encoding="utf-8")
    try:
        check(text)
    except InputError as e:
        raise InputError(e.message, path=path, field=e.field) from None
    return text


def fill_template(template: str, examples: Sequence[str]) -> str:
    named = {f"sample{i + 1}": ex for i, ex in enumerate(examples)}
    return template.format(*examples, **named)


def build_prompts(omega_texts: Sequence[str], num_prompts: int, *, seed: int,
                  shots: int = GenSpec.shots,
                  template: str | None = None, ids: Sequence | None = None) -> list[dict]:
    """K prompts, each filled with ``shots`` distinct random texts of Omega (seeded).

    Returns ``[{"prompt_id", "prompt", "examples": [ids or indices], "example_texts"}]``.
    Texts are whitespace-normalised (as the reference code does) and de-duplicated, so the
    shots of one prompt are always distinct texts.
    """
    template = DEFAULT_TEMPLATE if template is None else template
    check_template(template, shots)
    if num_prompts < 0 or shots < 1:
        raise ValueError("num_prompts must be >= 0 and shots >= 1")
    seen: dict[str, int] = {}
    for i, t in enumerate(omega_texts):
        n = normalise_ws(t)
        if n and n not in seen:
            seen[n] = i
    pool = list(seen.items())
    if len(pool) < shots:
        raise InputError(f"the initial population has {len(pool)} distinct non-empty texts; "
                         f"each prompt needs {shots}", field="text")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x9E4E]))
    out = []
    for k in range(num_prompts):
        pick = rng.choice(len(pool), size=shots, replace=False)
        texts = [pool[j][0] for j in pick]
        idx = [pool[j][1] for j in pick]
        out.append({"prompt_id": k, "prompt": fill_template(template, texts),
                    "examples": [ids[i] for i in idx] if ids is not None else idx,
                    "example_texts": texts})
    return out


# --------------------------------------------------------------------------- cleaning
def cut_at_marker(raw: str, marker: str = MARKER) -> str:
    """Text before the next ``marker``; a partial marker (>= 4 chars) at the very end goes too."""
    text = raw.split(marker, 1)[0]
    stripped = text.rstrip()
    for k in range(len(marker) - 1, 3, -1):
        if stripped.endswith(marker[:k]):
            before = stripped[:-k]
            if not before or before[-1].isspace():
                return before
    return text


def truncate_tokens(text: str, tokenizer, max_tokens: int) -> str:
    """At most ``max_tokens`` tokens of ``tokenizer``, cut on the original characters."""
    if tokenizer is not None and max_tokens > 0:  # a long text is cut first (same result)

        text = prefix_for_tokens(text, max_tokens, hf_counter(tokenizer))
    if tokenizer is None or max_tokens <= 0:
        return text
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError):  # slow tokenizer: the reference's way
        toks = tokenizer.tokenize(text)
        return text if len(toks) <= max_tokens else tokenizer.convert_tokens_to_string(
            toks[:max_tokens]).strip()
    if len(ids) <= max_tokens:
        return text
    out = text[:offsets[max_tokens - 1][1]].rstrip()
    # a BPE can re-merge differently at the cut: shrink until it fits
    while out and len(tokenizer(out, add_special_tokens=False)["input_ids"]) > max_tokens:
        out = out[:-1].rstrip()
    return out


def clean_generation(raw: str, tokenizer, max_tokens: int, marker: str = MARKER) -> str:
    """Cut at the next marker, normalise whitespace, truncate to ``max_tokens`` tokens."""
    return normalise_ws(truncate_tokens(normalise_ws(cut_at_marker(raw, marker)), tokenizer,
                                        max_tokens))


# --------------------------------------------------------------------------- degeneracy
def _words(text: str) -> list[str]:
    return [w for w in text.split() if any(c.isalnum() for c in w)]


def _key(w: str) -> str:
    return w.casefold().strip(string.punctuation + "“”‘’«»")


def degeneracy(text: str, *, min_words: int = GenSpec.min_words, prompt: str = "",
               examples: Sequence[str] = ()) -> str | None:
    """Why ``text`` is degenerate, or None.

    - ``empty``: nothing left after cleaning;
    - ``short``: fewer than ``min_words`` words (a word has a letter or digit);
    - ``repetitive``: one word is more than half of the words, or (from 10 words on) fewer than
      half of the word trigrams are distinct (a loop);
    - ``copy``: equals one of the prompt's examples, or its first 8 words appear verbatim in the
      prompt (case- and whitespace-insensitive).
    """
    if not text.strip():
        return "empty"
    words = _words(text)
    if len(words) < min_words:
        return "short"
    keys = [_key(w) for w in words]
    if keys and Counter(keys).most_common(1)[0][1] > TOP_WORD_SHARE * len(keys):
        return "repetitive"
    if len(keys) >= LOOP_MIN_WORDS:
        tri = list(zip(keys, keys[1:], keys[2:]))
        if len(set(tri)) < LOOP_TRIGRAM_SHARE * len(tri):
            return "repetitive"
    low = " ".join(text.casefold().split())
    if any(low == " ".join(e.casefold().split()) for e in examples):
        return "copy"
    if prompt and len(words) >= COPY_WORDS:
        toks = low.split()
        needle = " ".join(toks[:COPY_WORDS])
        if f" {needle} " in f" {' '.join(prompt.casefold().split())} ":
            return "copy"
    return None
