"""``popri audit canaries``: an end-to-end privacy audit of one ``popri run`` with canary clients
and the one-run bound (Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run",
NeurIPS 2023, arXiv:2305.08846, Theorem 3).

    popri audit canaries examples/dpfl.yaml --run-dir runs/canary-dpfl --canaries 200
    popri audit canaries examples/default.yaml --run-dir runs/canary --set privacy.epsilon=inf

1. The private data the config names (``data.dir``, or ``bench fetch`` of ``data.source`` as
   the run would) is copied to ``DIR/data`` with m canary clients added to its train split: each
   canary one client holding ``copies`` copies of its own secret text, included by a seeded,
   recorded draw with probability 1/2 (``DIR/canaries.jsonl``: id, text, included;
   :func:`popri.apps.audit.canaries.make_canaries`).  Under add/remove one client each canary
   is one unit of privacy, so the run's ledger epsilon is the claim the audit tests.
2. ``popri run CONFIG --set data.dir=DIR/data --set run_dir=DIR/run`` (every setting, cache and
   resume of a run; ``--set`` passes on).
3. Membership scores of every canary from what the run releases only (the synthetic set, the
   tuned generator's adapter, DP-FL's global model; :mod:`popri.apps.audit.canaries`), never its
   private scores.
4. For each score and each guess count k (top k "in", bottom k "out") the one-run bound at the
   run's delta (:func:`popri.privacy.onerun.audit`), Bonferroni over all of them, so the bound
   printed holds at ``--significance`` for the whole search.  Exit 1 when it exceeds the
   ledger's epsilon (the claim is refuted); ``DIR/audit.json`` holds every number.

A lower bound, never a proof: a weak attack on a leaky run finds little.  ``--break no-noise``
runs the same config at z = 1e-6 (no budget: noise in effect none) and holds it to the epsilon the config
asks for (the test that the audit has teeth).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from popri.apps.audit import canaries as C
from popri.core import io, log, outdir, provenance
from popri.core.errors import InputError
from popri.data.records import text_records
from popri.methods import steps
from popri.pipeline import config as config_mod
from popri.privacy import onerun
from popri.privacy.ledger import total
from popri.specs.commands.bench import BenchFetchCall
from popri.specs.privacy import CanarySpec

#: the methods a canary audit runs, and the scores each one's releases allow
SCORES_OF = {"popri": ("generator", "generator-raw", "embed", "lcs"),
             "pe-sft": ("generator", "generator-raw", "embed", "lcs"),
             "pe": ("embed", "lcs"), "dp-fedavg": ("model", "model-raw", "model-rows"),
             "dp-ftrl": ("model", "model-raw", "model-rows")}
BREAKS = ("no-noise",)
#: --break no-noise: the noise multiplier of the run (1e-6 of the sensitivity: none, in effect)
NO_NOISE_Z = 1e-6


def _popri(argv: list[str], *, stdout=None) -> subprocess.CompletedProcess:
    """A popri command in a child process, its stderr passed through (the run's progress)."""
    return subprocess.run([sys.executable, "-m", "popri.cli.app", *argv], stdout=stdout,
                          text=True)


def _fetch(call: BenchFetchCall, what: str) -> None:
    if (Path(call.out) / "manifest.json").exists():
        log.info(f"audit canaries: {what} already fetched: {call.out}")
        return
    p = _popri(call.argv())
    if p.returncode:
        raise InputError(f"fetching the {what} data failed (exit {p.returncode})", path=call.out)


def base_data(cfg, root: Path) -> tuple[Path, list[str]]:
    """(the private dataset as the run would read it, the public texts for the vocabulary):
    the run's own fetches (:func:`popri.methods.steps.private_fetch`, ``public_fetch``)."""
    d = cfg.data
    if d.dir:
        priv = Path(d.dir)
    else:
        priv = root / "base"
        _fetch(steps.private_fetch(cfg, str(priv)), "private")
    if steps.is_file_source(d.public_source):
        recs, _ = text_records(d.public_source)
    else:
        pub = root / "public"
        _fetch(steps.public_fetch(cfg, str(pub)), "public")
        recs, _ = text_records(str(pub))
    return priv, [r["text"] for r in recs]


def _canaries(root: Path, spec: CanarySpec, seed: int, public_texts: list[str]) -> list[dict]:
    """The canaries, drawn once: a rerun of the same settings reads them back; other settings
    on the same directory are refused (the draw is the audit's secret, never redrawn)."""
    want = C.make_canaries(spec.canaries, vocab=C.vocabulary(public_texts),
                           public_texts=public_texts, seed=seed, style=spec.style,
                           words=spec.words)
    path = root / "canaries.jsonl"
    if path.exists():
        have = io.read_jsonl(path)
        if have != want:
            raise InputError("holds other canaries (another --seed, --canaries, --style or "
                             "--words, or other public data): audit in a new --run-dir", path=str(path))
        return have
    io.write_jsonl(want, path)
    return want


def audited_data(priv: Path, out: Path, canaries: list[dict], copies: int) -> None:
    """``priv`` with the included canaries' clients added to its train split, in ``out``
    (marked private: it is the clients' data); the manifest says how many and how."""
    man = io.read_json(priv / "manifest.json", expect=dict)
    rows = [r for c in canaries if c["included"] for r in
            ({"id": f"{c['id']}#{j}", "client_id": c["client_id"], "text": c["text"]}
             for j in range(copies))]
    outdir.check(out, inputs=[priv])  # a directory popri did not write is never replaced
    tmp = outdir.staging_dir(out)
    for split in ("train", "val", "test"):
        src = priv / f"{split}.jsonl"
        if src.exists():
            shutil.copyfile(src, tmp / src.name)
    with open(tmp / "train.jsonl", "a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(io.dumps(r) + "\n")
    n_in = sum(c["included"] for c in canaries)
    counts = dict(man.get("counts") or {})
    tr = dict(counts.get("train") or {})
    tr["clients"] = int(tr.get("clients", 0)) + n_in
    tr["samples"] = int(tr.get("samples", 0)) + len(rows)
    counts["train"] = tr
    files = {f.name: {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                      "bytes": f.stat().st_size} for f in sorted(tmp.glob("*.jsonl"))}
    man.update(counts=counts, files=files, canaries={
        "m": len(canaries), "included": n_in, "copies": copies,
        "note": "canary clients of 'popri audit canaries' added to the train split"})
    io.write_json(man, tmp / "manifest.json")
    outdir.replace(tmp, out, kind="canary-data")
    provenance.finish({str(out): provenance.private(f"{priv} with canary clients")}, None,
                      ok=True)


def released(cfg, run: Path) -> dict:
    """The artifacts a run releases that the scores read: its synthetic set, the tuned
    generator's adapter, DP-FL's global model (what exists of them)."""
    T = cfg.rounds
    out: dict = {}
    if (run / "synthetic.jsonl").exists():
        out["synthetic"] = [r["text"] for r in io.read_jsonl(run / "synthetic.jsonl")]
    for sub in ("dpo", "sft"):
        if (run / f"round{T}" / sub / "adapter").is_dir():
            out["adapter"] = str(run / f"round{T}" / sub / "adapter")
    if (run / "fl" / f"round{T}" / "model").is_dir():
        out["model"] = str(run / "fl" / f"round{T}" / "model")
    return out


def _fl_reference(cfg) -> str:
    """The initial weights of a DP-FL run's global model."""
    return getattr(cfg.fl, "model", None) or cfg.downstream.model


def scores(cfg, art: dict, texts: list[str], which: tuple[str, ...]) -> dict[str, list[float]]:
    """The membership scores ``which`` of the canaries ``texts`` that the released artifacts
    ``art`` allow (each model read once for a score and its -raw twin)."""
    out: dict = {}
    gains: dict[str, dict] = {}
    for s in which:
        kind, raw = s.removesuffix("-raw"), s.endswith("-raw")
        if s in ("embed", "lcs") and "synthetic" not in art:
            continue
        if s == "embed":
            out[s] = C.embed_scores(texts, art["synthetic"], cfg.embedder)
        elif s == "lcs":
            out[s] = C.lcs_scores(texts, art["synthetic"])
        elif kind == "generator" and "adapter" in art:
            if kind not in gains:
                gains[kind] = C.likelihood_gains(texts, model=cfg.generator.model,
                                                 adapter=art["adapter"],
                                                 reference=cfg.generator.model)
            out[s] = gains[kind]["raw" if raw else "calibrated"]
        elif s == "model-rows" and "model" in art:
            if not C.is_adapter(art["model"]):  # a full model only: LoRA moves no embedding row
                out[s] = C.row_shifts(texts, art["model"], reference=_fl_reference(cfg))
        elif kind == "model" and "model" in art:
            if kind not in gains:
                gains[kind] = C.model_gains(
                    texts, art["model"],
                    reference=_fl_reference(cfg))
            out[s] = gains[kind]["raw" if raw else "calibrated"]
    if not out:
        raise InputError(f"the run released nothing the scores {', '.join(which)} read",
                         field="scores")
    return {k: [float(x) for x in v] for k, v in out.items()}


def ledger_claim(run: Path, delta: float, accountant: str) -> dict:
    """The run's total epsilon and its relation, as ``popri account ledger RUN`` totals them
    (:func:`popri.privacy.ledger.total`)."""
    return total([run], delta=delta, accountant=accountant).to_dict()


def audit(config: str | None, run_dir: str, overrides: list[str], spec: CanarySpec, *,
          seed: int) -> dict:
    """The audit: data, canaries, the run, the scores, the bound (module docstring)."""
    root = Path(run_dir)
    ov = [*overrides, f"run_dir={root / 'run'}"]
    # --break no-noise: the least noise a run takes (its config never switches noise off: z > 0)
    z_ov = [f"privacy.noise_multiplier={NO_NOISE_Z!r}"] if spec.brk == "no-noise" else []
    # the claim a --break is held to: the config's epsilon (None: inf), read with the break's z,
    # so that a config of privacy.epsilon: null alone is a valid one to break
    asked = config_mod.load(config, ov + z_ov).privacy.epsilon
    if z_ov:
        ov += ["privacy.epsilon=null", *z_ov]  # no budget
    cfg = config_mod.load(config, ov)
    if cfg.method not in SCORES_OF:
        raise InputError(f"method {cfg.method!r} has no DP claim a canary audit could test "
                         f"(one of {', '.join(SCORES_OF)})", field="method")
    which = tuple(spec.scores) if spec.scores else SCORES_OF[cfg.method]
    root.mkdir(parents=True, exist_ok=True)
    priv, public_texts = base_data(cfg, root)
    can = _canaries(root, spec, seed, public_texts)
    audited_data(priv, root / "data", can, spec.copies)
    log.info(f"audit canaries: {len(can)} canaries, {sum(c['included'] for c in can)} included "
             f"({spec.copies} copies each) -> {root / 'data'}")
    p = _popri(["run", *([config] if config else []), *[f"--set={o}" for o in ov],
                f"--set=data.dir={root / 'data'}"], stdout=sys.stderr)
    if p.returncode:
        raise InputError(f"the audited run failed (exit {p.returncode})", path=str(root / "run"))
    art = released(cfg, root / "run")
    texts = [c["text"] for c in can]
    inc = [c["included"] for c in can]
    sc = scores(cfg, art, texts, which)
    delta = cfg.privacy.delta
    per = {k: onerun.audit(v, inc, delta=delta, significance=spec.significance / len(sc))
           for k, v in sc.items()}
    best_score = max(per, key=lambda k: per[k]["eps_lower"])
    best = per[best_score]
    led = ledger_claim(root / "run", delta, cfg.privacy.accountant)
    # None is an infinite epsilon, in the ledger's total as in a config's privacy.epsilon: null
    # (and in audit.json: JSON has no inf)
    claimed = asked if spec.brk else led.get("epsilon")
    result = {
        "method": cfg.method, "break": spec.brk, "eps_claimed": claimed,
        "eps_ledger": led.get("epsilon"), "neighbouring": led.get("neighbouring"), "delta": delta,
        "eps_lower": best["eps_lower"], "score": best_score, "m": len(can),
        "included": sum(inc), "copies": spec.copies, "style": spec.style,
        "k": best["k_plus"], "r": best["r"], "correct": best["correct"],
        "significance": spec.significance, "scores": per,
        "refuted": claimed is not None and best["eps_lower"] > float(claimed)}
    io.write_json(result, root / "audit.json")
    io.write_jsonl([{"id": c["id"], "included": c["included"],
                     **{k: sc[k][i] for k in sc}} for i, c in enumerate(can)],
                   root / "membership_scores.jsonl")
    return result
