"""FewFedPIT, FedIT and FedMIT as stages of ``popri run`` (``method: fewfedpit | fedit |
fedmit``), on instruction data built by ``popri instruct build``.

    popri run examples/fewfedpit.yaml --dry-run                      # lists every stage
    popri run examples/fewfedpit.yaml --set method=fedit

"FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning"
(arXiv:2403.06131), Algorithm 1: ``fewfedpit init`` (W^g_0), then per round r the
``clients_per_round`` clients drawn by a seeded choice (the run's seed and r) each run
``local``, ``selfgen``, ``train`` and ``mix`` (fedit: ``local`` and ``mix`` with beta = 1;
fedmit: ``local`` for the IFS model, ``selfgen``, ``train`` on private + synthetic, ``mix``),
one cached, resumable stage each, then ``aggregate``.  Evaluation (:func:`evaluation`): ``eval
instruct`` (response-token accuracy, Rouge-L) and ``audit extract`` (leakage) of the last round's
global model, of the base model (eps = 0) and of centralised tuning on the pooled training
examples (eps = inf, the paper's skyline), and the gap closed on the token accuracy.

No DP guarantee: every aggregate records a noise-free ledger entry, so the run's total is
eps = inf and the results say "no DP guarantee".  The popri extension (fewfedpit.clip +
fewfedpit.noise_multiplier) clips the uploads and adds Gaussian noise; its entries are
declared, and a budget in privacy.epsilon is then enforced as for any DP stage.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Iterator

from popri.core.errors import ConfigError
from popri.core.io import read_json, write_json
from popri.kit import DPRelease, Stage, released_line, settings
from popri.methods.base import Method
from popri.privacy.entries import gaussian
from popri.privacy.noise import make_rng
from popri.privacy.plan import Noise, mode_of
from popri.specs.commands.audit import AuditExtractCall
from popri.specs.commands.eval import EvalGapCall, EvalInstructCall
from popri.specs.commands.fewfedpit import (
    FewfedpitAggregateCall,
    FewfedpitInitCall,
    FewfedpitLocalCall,
    FewfedpitMixCall,
    FewfedpitSelfgenCall,
    FewfedpitTrainCall,
)
from popri.specs.commands.instruct import InstructBuildCall
from popri.specs.fewfedpit import FewFedPITSpec
from popri.specs.instruct import InstructSpec

#: FewFedPITSpec fields each stage takes from the config's fewfedpit section
_TRAIN = ("lr", "local_epochs", "batch_size", "max_length", "bf16", "lora_r", "lora_alpha")
_GEN = ("candidates", "keep", "demos", "io_shots", "retries", "instruction_prompts",
        "rouge_threshold", "instruction_tokens", "response_tokens", "max_length", "bf16",
        "lora_r", "lora_alpha")
LABELS = {"fewfedpit": "FewFedPIT", "fedit": "FedIT (beta = 1)", "fedmit": "FedMIT"}


def participation(cfg) -> tuple:
    return cfg.fewfedpit.clients_per_round, None, "fewfedpit"


def model_name(cfg) -> str:
    return cfg.fewfedpit.model or cfg.downstream.model


def root(run) -> Path:
    return run.paths.root / "fewfedpit"


def global_dir(run, t: int) -> Path:
    return root(run) / f"r{t}" / "global"


def model_out(run) -> Path:
    return global_dir(run, run.cfg.rounds) / "model"


def slug(client: str) -> str:
    """A directory name for a client id (e-mail addresses, play/role): safe characters and a
    short hash, so distinct ids never collide."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(client))[:40]
    return f"{s}-{hashlib.sha256(str(client).encode()).hexdigest()[:8]}"


