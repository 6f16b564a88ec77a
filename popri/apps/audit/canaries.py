"""Canary clients and their membership scores from a run's released artifacts: the attack side of
``popri audit canaries`` (the run and the bound: popri/pipeline/canaries.py; the bound's maths:
popri/privacy/onerun.py, Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run",
arXiv:2305.08846).

    popri audit canaries examples/smoke.yaml --run-dir runs/canary --canaries 200

**Canaries** (:func:`make_canaries`).  m secrets, each one client's, each included in the
private data independently with probability 1/2 by a seeded draw (recorded in canaries.jsonl):

- ``random``: ``words`` words drawn uniformly from a public vocabulary (the words of the public
  data Omega): ~log2(|V|) bits a word, so no two canaries and no public text share a phrase;
- ``echo``: an in-distribution text (a public record's opening words) with a rare suffix of
  random words -- the design of "The Canary's Echo" (Meeus et al., 2025, arXiv:2502.14921) for
  synthetic text from LLMs: a text the generator would plausibly write, made identifiable by its
  suffix.

**Scores** (higher = more likely in), from the released artifacts only, never the private scores:

- ``embed``: the canary's best cosine similarity to a sample of the synthetic set, under the
  run's embedder (the reward's own eyes);
- ``lcs``: the canary's longest run of words in common with one sample of the synthetic set, as
  a share of the canary's words (verbatim leakage);
- ``generator``: log-likelihood ratio of the canary under the tuned generator (the released
  adapter) against the untuned one (a reference-model test: Carlini et al., "Membership
  inference attacks from first principles", arXiv:2112.03570), less the same ratio of the
  canary's words shuffled (the words' own gain, shared by every canary, cancels);
- ``model``: the same ratio for a released downstream model (DP-FedAvg / DP-FTRL's global model)
  against its initial weights;
- ``generator-raw``, ``model-raw``: the same ratios without the shuffled-words control.  Which
  is stronger depends on the vocabulary: when the canaries' words are rare (random words of a
  large public vocabulary) learning the words is itself the membership signal and the control
  removes it; when they are common, the control removes what every canary shares (measured
  on benchmarks/configs/canary-dpfl.yaml without noise: docs/privacy.md, the canary audit);
- ``model-rows``: white-box, for a released FULL model (DP-FedAvg / DP-FTRL's global model):
  how far the input-embedding rows of the canary's tokens moved from the initial weights (the
  mean L2 shift over the tokens no other canary holds; all its tokens when it has none).  A
  token's row moves when a client's text holds it (its gradient as input, and as target where
  the embeddings are tied) and hardly otherwise, so rare tokens make it a sharp test (a
  white-box score: it reads the released weights, which the one-run theorem allows as any
  other function of the output, arXiv:2305.08846).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from popri.eval.downstream import adapter_base
from popri.eval.fluency import text_nll
from popri.models.embed import embed_texts
from popri.models.llm import ADAPTER_CONFIG, load_causal_lm
from popri.specs.privacy import CANARY_SCORES as SCORES  # noqa: F401  (one list: the spec's)
from popri.specs.privacy import CANARY_STYLES as STYLES
_WORD = re.compile(r"[A-Za-z]{3,12}")


def vocabulary(texts: Sequence[str], *, min_words: int = 200) -> list[str]:
    """The distinct lower-case words (3-12 letters) of public ``texts``, sorted: the alphabet of
    the random canaries.  Too few words make guessable secrets: refused."""
    words = sorted({w.lower() for t in texts for w in _WORD.findall(str(t))})
    if len(words) < min_words:
        raise ValueError(f"the public data has {len(words)} distinct words; canaries need at "
                         f"least {min_words} to be secrets")
    return words


def make_canaries(m: int, *, vocab: Sequence[str], public_texts: Sequence[str], seed: int,
                  style: str = "random", words: int = 10) -> list[dict]:
    """``m`` canary records ``{id, client_id, text, included}``: each its own client, included
    w.p. 1/2 (the draw of the one-run game), from a stream seeded by ``seed`` alone."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)} (got {style!r})")
    if m < 2:
        raise ValueError(f"need at least 2 canaries (got {m})")
    rng = np.random.default_rng([int(seed), 0xCA7A])
    included = rng.random(m) < 0.5
    out = []
    for i in range(m):
        secret = " ".join(vocab[j] for j in rng.integers(0, len(vocab), size=words))
        if style == "echo":
            src = str(public_texts[int(rng.integers(0, len(public_texts)))]).split()
            text = " ".join(src[:24]) + " " + secret
        else:
            text = secret[0].upper() + secret[1:] + "."
        cid = f"canary-{i:04d}"
        out.append({"id": cid, "client_id": cid, "text": text, "included": bool(included[i])})
    return out


