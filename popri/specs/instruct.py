"""The settings of ``popri instruct build``: instruction data from the offline corpora.

    popri instruct build debian --out data/instruct-debian --max-clients 10    # InstructSpec

Instruction tuning data for "FewFedPIT: Towards Privacy-preserving and Few-shot Federated
Instruction Tuning" (arXiv:2403.06131, section 4.1): triples (instruction, input, response)
held by clients.  No instruction corpus installs offline, so the tasks are made from the
corpora popri already reads (see :mod:`popri.data.instruct`); the paper's own client split
(KMeans clusters of the data, then Dirichlet(1.0) over clients with the cluster as label, after
Hsu et al. 2019) is ``partition: clusters``.

Pure Python: no torch / numpy import.
"""

from __future__ import annotations

from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param
from popri.specs.data import EMBEDDER, SPLIT_RULES

#: how samples are given to clients
PARTITIONS = ("natural", "clusters", "iid")


@dataclass(frozen=True)
class InstructSpec(Spec):
    """How a corpus becomes federated instruction data (``popri instruct build``)."""

    max_output_words: int = param(
        96, "Cut a response to at most this many words, at a sentence end where one falls in "
        "the last half (debian long descriptions run to hundreds of words; CPU-sized default).",
        lo=1)
    min_output_words: int = param(
        4, "Drop examples whose response has fewer words.", lo=1)
    context_words: int = param(
        48, "sotu: words of the passage given as input (whole sentences, at least this many); "
        "the response is the passage that follows.", lo=1)
    max_samples_per_client: int | None = param(
        None, "Keep at most M examples per client, chosen by seeded hash (FewFedPIT is "
        "few-shot: 1000 examples over 50 clients).", lo=1)
    max_clients: int | None = param(
        None, "Keep a seeded subset of this many clients (natural partition), e.g. 10 for the "
        "issue's CPU run.", lo=1)
    partition: str = param(
        "natural", "Who holds what: 'natural' (the corpus' own clients: debian maintainers, "
        "sotu addresses, shakespeare roles, a table's client column), 'clusters' (FewFedPIT "
        "4.1: faiss k-means on MiniLM embeddings of instruction + input into --clusters groups, "
        "then each group spread over --num-clients by Dirichlet(--alpha)) or 'iid'.",
        cite="FewFedPIT 4.1", choices=PARTITIONS)
    clusters: int = param(
        100, "k of the k-means (partition clusters; FewFedPIT: 100).", lo=1)
    per_cluster: int | None = param(
        None, "Keep this many examples of each cluster before the split (FewFedPIT: 10 or 5, "
        "making the few-shot set); default all.", lo=1)
    num_clients: int = param(
        10, "Clients of the clusters / iid partition (FewFedPIT: 10 cross-silo, 50 "
        "cross-device).", lo=1)
    alpha: float = param(
        1.0, "Dirichlet concentration of the clusters partition (FewFedPIT: 1.0; smaller = "
        "less IID).", lo=0, lo_open=True)
    embedder: str = param(
        EMBEDDER, "Sentence embedder of the clusters partition.", nonempty=True)
    split: str = param(
        "hash", "Client-level split: 'hash' (sha256 of '{seed}:{client_id}') or 'date' "
        "(sotu: latest addresses to test).", choices=SPLIT_RULES)
    val_frac: float = param(0.1, "Fraction of clients for val.", lo=0, hi=1, hi_open=True)
    test_frac: float = param(0.1, "Fraction of clients for test.", lo=0, hi=1, hi_open=True)

    def check(self) -> None:
        if self.val_frac + self.test_frac >= 1.0:
            raise ConfigError(f"val_frac + test_frac must be < 1 (got {self.val_frac} + "
                              f"{self.test_frac}); nothing would be left for train",
                              field="val_frac")
        if self.min_output_words > self.max_output_words:
            raise ConfigError(f"is above max_output_words ({self.min_output_words} > "
                              f"{self.max_output_words}): every example would be dropped",
                              field="min_output_words")
        if self.partition != "natural" and self.max_clients is not None:
            raise ConfigError("applies to the natural partition only; the clusters / iid "
                              "partitions make --num-clients clients", field="max_clients")
        if self.partition != "clusters" and self.per_cluster is not None:
            raise ConfigError("needs partition 'clusters'", field="per_cluster")
