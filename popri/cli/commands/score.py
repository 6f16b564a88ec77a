"""popri score: one round of DP client feedback on synthetic samples (maths: popri/feedback/scoring.py).

    popri score --mode cosine --private runs/priv.npy --synthetic runs/syn.npy \\
        --noise-multiplier 1.05 --clients-per-round 1000 --seed 0 --out runs/scores.npy
    popri embed syn.jsonl --out - | popri score --synthetic - --private data/sotu \\
        --noise-multiplier 1 --seed 0 --out runs/scores.npy
"""

from __future__ import annotations

from typing import Optional

import typer

MODES = ("cosine", "nn-histogram")

HELP = """Score synthetic samples with DP feedback from private clients (one round).

cosine (POPri, ICML 2025, Algorithm 2): each participating client scores every synthetic sample by
the mean cosine similarity to its private samples, z-scores its vector (--standardize, as the
POPri reference code does), clips it to L2 norm C (--clip, default 1: POPri section 3.1) and adds
N(0, Z^2 C^2 / L); the output is the noisy SUM over clients, or the MEAN when the count is public: a
fixed --clients-per-round L, or --public-clients N (divided by q*N under Poisson sampling). The
realised client count is private under add/remove neighbours and never divides a release.

nn-histogram (PrE-Text / Private Evolution, Algorithm 2 "Histogram"): each private sample (at most
M per client, --max-samples-per-client, default 8 as PrE-Text) votes for its nearest synthetic
sample (L2, faiss); noise N(0, Z^2 M^2) on the SUM, then max(hist - H, 0) (--threshold). Lookahead
(PrE-Text): pass the embedding set of the lookahead means as --synthetic.

Without --per-client-out the noise is drawn once on the sum, N(0, Z^2 s^2) (s = C or M), which is
distributed exactly as the sum of the L per-client draws.  With --per-client-out every client's
noised upload is written ([L, n_syn] float32; sum them with 'popri aggregate').

Outputs: SCORES.npy (float32, row-aligned with the synthetic ids) + SCORES.json (ids, mode, round,
params, ledger entry); the ledger entry is appended (under a file lock, before the outputs appear)
to ledger.jsonl next to the output. --out - prints JSONL {"id", "score"} on stdout; the ledger then
goes next to --per-client-out or into --ledger DIR (one of them is required).  Default delta 3e-6
(POPri B.1, PrE-Text).

Research mode (default): the noise comes from --seed, which the sidecar records, so anyone with the
sidecar can regenerate it; fine for experiments, not for publishing.  Release mode (--release): OS
randomness, no seed and no exact client counts in any file, and a discretised Gaussian (the sum
snapped to a power-of-two grid plus discrete Gaussian noise, immune to floating-point attacks); the
ledger records its effective noise multiplier (at most 1e-4 below -z). --diagnostic writes noise-free
scores marked NOT PRIVATE with no ledger entry (recovery-rate diagnostics)."""


def score(
    private: str = typer.Option(
        ..., "--private",
        help="Private data: a federated dataset directory (its --split), JSONL with 'client_id' "
             "and 'text' (or 'embedding'), or an embedding set NAME.npy whose sidecar has "
             "'client_id'."),
    synthetic: str = typer.Option(
        ..., "--synthetic",
        help="Synthetic samples: JSONL with 'text' (or 'embedding' rows, e.g. from 'popri embed "
             "--out -'), an embedding set NAME.npy, or '-' for stdin."),
    noise_multiplier: float = typer.Option(
        ..., "--noise-multiplier", "-z", min=0.0,
        callback=lambda v: __import__("popri.core.validate", fromlist=["x"]).noise_multiplier(v),
        help="Z: noise std on the sum / sensitivity. 0 = no privacy (warned, still recorded)."),
    mode: str = typer.Option("cosine", "--mode", help="cosine (POPri) or nn-histogram (PE)."),
    clip: Optional[float] = typer.Option(
        None, "--clip", help="cosine: L2 clip norm C, the sensitivity (default 1.0, POPri 3.1)."),
    sample_rate: Optional[float] = typer.Option(
        None, "--sample-rate",
        help="Poisson client sampling at rate q (exclusive with --clients-per-round). "
             "Default: every client."),
    clients_per_round: Optional[int] = typer.Option(
        None, "--clients-per-round", "-L",
        help="Exactly L clients, uniformly without replacement (POPri D.1: 1000)."),
    seed: int = typer.Option(
        0, "--seed", help="Seed for client sampling, the per-client cap and the noise "
                          "(separate streams)."),
    standardize: Optional[bool] = typer.Option(
        None, "--standardize/--no-standardize",
        help="cosine: z-score each client's vector before clipping (default on, as meiyuw/POPri "
             "client_feedback.py): the norm budget goes to differences, not a common offset."),
    max_samples_per_client: Optional[int] = typer.Option(
        None, "--max-samples-per-client", "-M", min=1,
        help="Cap M on samples per client (seeded choice). nn-histogram: default 8, the "
             "sensitivity (PrE-Text). cosine: default all."),
    threshold: Optional[float] = typer.Option(
        None, "--threshold", "-H",
        help="nn-histogram: H in max(hist - H, 0) after aggregation (default 0)."),
    out: Optional[str] = typer.Option(
        None, "--out", "-o", help="SCORES.npy (+ SCORES.json), or '-' for JSONL on stdout."),
    per_client_out: Optional[str] = typer.Option(
        None, "--per-client-out",
        help="CLIENTS.npy: every participating client's noised upload [L, n_syn] + CLIENTS.json "
             "(client ids in row order)."),
    ledger_dir: Optional[str] = typer.Option(
        None, "--ledger",
        help="Directory whose ledger.jsonl records this release (default: next to the outputs)."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", envvar="POPRI_EMBED_MODEL",
        help="Embedding model for text inputs (default all-MiniLM-L6-v2: POPri B.1, "
             "PrE-Text D.2)."),
    split: str = typer.Option("train", "--split", help="Split when --private is a dataset dir."),
    delta: float = typer.Option(3e-6, "--delta", help="delta recorded in the ledger (POPri B.1)."),
    release: bool = typer.Option(
        False, "--release", envvar="POPRI_RELEASE",
        help="Secure randomness (os.urandom) for sampling, cap and noise; the seed is then ignored "
             "for them."),
    round_: int = typer.Option(0, "--round", help="Round number, recorded in sidecar and ledger."),
    block_size: Optional[int] = typer.Option(
        None, "--block-size", min=1,
        help="Clients per block for per-client rows (default: ~256 MB of float32)."),
    public_clients: Optional[int] = typer.Option(
        None, "--public-clients", min=1,
        help="cosine: the number of enrolled clients N, which you declare PUBLIC (e.g. the size "
             "of the server's registry): the output is then the mean, the noisy sum divided by "
             "q*N (Poisson) or N (all clients). Without it (and without --clients-per-round) the "
             "output is the noisy sum: the realised client count is private."),
    diagnostic: bool = typer.Option(
        False, "--diagnostic",
        help="Noise-free scores (z = 0) for diagnostics such as the recovery rate: written with "
             "\"diagnostic\": true, \"private\": false and NO ledger entry. Never release them."),
) -> None:
    _run(**locals())


