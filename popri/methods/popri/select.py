"""Checkpoint selection by FID ("Private Federated Learning using Preference-Optimized Synthetic
Data", POPri, arXiv:2504.16438, appendix B.1): per round keep the DPO checkpoint whose generated
samples have the lowest Frechet distance to the validation split.

    popri dpo --pairs runs/r1/pairs.jsonl --adapter runs/r0/dpo/adapter --out runs/r1/dpo \\
        --select-on data/sotu --select-prompts runs/r1/samples.jsonl
    popri dpo --pairs p.jsonl --out o --select-on sel/val_stats.npz --select-prompts s.jsonl

Two steps: :func:`prepare_selection` checks the inputs and fixes the target and the prompts
before any training (a bad ``--select-on`` fails in seconds, not after the epochs); the
:class:`Selection` it returns is called with the checkpoints afterwards (``popri.methods.popri
.dpo.train_dpo(..., select=...)``), generates ``select_samples`` samples from each, embeds them
and keeps the best (:func:`select_checkpoint`), copying its adapter to ``OUT/adapter`` and
writing ``OUT/selection.json``.

The target is the validation embeddings (a federated dataset's 'val' split, an embedding set
.npy or JSONL texts; POPri reads them without noise) or the DP mean and covariance of ``popri
fred stats`` (a STATS.npz), so that selection reads no private sample beyond that release.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from popri.core import log
from popri.core.errors import InputError, PopriError
from popri.core.io import read_jsonl, write_json
from popri.data.records import is_federated_dir
from popri.eval import probe
from popri.methods.fred.stats import load_stats
from popri.models import embed, generation, lora
from popri.models.embed import as_embedding_set, default_model, resolve_model
from popri.models.fid import frechet_distance, gaussian_stats
from popri.models.generation import build_prompts
from popri.models.lora import ADAPTER_DIR
from popri.specs.training import SelectSpec

SELECTION_FILE = "selection.json"


def select_checkpoint(checkpoints: list[str], *, base_model: str,
                      val_embeddings: np.ndarray | None = None,
                      generate_fn: Callable[[str], list[str]],
                      embed_fn: Callable[[list[str]], np.ndarray],
                      val_stats: tuple[np.ndarray, np.ndarray] | None = None,
                      select_by: str = "fid") -> tuple[str, list[dict]]:
    """The checkpoint whose generated samples are closest to the validation split: by
    ``select_by`` fid (POPri B.1: the Frechet distance of sentence embeddings, lowest wins),
    mean-cosine (the cosine between the mean embeddings, highest wins) or mmd (unbiased MMD^2,
    RBF at the median bandwidth, lowest wins; :mod:`popri.eval.probe`).  Returns (best
    checkpoint, one result per checkpoint ``{"checkpoint", "base_model", select_by,
    "samples"}``); ties go to the earlier one.

    The target is the validation embeddings (``val_embeddings``; POPri reads them without noise)
    or their (mean, covariance) given directly as ``val_stats``, e.g. the DP statistics of
    ``popri fred stats`` (then selection costs no privacy beyond that release; mmd needs
    samples and is refused there)."""
    if not checkpoints:
        raise PopriError("no checkpoints to select from")
    if (val_embeddings is None) == (val_stats is None):
        raise PopriError("select_checkpoint needs val_embeddings or val_stats (one of them)")
    if select_by not in ("fid", "mean-cosine", "mmd"):
        raise PopriError(f"unknown select_by {select_by!r}")
    if val_stats is not None:
        if select_by == "mmd":
            raise InputError("mmd needs validation samples; DP statistics hold a mean and a "
                             "covariance only: select by mean-cosine or fid",
                             field="--select-by")
        if select_by == "fid" and val_stats[1] is None:
            raise InputError("fid needs a covariance; the statistics hold the mean only: "
                             "select by mean-cosine", field="--select-by")
        mu_v = np.asarray(val_stats[0], dtype=np.float64)
        c_v = None if val_stats[1] is None else np.asarray(val_stats[1], dtype=np.float64)
        val = None
    else:
        val = np.asarray(val_embeddings, dtype=np.float64)
        mu_v, c_v = gaussian_stats(val)
    dim = mu_v.shape[0]
    bandwidth = None
    results = []
    for ck in checkpoints:
        texts = list(generate_fn(ck))
        if len(texts) < 2:
            raise PopriError(f"checkpoint {ck}: need at least 2 generated samples, got "
                             f"{len(texts)}")
        emb = np.asarray(embed_fn(texts), dtype=np.float64)
        if emb.ndim != 2 or emb.shape[1] != dim:
            raise PopriError(f"checkpoint {ck}: embeddings of shape {emb.shape} do not match the "
                             f"validation set's dimension {dim}")
        if select_by == "fid":
            d = frechet_distance(*gaussian_stats(emb), mu_v, c_v)
        elif select_by == "mean-cosine":
            a = probe.unit_rows(emb).mean(0)
            d = float(a @ mu_v / max(np.linalg.norm(a) * np.linalg.norm(mu_v), 1e-12))
        else:
            x, y = probe.unit_rows(emb), probe.unit_rows(val)
            if bandwidth is None:  # one kernel for every checkpoint: comparable values
                bandwidth = probe.median_bandwidth(x, y)
            d = probe.mmd2_unbiased(x, y, bandwidth)
        results.append({"checkpoint": str(ck), "base_model": base_model, select_by: float(d),
                        "samples": len(texts)})
        log.info(f"select: {ck}: {select_by} {d:.5g} ({len(texts)} samples)")
    key = (lambda i: (-results[i][select_by], i)) if select_by == "mean-cosine" else \
        (lambda i: (results[i][select_by], i))
    best = min(range(len(results)), key=key)
    return results[best]["checkpoint"], results


def selection_prompts(path: str, n: int, seed: int = 0) -> list[dict]:
    """The prompts of the selection samples: JSONL with "prompt" (deduplicated by prompt_id, else
    text), or Omega texts with "text", from which prompts are built as 'popri gen' does."""
    recs = read_jsonl(path)
    if not recs:
        raise InputError("no prompts", path=path)
    if all(isinstance(r.get("prompt"), str) for r in recs):
        seen, prompts = set(), []
        for r in recs:
            key = r.get("prompt_id", r["prompt"])
            if key not in seen:
                seen.add(key)
                prompts.append({"prompt_id": len(prompts), "prompt": r["prompt"]})
        return prompts
    if all(isinstance(r.get("text"), str) for r in recs):
        return build_prompts([r["text"] for r in recs], min(n, len(recs)), seed=seed)
    bad = next(i for i, r in enumerate(recs, 1)
               if not isinstance(r.get("prompt", r.get("text")), str))
    raise InputError("need 'prompt' (prompts) or 'text' (Omega texts) in every line",
                     path=path, line=bad, field="prompt")


def selection_target(select_on: str, embed_model: str | None) -> tuple[dict, str]:
    """(``select_checkpoint`` target keyword, criterion sentence) for ``--select-on``: a FreD
    STATS.npz (its mean and covariance; its embedder must be the selection's), else validation
    embeddings (a dataset dir's 'val' split, an embedding set, JSONL texts)."""
    if str(select_on).endswith(".npz"):  # FreD statistics: a mean + covariance, no samples

        mean, cov, side = load_stats(select_on)
        smodel = side.get("embedding_model")
        if smodel and resolve_model(smodel) != resolve_model(embed_model or default_model()):
            raise InputError(f"the statistics were computed on {smodel!r} embeddings but the "
                             f"selection samples would be embedded with "
                             f"{embed_model or default_model()!r}: pass --embed-model {smodel}",
                             path=select_on, field="embedding_model")
        what = "mean and covariance" if cov is not None else "mean"
        criterion = (f"lowest Frechet distance to the DP {what} of the validation "
                     "split ('popri fred stats')" if side.get("private") else
                     "lowest Frechet distance to the EXACT (non-private) statistics in "
                     f"{select_on}")
        return {"val_stats": (mean, cov)}, criterion
    split = "val" if Path(select_on).is_dir() and is_federated_dir(select_on) else "train"
    val = as_embedding_set(select_on, model=embed_model, split=split, what="validation")
    if len(val) < 2:
        raise InputError("need at least 2 validation samples for a Frechet distance",
                         path=select_on)
    return {"val_embeddings": val.embeddings}, "lowest FID to the validation split (POPri B.1)"


@dataclass
class Selection:
    """A prepared checkpoint selection: call it with the checkpoints and the run directory; it
    returns the path of the selected adapter (OUT/adapter) and writes OUT/selection.json."""

    select_on: str
    select_prompts: str
    samples: int
    model: str
    prompts: list[dict]
    target: dict = field(repr=False)
    criterion: str
    seed: int = 0
    bf16: bool = True
    embed_model: str | None = None
    select_by: str = "fid"

    def __call__(self, checkpoints: list[str], out_dir) -> str:
        per_prompt = -(-self.samples // len(self.prompts))

        def gen(ck: str) -> list[str]:
            recs, _ = generation.generate(self.prompts, model=self.model, adapter=ck,
                                          samples_per_prompt=per_prompt, num_samples=self.samples,
                                          seed=self.seed, bf16=self.bf16)
            return [r["text"] for r in recs]

        def emb(texts: list[str]):
            return embed.embed_texts(texts, self.embed_model, desc="embed selection")

        best, results = select_checkpoint(checkpoints, base_model=self.model, generate_fn=gen,
                                          embed_fn=emb, select_by=self.select_by, **self.target)
        out_dir = Path(out_dir)
        path = _copy_adapter(best, out_dir / ADAPTER_DIR)
        write_json({"selected": best, "criterion": self.criterion,
                    "validation": self.select_on, "prompts": self.select_prompts,
                    "samples": self.samples, "results": results}, out_dir / SELECTION_FILE)
        log.info(f"dpo: selected {best} (by {self.select_by})")
        return path


def _copy_adapter(checkpoint: str, dest: Path) -> str:
    return lora.save_adapter(None, dest, source=checkpoint)


def prepare_selection(select_on: str, select_prompts: str, spec=None, *, model: str,
                      seed: int = 0, bf16: bool = True,
                      embed_model: str | None = None) -> Selection:
    """Check the selection inputs and fix prompts and target up front (before training);
    ``spec``: a :class:`~popri.specs.training.SelectSpec` (samples per checkpoint)."""
    spec = spec or SelectSpec()
    prompts = selection_prompts(select_prompts, spec.select_samples, seed)
    target, criterion = selection_target(select_on, embed_model)
    if spec.select_by == "mmd" and "val_stats" in target:
        raise InputError("--select-by mmd needs validation samples; DP statistics hold a mean "
                         "and a covariance only: use mean-cosine or fid", path=select_on,
                         field="--select-by")
    if spec.select_by == "fid" and "val_stats" in target and target["val_stats"][1] is None:
        raise InputError("--select-by fid needs a covariance; these statistics hold the mean "
                         "only ('popri fred stats --statistics mean'): use mean-cosine",
                         path=select_on, field="--select-by")
    if spec.select_by != "fid":
        criterion = criterion.replace("lowest FID", f"{spec.select_by}").replace(
            "lowest Frechet distance", spec.select_by)
    return Selection(select_on=str(select_on), select_prompts=str(select_prompts),
                     samples=spec.select_samples, model=model, prompts=prompts, target=target,
                     criterion=criterion, seed=seed, bf16=bf16, embed_model=embed_model,
                     select_by=spec.select_by)
