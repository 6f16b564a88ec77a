"""The PCA figure of a run: the synthetic set's and the private validation split's sentence
embeddings, read from disk (no model is loaded).

    python -m pytest -q tests/test_report.py
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from popri.core.io import read_json_lenient as _read_json
from popri.core.io import read_jsonl_lenient as _read_jsonl
from popri.report import style
from popri.core import runtime
from popri.models.embed import cache_key
from popri.models.embed import embed_spec
from popri.report.figures import new_fig
from popri.report.runs import Run

# ------------------------------------------------------------------ embeddings (PCA)


def _load_set(p: Path) -> tuple[np.ndarray, dict] | None:
    if not p.is_file():
        return None
    try:
        e = np.load(p, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if not (isinstance(e, np.ndarray) and e.ndim == 2 and e.shape[0] >= 1
            and np.issubdtype(e.dtype, np.floating)):
        return None
    meta = _read_json(p.with_name(p.stem + ".meta.json"))
    return np.asarray(e, dtype=np.float64), meta if isinstance(meta, dict) else {}


def _cached_embedding(texts_file: Path, meta: dict) -> np.ndarray | None:
    """The embedding of ``texts_file`` that a stage left in popri's embedding cache (same
    model, normalisation and max length as the validation set), if any: never computed."""
    rows = _read_jsonl(texts_file)
    texts = [r.get("text") for r in rows]
    if not texts or not all(isinstance(t, str) for t in texts):
        return None
    try:
        specs = [embed_spec(meta.get("model"), normalize=meta.get("normalize"),
                            max_length=meta.get("max_length")), embed_spec(meta.get("model"))]
        for spec in specs:
            f = runtime.cache_dir() / "embeddings" / f"{cache_key(spec, texts)}.npy"
            if f.is_file():
                e = np.load(f, allow_pickle=False)
                if e.ndim == 2 and len(e) == len(texts):
                    return np.asarray(e, dtype=np.float64)
    except Exception:  # noqa: BLE001 -- only a lookup
        return None
    return None


def _synthetic_embeddings(run: Run, meta: dict) -> tuple[np.ndarray, str, str] | None:
    """(embeddings, what they are, a short legend label), or None."""
    P = run.path
    for name in ("embeddings/synthetic.npy", "synthetic.npy", "embeddings/syn.npy"):
        s = _load_set(P / name)
        if s is not None:
            return s[0], f"the synthetic set ({name})", "synthetic"
    if (P / "synthetic.jsonl").is_file():
        e = _cached_embedding(P / "synthetic.jsonl", meta)
        if e is not None:
            return e, "the synthetic set (synthetic.jsonl, embedding from the cache)", "synthetic"
    probes = sorted(((int(m.group(1)), f) for f in ((P / "probe").iterdir()
                     if (P / "probe").is_dir() else [])
                     if (m := re.fullmatch(r"round(\d+)\.jsonl", f.name))), reverse=True)
    for t, f in probes:
        s = _load_set(f.with_suffix(".npy"))
        e = s[0] if s is not None else _cached_embedding(f, meta)
        if e is not None:
            return e, f"the round-{t} probe sample (probe/round{t}.jsonl)", f"probe round {t}"
    return None


def fig_pca(run: Run):
    if run.release:  # the private validation split: a private diagnostic
        return None
    val = _load_set(run.path / "embeddings" / "val.npy")
    if val is None:
        return None
    V, meta = val
    got = _synthetic_embeddings(run, meta)
    if got is None:
        return None
    S, what, short = got
    if S.shape[1] != V.shape[1]:
        return f"dimensions differ ({S.shape[1]} vs {V.shape[1]})"
    if len(V) + len(S) < 3:
        return None
    rng = np.random.default_rng(0)
    cap = 3000
    V = V[rng.choice(len(V), cap, replace=False)] if len(V) > cap else V
    S = S[rng.choice(len(S), cap, replace=False)] if len(S) > cap else S
    X = np.concatenate([V, S])
    mu = X.mean(axis=0)
    _, sv, vt = np.linalg.svd(X - mu, full_matrices=False)
    var = sv ** 2 / max(float((sv ** 2).sum()), 1e-300)
    W = vt[:2].T if vt.shape[0] >= 2 else np.pad(vt.T, ((0, 0), (0, 2 - vt.shape[0])))
    pv, ps = (V - mu) @ W, (S - mu) @ W
    fig, axes = new_fig(1, width=7.5, height=6.0)
    ax = axes[0]
    cv, cs = style.colour("epsinf"), style.colour(run.method)  # the private data; the method
    ax.scatter(pv[:, 0], pv[:, 1], s=12, alpha=0.4, color=cv,
               label=f"private validation split (n = {len(V)})")
    ax.scatter(ps[:, 0], ps[:, 1], s=14, alpha=0.55, color=cs, marker="^",
               label=f"{short} (n = {len(S)})")
    for P_, col, lab in ((pv, cv, "private validation split: mean"), (ps, cs, f"{short}: mean")):
        ax.scatter(*P_.mean(axis=0), s=180, color=col, edgecolor="white", marker="X", zorder=5,
                   label=lab)
    ax.set_xlabel(f"PC1 ({100 * var[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC2 ({100 * (var[1] if len(var) > 1 else 0):.1f}% of variance)")
    # wrapped: the synthetic set's description is long and the axes are square
    ax.set_title(f"{run.label}: PCA of sentence embeddings (a private diagnostic)\n{what}\n"
                 "vs the private validation split", fontsize=10)
    ax.legend(loc="best")
    ax.set_aspect("equal", adjustable="datalim")
    return fig