def train_clients(run) -> list[str] | None:
    """The private train split's client ids (sorted), None before the data is built."""
    f = Path(run.paths.private) / "train.jsonl"
    if not f.is_file():
        return None
    ids = set()
    with open(f, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                ids.add(str(json.loads(line)["client_id"]))
    return sorted(ids)


def sampled(seed: int, t: int, clients: list[str], k: int, rng=None) -> list[str]:
    """Round t's K clients, chosen without replacement: from ``rng`` when given (release mode:
    the OS CSPRNG), else seeded by (seed, t) -- research mode, where anyone holding the config
    can recompute the sample."""
    import numpy as np

    if rng is None:
        rng = np.random.default_rng([int(seed), int(t), 0x464650])
        idx = rng.choice(len(clients), size=min(k, len(clients)), replace=False)
    else:  # a SecureRandom draws a uniform permutation (a uniform K-subset: its first K)
        idx = np.asarray(rng.permutation(len(clients)))[:min(k, len(clients))]
    return [clients[int(i)] for i in sorted(idx)]


SAMPLES = "samples.json"


def round_samples(run, clients: list[str], k: int) -> dict[int, list[str]]:
    """Every round's K clients.  With the DP extension in release mode the sample must be
    secret for its amplification to hold (the ledger records subsampled_gaussian at q = K/N): a
    sample anyone can recompute from the config's seed is no sample (issue 23: the worst client
    of a seeded run had eps ~12.9 where the ledger said 2.56).  So release mode draws every
    round's sample from the OS CSPRNG once, keeps it in RUN/fewfedpit/samples.json (the
    server's own record: publishing it with the model voids the amplification) and reuses it
    on every rerun; research mode (no privacy claim) seeds it.  A dry run shows placeholders
    for a release-mode sample not drawn yet."""
    c, f = run.cfg, run.cfg.fewfedpit
    if not (run.release and f.noise_multiplier):
        return {t: sampled(c.seed, t, clients, k) for t in range(1, c.rounds + 1)}
    path = root(run) / SAMPLES
    if path.is_file():
        rec = read_json(path, expect=dict)
        got = {int(t): list(v) for t, v in (rec.get("rounds") or {}).items()}
        if rec.get("clients") == clients and rec.get("k") == k \
                and set(got) >= set(range(1, c.rounds + 1)):
            return got

        raise ConfigError("holds the secret client samples of another client set or "
                          "clients_per_round: use a new run_dir", path=str(path),
                          field="fewfedpit.clients_per_round")
    if run.dry_run:
        return {t: [f"SECRET{j + 1}" for j in range(min(k, len(clients)))]
                for t in range(1, c.rounds + 1)}

    rng = make_rng(None, secure=True, stream="sampling")
    out = {t: sampled(c.seed, t, clients, k, rng=rng) for t in range(1, c.rounds + 1)}
    write_json({"mode": "release", "note": "the secret client samples of this run's rounds "
                "(OS CSPRNG): never publish them", "clients": clients, "k": k,
                "rounds": {str(t): v for t, v in out.items()}}, path)
    return out


def _pick(fields, s: dict) -> dict:
    """The settings ``fields`` of :func:`spec_of`'s mapping ``s``."""
    return {k: s[k] for k in fields}


def spec_of(cfg) -> dict:
    f = cfg.fewfedpit
    return {k: getattr(f, k) for k in (*_TRAIN, *_GEN, "beta", "clip", "noise_multiplier")} | {
        "mode": cfg.method, "rounds": cfg.rounds}


def round_entries(cfg, t: int, q: float | None, *, release: bool) -> list:
    """Round t's ledger entry when the extension adds noise (declared, so the budget guard
    sees it) on K of N clients (q = K / N); none otherwise (the noise-free entry is eps = inf,
    and such a run has no budget).  The noise is the extension's explicit z on the round's
    relation and sensitivity (:meth:`popri.privacy.plan.Noise.of_round`, from the aggregate's
    spec: its clip), as ``popri fewfedpit aggregate`` records it."""
    f = cfg.fewfedpit
    if not f.noise_multiplier or q is None:
        return []
    n = Noise.of_round(float(f.noise_multiplier), sample_rate=float(q),
                       sampling="fixed", spec=FewFedPITSpec(clip=f.clip),
                       mode=mode_of(release))
    return [gaussian("fewfedpit", noise_multiplier=n.z, sample_rate=n.sample_rate,
                     delta=cfg.privacy.delta, sensitivity=n.sensitivity, sampling=n.sampling,
                     neighbouring=n.relation, mode=n.mode,
                     params={"round": t, "method": cfg.method, "clients": None})]


def recipe(run) -> Iterator[Stage]:
    c, f = run.cfg, run.cfg.fewfedpit
    s = spec_of(c)
    priv = str(run.paths.private)
    mode = c.method
    r0 = root(run) / "r0"
    yield Stage("ffp-init", FewfedpitInitCall(model=model_name(c), seed=c.seed, out=str(r0),
                                              **_pick(("lora_r", "lora_alpha"), s)),
                outputs=[str(r0)])
    clients = train_clients(run)
    n = len(clients) if clients else None
    # the aggregate's --clients-total N: K = L of N drawn (q = L / N in the ledger, L = N too),
    # replace one client; the mean divides by K (aggregation.public_count)
    prev = r0
    samples = round_samples(run, clients, f.clients_per_round) if clients else {}
    for t in range(1, c.rounds + 1):
        who = (samples[t] if clients
               else [f"CLIENT{k + 1}" for k in range(f.clients_per_round)])  # dry run, no data
        base = {"round_": t, "init": str(prev)}
        uploads = []
        for cid in who:
            d = root(run) / f"r{t}" / slug(cid)
            local, syn, pub, mixed = d / "local", d / "syn.jsonl", d / "public", d / "mixed"
            yield Stage(f"ffp-r{t}-{slug(cid)}-local", FewfedpitLocalCall(
                data=priv, client=cid, **base, out=str(local), **_pick(_TRAIN, s),
                rounds=c.rounds),
                outputs=[str(local)], inputs=[priv, str(prev)])
            if mode in ("fewfedpit", "fedmit"):
                yield Stage(f"ffp-r{t}-{slug(cid)}-selfgen", FewfedpitSelfgenCall(
                    data=priv, client=cid, **base, local=str(local), out=str(syn),
                    stats_out=str(d / "syn.json"), **_pick(_GEN, s)),
                    outputs=[str(syn), str(d / "syn.json")], inputs=[priv, str(prev), str(local)])
                yield Stage(f"ffp-r{t}-{slug(cid)}-train", FewfedpitTrainCall(
                    synthetic=str(syn), client=cid, **base, out=str(pub), mode=mode,
                    data=priv if mode == "fedmit" else None, **_pick(_TRAIN, s),
                    rounds=c.rounds),
                    outputs=[str(pub)], inputs=[str(syn), str(prev)])
            yield Stage(f"ffp-r{t}-{slug(cid)}-mix", FewfedpitMixCall(
                local=str(local), public=None if mode == "fedit" else str(pub), **base,
                out=str(mixed), mode=mode, beta=f.beta, clip=f.clip),
                outputs=[str(mixed)], inputs=[str(prev), str(local)]
                + ([str(pub)] if mode != "fedit" else []))
            uploads.append(str(mixed))
        out = global_dir(run, t)
        q = (len(who) / n) if n else None
        entries = round_entries(c, t, q, release=run.release)
        noisy = {"clip": f.clip, "noise_multiplier": f.noise_multiplier} \
            if f.noise_multiplier else {}
        yield Stage(f"ffp-r{t}-aggregate", FewfedpitAggregateCall(
            uploads=tuple(uploads), **base, out=str(out), mode=mode,
            clients_total=n or None, **noisy, delta=c.privacy.delta, release=run.release,
            **_pick(("lora_r", "lora_alpha"), s)),
            outputs=[str(out)], inputs=[*uploads, str(prev)],
            release=DPRelease(entries, out.parent / "ledger.jsonl",
                              lambda e, t=t: e.stage == "fewfedpit" and e.params.get("round") == t)
            if entries else None)
        prev = out


def data_stages(run) -> Iterator[Stage]:
    """The instruction data: ``popri instruct build`` of data.source (no Omega: FewFedPIT's
    synthetic data is the clients' own self-generation)."""
    c, d = run.cfg, run.cfg.data
    if not d.dir:
        yield Stage("instruct-private", InstructBuildCall(
            name=d.source, out=str(run.paths.private), **settings(InstructSpec, c.instruct),
            seed=c.seed),
            outputs=[str(run.paths.private)])


def evaluation(run) -> Iterator[Stage]:
    """eval instruct + audit extract of the method's model, eps = 0 (the base model) and
    eps = inf (centralised tuning on the pooled training examples), and the gap closed."""
    c, f = run.cfg, run.cfg.fewfedpit
    s = spec_of(c)
    priv = str(run.paths.private)
    E = run.paths.eval
    models = {c.method: (str(model_out(run)), [str(global_dir(run, c.rounds))])}
    if c.baselines:
        central = root(run) / "centralized"
        yield Stage("ffp-centralized", FewfedpitLocalCall(
            data=priv, all_clients=True, round_=1, init=str(root(run) / "r0"), out=str(central),
            save_model=True, **_pick(_TRAIN, {**s, "local_epochs": f.centralized_epochs}),
            rounds=1),
            outputs=[str(central)], inputs=[priv, str(root(run) / "r0")])
        models["eps0"] = (model_name(c), [])
        models["epsinf"] = (str(central / "model"), [str(central)])
    per = {}
    for name, (m, inputs) in models.items():
        per[name] = str(E / f"{name}.clients.jsonl")
        yield Stage(f"eval-{name}", EvalInstructCall(
            model=m, data=priv, split="test", max_samples=f.eval_max_samples or None,
            max_new_tokens=f.eval_max_new_tokens, max_length=f.max_length,
            bootstrap=c.downstream.bootstrap, seed=c.seed, bf16=f.bf16,
            per_client_out=per[name], json_out=True),
            outputs=[str(E / f"{name}.json"), per[name]], inputs=[*inputs, priv],
            stdout_to=str(E / f"{name}.json"))
        yield Stage(f"extract-{name}", AuditExtractCall(
            model=m, data=priv, split="train", num_examples=f.extract_examples,
            per_client=f.extract_examples, seed=c.seed, bf16=f.bf16, as_json=True),
            outputs=[str(E / f"{name}.extract.json")], inputs=[*inputs, priv],
            stdout_to=str(E / f"{name}.extract.json"))
    if c.baselines:
        yield Stage("gap-closed", EvalGapCall(
            method=per[c.method], eps0=per["eps0"], epsinf=per["epsinf"],
            allow_undefined=True, seed=c.seed, json_out=True),
            outputs=[str(E / "gap.json")], inputs=list(per.values()),
            stdout_to=str(E / "gap.json"))


def results(run, noise: Noise | None) -> dict:
    c, E = run.cfg, run.paths.eval
    methods, leakage = {}, {}
    for name in (c.method, "eps0", "epsinf"):
        if (E / f"{name}.json").exists():
            r = read_json(E / f"{name}.json")
            methods[name] = {k: r.get(k) for k in ("accuracy", "accuracy_se", "loss", "tokens",
                                                   "clients", "rouge_l", "rouge_l_se",
                                                   "examples")}
        if (E / f"{name}.extract.json").exists():
            x = read_json(E / f"{name}.extract.json")
            leakage[name] = {k: x.get(k) for k in ("rouge_l", "rouge_l_se", "extracted",
                                                   "exact_match", "examples")}
    rounds = []
    for t in range(1, c.rounds + 1):
        g = global_dir(run, t) / "round.json"
        if g.exists():
            r = read_json(g, expect=dict)
            row = {"round": r.get("round")}
            diag = r.get("private_diagnostics")  # research mode only (NOT PRIVATE)
            if isinstance(diag, dict):
                row["private_diagnostics"] = {k: diag.get(k) for k in ("private", "clients",
                                                                       "n_k")}
            rounds.append(row)
    return {"methods_instruct": methods, "leakage": leakage,
            "privacy_note": "no DP guarantee (eps = inf)" if not c.fewfedpit.noise_multiplier
            else "popri extension: client-level Gaussian noise on clipped uploads",
            "fewfedpit": {"mode": c.method, "beta": 1.0 if c.method != "fewfedpit" else
                          c.fewfedpit.beta, "clients_per_round": c.fewfedpit.clients_per_round,
                          "model": model_name(c), "rounds": rounds}}


def table(r: dict) -> str:
    """The results table of a FewFedPIT-family run."""
    def fmt(x, nd=4):
        return "-" if x is None else f"{x:.{nd}f}"

    m, lk = r.get("methods_instruct", {}), r.get("leakage", {})
    method = r["method"]
    ff = r.get("fewfedpit", {})
    lines = [f"{LABELS.get(method, method)} on {r['run_dir']}: T={r['rounds']} rounds, "
             f"{ff.get('clients_per_round')} clients/round, beta {ff.get('beta')}, model "
             f"{ff.get('model')}", "",
             "| method | epsilon | response-token accuracy | SE | Rouge-L | SE | extraction "
             "Rouge-L | SE |", "|---|---|---|---|---|---|---|---|"]
    labels = {method: LABELS.get(method, method), "eps0": "eps=0 (base model)",
              "epsinf": "eps=inf (centralised)"}
    for k, lab in labels.items():
        if k in m:
            a, x = m[k], lk.get(k, {})
            eps = ("inf" if r.get("epsilon") is None else fmt(r.get("epsilon"), 3)) \
                if k == method else ("0" if k == "eps0" else "inf")
            lines.append(f"| {lab} | {eps} | {fmt(a.get('accuracy'))} | "
                         f"{fmt(a.get('accuracy_se'))} | {fmt(a.get('rouge_l'))} | "
                         f"{fmt(a.get('rouge_l_se'))} | {fmt(x.get('rouge_l'))} | "
                         f"{fmt(x.get('rouge_l_se'))} |")
    if r.get("released") and not m:
        lines[1:] = ["", released_line(r["released"])]
    g = r.get("gap_closed")
    if g and g.get("gap_closed") is not None:
        lines += ["", f"gap closed on response-token accuracy: {fmt(g['gap_closed'], 3)} +- "
                      f"{fmt(g.get('gap_closed_se'), 3)} (paired bootstrap over test clients)"]
    lines.append(f"privacy: {r.get('privacy_note')}; the ledger total is "
                 f"{'inf' if r.get('epsilon') is None else r.get('epsilon')}")
    lines.append("utility: response-token accuracy and Rouge-L to the reference (no GPT-4 judge "
                 "offline); leakage: popri audit extract (discoverable memorisation, one "
                 "training example per client)")
    return "\n".join(lines)


def shape(r: dict) -> str:
    return table(r).splitlines()[0]


class FewFedPIT(Method):
    """FewFedPIT (arXiv:2403.06131, Algorithm 1) and its baselines FedIT and FedMIT: federated
    instruction tuning on instruction data, evaluated on instruction following; no DP guarantee
    (the popri extension adds clipped, noised uploads)."""
    dp = False
    releases = "model"
    #: cyan, navy, sand
    COLOURS = {"fewfedpit": "#17becf", "fedit": "#393b79", "fedmit": "#e7ba52"}
    FIGURE_LABELS = {"fewfedpit": "FewFedPIT", "fedit": "FedIT", "fedmit": "FedMIT"}
    SUMMARIES = {
        "fewfedpit": "FewFedPIT (arXiv:2403.06131): T rounds of private training, "
                     "self-generation + IFS, synthetic training, beta mixing; no DP",
        "fedit": "FedIT: FedAvg of LoRA instruction tuning (FewFedPIT at beta = 1); no DP",
        "fedmit": "FedMIT (FewFedPIT 4.3): self-generated and private data mixed in one model; "
                  "no DP"}

    def __init__(self, mode: str):
        self.name, self.label, self.summary = mode, LABELS[mode], self.SUMMARIES[mode]
        self.colour, self.figure_label = self.COLOURS[mode], self.FIGURE_LABELS[mode]

    def recipe(self, run) -> Iterator[Stage]:
        return recipe(run)

    def data(self, run) -> Iterator[Stage]:
        return data_stages(run)

    def embeddings(self, run):
        return ()

    def participation(self, cfg) -> tuple:
        return participation(cfg)

    def round_entries(self, cfg, t: int, noise: Noise, clients: int | None) -> list:
        return round_entries(cfg, t, noise.sample_rate, release=noise.mode == "release")

    def model_out(self, run) -> Path:
        return model_out(run)

    def evaluation(self, run) -> Iterator[Stage]:
        return evaluation(run)

    def results(self, run, noise: Noise | None) -> dict:
        return results(run, noise)

    def table(self, r: dict) -> str:
        return table(r)

    def shape(self, r: dict) -> str:
        return shape(r)