def _options(mode, clip, standardize, max_samples_per_client, threshold, sample_rate,
             clients_per_round, out, per_client_out, ledger_dir, private, synthetic):
    """Check the option combination; return (clip, standardize, M, threshold) with defaults."""
    from popri.core.errors import InputError

    if mode not in MODES:
        raise InputError(f"--mode must be one of {', '.join(MODES)} (got {mode!r})")
    if sample_rate is not None and clients_per_round is not None:
        raise InputError("--sample-rate (Poisson) and --clients-per-round (fixed L) are mutually "
                         "exclusive; give one")
    from popri.core import validate

    if sample_rate is not None:  # q >= 1e-12: q*N divides the noise (validate.MIN_SAMPLE_RATE)
        validate.sample_rate(sample_rate)
    if clients_per_round is not None and clients_per_round < 1:
        raise InputError(f"--clients-per-round must be >= 1 (got {clients_per_round})")
    if mode == "cosine":
        if threshold is not None:
            raise InputError("--threshold applies to --mode nn-histogram only")
        clip = 1.0 if clip is None else validate.clip(clip)  # (0, 1e6]: validate.CLIP_MAX
        standardize = True if standardize is None else standardize
    else:
        if clip is not None or standardize is not None:
            raise InputError("--clip/--standardize apply to --mode cosine; nn-histogram's "
                             "sensitivity is --max-samples-per-client")
        max_samples_per_client = max_samples_per_client or 8
        threshold = 0.0 if threshold is None else validate.finite(threshold, "--threshold", lo=0)
    if not out and not per_client_out:
        raise InputError("nothing to write: give --out and/or --per-client-out")
    if out and out != "-" and not out.endswith(".npy"):
        raise InputError("--out must be NAME.npy or '-'", path=out)
    if per_client_out and not per_client_out.endswith(".npy"):
        raise InputError("--per-client-out must be NAME.npy", path=per_client_out)
    if private == "-" and synthetic == "-":
        raise InputError("only one of --private / --synthetic can be '-' (stdin)")
    # --out - without a ledger and outputs over inputs are refused by release_scores (its guard)
    return clip, standardize, max_samples_per_client, threshold


def _run(private, synthetic, noise_multiplier, mode, clip, sample_rate, clients_per_round, seed,
         standardize, max_samples_per_client, threshold, out, per_client_out, ledger_dir, model,
         split, delta, release, round_, block_size, diagnostic=False,
         public_clients=None) -> None:
    from popri.feedback.release import release_scores

    clip, standardize, M, threshold = _options(
        mode, clip, standardize, max_samples_per_client, threshold, sample_rate, clients_per_round,
        out, per_client_out, ledger_dir, private, synthetic)
    release_scores(private, synthetic, noise_multiplier=noise_multiplier, mode=mode, clip=clip,
                   sample_rate=sample_rate, clients_per_round=clients_per_round, seed=seed,
                   standardize=standardize, max_samples_per_client=M, threshold=threshold,
                   out=out, per_client_out=per_client_out, ledger_dir=ledger_dir, model=model,
                   split=split, delta=delta, release=release, round_=round_,
                   block_size=block_size, diagnostic=diagnostic, public_clients=public_clients)


def _unwrap(text: str) -> str:
    """One line per paragraph, so the terminal (rich) does the wrapping."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    app.command("score", help=_unwrap(HELP))(score)
