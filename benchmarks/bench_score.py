"""Benchmark popri's cosine scoring (POPri Algorithm 2) against two baselines, in one process.

    python benchmarks/bench_score.py           # 1,500 clients x 20 samples, 18,000 x 384-d synthetic
    python benchmarks/bench_score.py --full     # + popri alone at 72,000 and 133,000 clients
    python benchmarks/bench_score.py --full --scales 72000

Default run, same random normalised embeddings for all three:
  (a) reference loop: per client, every pairwise cosine (sentence_transformers.util.cos_sim of the
      synthetic set with the client's embeddings), summed, z-scored, clipped: how the POPri
      reference code scores;
  (b) a plain numpy product of the round's shape, [L, d] @ [d, n_syn] (float32 BLAS);
  (c) popri: feedback.cosine.cosine_round from private rows to the noisy sum (client means, covariance
      standardise/clip coefficients, one [n_syn, d] @ [d] product); the same from the client means
      (the numpy baseline's input); and the round with every client's row materialised (what
      --per-client-out writes).
--full runs (c) alone at the bioRxiv / Congress scales of POPri (72k and 133k clients, 18,000
synthetic samples, 8 private samples per client) on a memory-mapped .npy, each scale in a fresh
subprocess, reporting wall time and peak RSS (VmHWM; resource.getrusage for the CLI), then the
whole `popri score` command on the same data (every client, as POPri D.1's full-participation
rows; sidecar parsing, hashing, outputs, ledger).  Results: a table on stdout and
benchmarks/results/score.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from popri.federated.participation import sample_clients  # noqa: E402
from popri.feedback.cosine import cosine_coefficients, cosine_round, normalize_rows  # noqa: E402
from popri.privacy.noise import make_rng  # noqa: E402

D, N_SYN = 384, 18_000
RESULTS = Path(__file__).resolve().parent / "results" / "score.json"


def unit(rng, shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM (ru_maxrss would include the parent's peak at exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, repeat=1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def reference_loop(syn, emb, starts):
    """POPri's reference client scoring: pairwise cos_sim per client, sum, z-score, clip to 1."""
    import torch
    from sentence_transformers import util

    if os.environ.get("POPRI_THREADS"):
        torch.set_num_threads(int(os.environ["POPRI_THREADS"]))

    syn_t = torch.from_numpy(syn)
    total = np.zeros(len(syn))
    for s, e in zip(starts[:-1], starts[1:]):
        sims = util.cos_sim(syn_t, torch.from_numpy(emb[s:e])).numpy().sum(axis=1)
        z = (sims - sims.mean()) / sims.std()
        total += z / max(1.0, np.linalg.norm(z))
    return total


def popri_round(emb, codes, n_clients, syn, rows=False):
    sample = sample_clients(n_clients, make_rng(0, stream="sampling"))
    out = np.empty((n_clients, len(syn)), np.float32) if rows else None
    return cosine_round(emb, codes, sample, syn, noise_multiplier=0.0, clip=1.0,
                                standardize=True, noise_rng=make_rng(0, stream="noise"),
                                rows_out=out)


def from_means(means, syn):
    """popri's step after the client means: the same [L, d] input as the numpy baseline."""
    Y = normalize_rows(syn)
    a, b = cosine_coefficients(means.astype(np.float64), Y, 1.0, True)
    return Y @ (a @ means) - b.sum()