def _words(t: str) -> list[str]:
    return [w.lower() for w in re.findall(r"\w+", str(t))]


def longest_common_run(a: Sequence[str], b: Sequence[str]) -> int:
    """The length of the longest run of consecutive words ``a`` and ``b`` share (dynamic
    programming over the two sequences, O(|a| |b|))."""
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def lcs_scores(canaries: Sequence[str], samples: Sequence[str]) -> np.ndarray:
    """Each canary's longest common word run with one sample, over its own word count; a sample
    is compared only when it holds one of the canary's words (the others score 0 anyway)."""
    sw = [_words(s) for s in samples]
    index: dict[str, set[int]] = {}
    for k, ws in enumerate(sw):
        for w in set(ws):
            index.setdefault(w, set()).add(k)
    out = np.zeros(len(canaries))
    for i, c in enumerate(canaries):
        cw = _words(c)
        hits = set().union(*(index.get(w, set()) for w in set(cw))) if cw else set()
        best = max((longest_common_run(cw, sw[k]) for k in hits), default=0)
        out[i] = best / max(len(cw), 1)
    return out


def embed_scores(canaries: Sequence[str], samples: Sequence[str], embedder: str) -> np.ndarray:
    """Each canary's highest cosine similarity to a synthetic sample, under ``embedder``."""
    c = embed_texts(list(canaries), embedder, desc="embed canaries")
    s = embed_texts(list(samples), embedder, desc="embed synthetic")
    c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    s = s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-12)
    return (c @ s.T).max(axis=1).astype(np.float64)


def shuffled(texts: Sequence[str], seed: int = 0) -> list[str]:
    """Each text's words in a seeded random order: the same words (the same unigram content),
    not the same sequence -- the control of :func:`likelihood_gains`."""
    rng = np.random.default_rng([int(seed), 0x5F1E])
    out = []
    for t in texts:
        w = str(t).split()
        out.append(" ".join(w[i] for i in rng.permutation(len(w))))
    return out


def likelihood_gains(canaries: Sequence[str], *, model: str, adapter: str | None = None,
                     reference: str, reference_adapter: str | None = None) -> dict[str, np.ndarray]:
    """Mean per-token NLL of each canary under the reference minus under the released model
    (``model`` + ``adapter``), higher when the release learned the canary: ``raw``, and
    ``calibrated``, less the same gain on the canary's words shuffled (:func:`shuffled`): what
    the model learned of the words themselves -- shared by canaries in and out when the words
    are common -- cancels, and what is left is the sequence the included canaries taught it.
    One NLL pass per model over the canaries and their shuffles."""
    texts = list(canaries) + shuffled(canaries)
    nll, n = text_nll(model, texts, adapter=adapter)
    ref, rn = text_nll(reference, texts, adapter=reference_adapter)
    g = ref / np.maximum(rn, 1) - nll / np.maximum(n, 1)
    m = len(canaries)
    return {"raw": g[:m], "calibrated": g[:m] - g[m:]}


def row_shifts(canaries: Sequence[str], path: str, *, reference: str) -> np.ndarray:
    """The ``model-rows`` score (module docstring) of each canary: the mean L2 distance between
    the released full model's input-embedding rows of its tokens and the reference's (its
    initial weights), over the tokens no other canary holds (all its tokens when none is its
    own).  The tokens come from the reference's tokenizer, which the release shares."""
    from collections import Counter

    def rows(name: str):
        model, tok = load_causal_lm(name)
        return model.get_input_embeddings().weight.detach().double().numpy(), tok

    new, _ = rows(path)
    old, tok = rows(reference)
    ids = [sorted(set(tok(str(t), add_special_tokens=False)["input_ids"])) for t in canaries]
    held = Counter(i for row in ids for i in row)
    shift = np.linalg.norm(new - old, axis=1)
    out = np.zeros(len(canaries))
    for i, row in enumerate(ids):
        own = [t for t in row if held[t] == 1] or row
        out[i] = float(np.mean(shift[own])) if own else 0.0
    return out


def is_adapter(path: str) -> bool:
    """Whether a released model directory is a PEFT adapter (else a full model)."""
    return (Path(path) / ADAPTER_CONFIG).exists()


def model_gains(canaries: Sequence[str], path: str, *, reference: str) -> dict[str, np.ndarray]:
    """:func:`likelihood_gains` of a released downstream model directory (a full model, or a
    LoRA adapter on its recorded base) against ``reference``, its initial weights."""
    if is_adapter(path):
        return likelihood_gains(canaries, model=adapter_base(Path(path)), adapter=str(path),
                                reference=reference)
    return likelihood_gains(canaries, model=str(path), reference=reference)