def default_run(clients: int, per_client: int) -> dict:
    rng = np.random.default_rng(0)
    syn = unit(rng, (N_SYN, D))
    emb = unit(rng, (clients * per_client, D))
    codes = np.repeat(np.arange(clients), per_client)
    starts = np.arange(0, clients * per_client + 1, per_client)
    means = unit(rng, (clients, D))
    t_popri, ours = timed(lambda: popri_round(emb, codes, clients, syn), repeat=5)
    t_rows, ours_rows = timed(lambda: popri_round(emb, codes, clients, syn, rows=True))
    t_matmul, _ = timed(lambda: means @ syn.T, repeat=5)
    t_means, _ = timed(lambda: from_means(means, syn), repeat=5)
    t_ref, ref = timed(lambda: reference_loop(syn, emb, starts))
    err = float(np.abs(ours - ref).max())
    return {"clients": clients, "samples_per_client": per_client, "n_syn": N_SYN, "dim": D,
            "seconds": {"popri": t_popri, "popri_per_client_rows": t_rows,
                        "popri_from_client_means": t_means,
                        "numpy_matmul": t_matmul, "reference_loop": t_ref},
            "ratio_reference_over_popri": t_ref / t_popri,
            "ratio_matmul_over_popri": t_matmul / t_popri,
            "ratio_matmul_over_popri_from_means": t_matmul / t_means,
            "ratio_reference_over_popri_rows": t_ref / t_rows,
            "max_abs_diff_vs_reference": err,
            "max_abs_diff_rows_vs_fast": float(np.abs(ours_rows - ours).max())}


def make_full_data(dirpath: Path, clients: int, per_client: int) -> tuple[str, str, str]:
    """A private set written block by block to .npy (never whole in memory) + codes + synthetic."""
    rng = np.random.default_rng(clients)
    n = clients * per_client
    emb_p, codes_p, syn_p = (str(dirpath / f"{x}-{clients}.npy") for x in ("priv", "codes", "syn"))
    mm = np.lib.format.open_memmap(emb_p, mode="w+", dtype=np.float32, shape=(n, D))
    for s in range(0, n, 1 << 17):
        mm[s:s + (1 << 17)] = unit(rng, (min(1 << 17, n - s), D))
    mm.flush()
    del mm
    np.save(codes_p, rng.permutation(np.repeat(np.arange(clients), per_client)))  # scattered rows
    np.save(syn_p, unit(rng, (N_SYN, D)))
    return emb_p, codes_p, syn_p


def child(emb_p: str, codes_p: str, syn_p: str, clients: int) -> None:
    """One --full scale in a fresh process: load like the CLI (mmap), score, report."""
    t0 = time.perf_counter()
    emb = np.load(emb_p, mmap_mode="r")
    codes, syn = np.load(codes_p), np.load(syn_p)
    t1 = time.perf_counter()
    total = popri_round(emb, codes, clients, syn)
    t2 = time.perf_counter()
    print(json.dumps({"clients": clients, "rows": int(emb.shape[0]), "load_s": t1 - t0,
                      "score_s": t2 - t1, "peak_rss_mb": peak_rss_mb(),
                      "finite": bool(np.isfinite(total).all())}))


def cli_child(emb_p: str, syn_set: str, out: str) -> None:
    """The whole `popri score` command on the same data (sidecars, hashing, outputs, ledger)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "popri.cli.app", "--quiet", "score", "--private", emb_p,
                    "--synthetic", syn_set, "--noise-multiplier", "19.3", "--seed", "0",
                    "--out", out],
                   check=True)
    # the CLI is the only child waited for; this process stays small, so RUSAGE_CHILDREN
    # (which also carries the parent's high-water mark at exec) is the CLI's peak
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"cli_s": time.perf_counter() - t, "cli_peak_rss_mb": peak}))


def write_cli_inputs(emb_p: str, codes_p: str, syn_p: str) -> str:
    """Sidecars for the CLI run: client ids for every private row, an embedding set for syn."""
    from popri.core.io import save_embedding_set

    codes = np.load(codes_p)
    with open(emb_p[:-4] + ".jsonl", "w") as fh:
        fh.writelines(f'{{"id": "r{i}", "client_id": "client-{c}"}}\n' for i, c in enumerate(codes))
    syn_set = syn_p[:-4] + "-set.npy"
    save_embedding_set(syn_set, np.load(syn_p), [{"id": f"s{i}"} for i in range(N_SYN)])
    return syn_set


def full_run(scales, per_client: int, cli: bool = True) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(prefix="popri-bench-") as tmp:
        for clients in scales:
            t = time.perf_counter()
            paths = make_full_data(Path(tmp), clients, per_client)
            gen = time.perf_counter() - t
            p = subprocess.run([sys.executable, __file__, "--child", *paths, str(clients)],
                               capture_output=True, text=True, check=True)
            res = json.loads(p.stdout.strip().splitlines()[-1])
            if cli:
                syn_set = write_cli_inputs(*paths)
                p = subprocess.run([sys.executable, __file__, "--cli-child", paths[0], syn_set,
                                    str(Path(tmp) / "scores.npy")],
                                   capture_output=True, text=True, check=True)
                res.update(json.loads(p.stdout.strip().splitlines()[-1]))
            res.update({"samples_per_client": per_client, "n_syn": N_SYN, "dim": D,
                        "private_file_gb": os.path.getsize(paths[0]) / 1e9, "generate_s": gen})
            out.append(res)
            for f in Path(tmp).iterdir():
                f.unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="also popri alone at 72k and 133k clients")
    ap.add_argument("--clients", type=int, default=1500)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--scales", type=int, nargs="+", default=[72_000, 133_000])
    ap.add_argument("--full-per-client", type=int, default=8)
    ap.add_argument("--no-cli", action="store_true", help="--full: skip the end-to-end CLI runs")
    ap.add_argument("--threads", type=int, help="BLAS/torch threads (default: all cores)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--cli-child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads:  # for this process (threadpoolctl, torch) and the subprocesses (environment)
        from threadpoolctl import threadpool_limits

        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "POPRI_THREADS"):
            os.environ[v] = str(a.threads)
        threadpool_limits(a.threads)
    if a.child:
        child(*a.child[:3], int(a.child[3]))
        return
    if a.cli_child:
        cli_child(*a.cli_child)
        return
    res = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "numpy": np.__version__, "threads": a.threads or os.cpu_count(),
                       "load_average_at_start": os.getloadavg()},
           "default": default_run(a.clients, a.per_client)}
    r = res["default"]
    s = r["seconds"]
    print(f"cosine scoring, {r['clients']} clients x {r['samples_per_client']} samples, "
          f"{N_SYN} synthetic x {D}-d (Z=0, standardise, clip 1)")
    print(f"{'method':46s} {'seconds':>9s} {'x popri':>9s}")
    for name, key in (("popri cosine_round", "popri"),
                      ("popri, per-client rows materialised", "popri_per_client_rows"),
                      ("popri from client means (same input as numpy)", "popri_from_client_means"),
                      ("numpy [L,d] @ [d,n_syn] product only", "numpy_matmul"),
                      ("reference loop (util.cos_sim per client)", "reference_loop")):
        print(f"{name:46s} {s[key]:9.3f} {s[key] / s['popri']:9.2f}")
    print(f"max |popri - reference| = {r['max_abs_diff_vs_reference']:.2e}; "
          f"rows path vs fast path = {r['max_abs_diff_rows_vs_fast']:.2e}")
    if a.full:
        res["full"] = full_run(a.scales, a.full_per_client, cli=not a.no_cli)
        print(f"\npopri alone at full scale ({a.full_per_client} samples/client, {N_SYN} "
              "synthetic, private set memory-mapped)")
        print(f"{'clients':>8s} {'rows':>10s} {'file GB':>8s} {'score s':>8s} {'peak RSS MB':>12s}"
              f" {'CLI s':>7s} {'CLI RSS MB':>11s}")
        for f in res["full"]:
            nan = float("nan")
            print(f"{f['clients']:8d} {f['rows']:10d} {f['private_file_gb']:8.2f} "
                  f"{f['score_s']:8.2f} {f['peak_rss_mb']:12.0f} {f.get('cli_s', nan):7.1f} "
                  f"{f.get('cli_peak_rss_mb', nan):11.0f}")
    res["machine"]["load_average_at_end"] = os.getloadavg()
    m = res["machine"]
    print(f"\n{m['threads']} threads; load average {m['load_average_at_start'][0]:.1f} at start, "
          f"{m['load_average_at_end'][0]:.1f} at end (other processes on the CPU inflate timings)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not a.full and "full" in prev:
        res["full"] = prev["full"]  # keep the last --full figures
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, RESULTS)
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
