"""popri fewfedpit: FewFedPIT's stages, one client round at a time (library:
popri/methods/fewfedpit/client.py and server.py; filters: filters.py; settings:
popri/specs/fewfedpit.py FewFedPITSpec).

    popri instruct build debian --out D --max-clients 10 --max-samples-per-client 16
    popri fewfedpit init --model smollm2-135m --seed 0 --out R/r0
    popri fewfedpit local --data D --client C --round 1 --init R/r0 --out R/r1/C/local
    popri fewfedpit selfgen --data D --client C --round 1 --init R/r0 --local R/r1/C/local --out R/r1/C/syn.jsonl
    popri fewfedpit train --synthetic R/r1/C/syn.jsonl --client C --round 1 --init R/r0 --out R/r1/C/public
    popri fewfedpit mix --local R/r1/C/local --public R/r1/C/public --round 1 --init R/r0 --out R/r1/C/mixed
    popri fewfedpit aggregate R/r1/*/mixed --round 1 --init R/r0 --out R/r1/global
    popri audit extract --model R/r1/global/model --data D --split train
"""

from __future__ import annotations

from typing import List, Optional

import typer

from popri.cli.options import spec_options, unwrap
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.methods.fewfedpit.client import init_global, run_local, run_mix, run_selfgen, run_train
from popri.methods.fewfedpit.server import aggregate
from popri.specs.fewfedpit import FewFedPITSpec

HELP = ("FewFedPIT (arXiv:2403.06131): federated few-shot instruction tuning with "
        "self-generated data; one client-round stage per command. No DP guarantee "
        "(eps = inf) unless the popri extension --clip/--noise-multiplier is used.")


@spec_options(FewFedPITSpec, only=('lora_r', 'lora_alpha', 'target_modules'))
def init_cmd(
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="Base model (alias, "
                              "checkpoint or hub id)."),
    out: str = typer.Option(..., "--out", "-o", help="Round-0 global weights directory."),
    seed: int = typer.Option(0, "--seed", help="The run's seed: the LoRA initialisation and "
                             "every client-round's choices."),
    *, spec: FewFedPITSpec,
) -> None:
    """W^g_0: the base model with a LoRA adapter initialised from --seed (B = 0: the base
    model's function), written as round 0's global weights (theta.npy, state.json, model/)."""
    check_outputs([out], [])
    init_global(model, out, spec, seed=seed)


@spec_options(FewFedPITSpec, only=('lr', 'rounds', 'local_epochs', 'batch_size', 'max_length', 'bf16', 'lora_r', 'lora_alpha'))
def local_cmd(
    data: str = typer.Option(..., "--data", "-d", help="Instruction dataset (popri instruct "
                             "build) or JSONL with instruction/input/output/client_id."),
    client: Optional[str] = typer.Option(None, "--client", "-c", help="The client's id."),
    all_clients: bool = typer.Option(False, "--all-clients", help="Pool every client's "
                                     "examples instead (centralised tuning: the eps = inf "
                                     "skyline of 'popri run')."),
    round_: int = typer.Option(..., "--round", min=1, help="Round r."),
    init: str = typer.Option(..., "--init", help="Round r-1's global weights directory."),
    out: str = typer.Option(..., "--out", "-o", help="Local weights directory W^l."),
    save_model: bool = typer.Option(False, "--save-model", help="Also write OUT/model (for "
                                    "eval / audit)."),
    split: str = typer.Option("train", "--split", help="Split of --data."),
    *, spec: FewFedPITSpec,
) -> None:
    """Private training (Algorithm 1, line 6): W^l = AdamW on the client's examples from the
    global weights, loss on the response tokens, lr on the cosine schedule over --rounds."""
    if (client is None) == (not all_clients):
        raise InputError("give --client C or --all-clients (one of them)", field="--client")
    check_outputs([out], [data, init])
    run_local(data, client, out, spec, round_=round_, init=init, split=split,
              save_model=save_model)


@spec_options(FewFedPITSpec, only=('candidates', 'keep', 'demos', 'io_shots', 'retries', 'instruction_prompts', 'rouge_threshold', 'instruction_tokens', 'response_tokens', 'max_length', 'bf16', 'lora_r', 'lora_alpha'))
def selfgen_cmd(
    data: str = typer.Option(..., "--data", "-d", help="Instruction dataset (the client's "
                             "local examples: demonstrations and the copy filter)."),
    client: str = typer.Option(..., "--client", "-c", help="The client's id."),
    round_: int = typer.Option(..., "--round", min=1, help="Round r."),
    init: str = typer.Option(..., "--init", help="Round r-1's global weights (M^g generates)."),
    local: str = typer.Option(..., "--local", help="This round's local weights (M^l scores "
                              "IFS)."),
    out: str = typer.Option(..., "--out", "-o", help="Every candidate, JSONL (kept: true for "
                            "D^syn)."),
    stats_out: Optional[str] = typer.Option(None, "--stats-out", help="Filter counts, JSON."),
    split: str = typer.Option("train", "--split", help="Split of --data."),
    *, spec: FewFedPITSpec,
) -> None:
    """Self-generation (Algorithm 1, line 7; section 3.3): new instructions from --demos random
    local ones (greedy, the global model), format and Rouge-L filters until --candidates (2M)
    remain, an input + response from a --io-shots prompt (at most --retries tries), the copy
    filter, then IFS = L(y|x) / L(y) under the local model; the --keep (M) lowest are kept.
    Writes every candidate with its Rouge-L, IFS, fate and reason."""
    check_outputs([out, stats_out], [data, init, local])
    run_selfgen(data, client, out, spec, round_=round_, init=init, local_dir=local,
                split=split, stats_out=stats_out)


@spec_options(FewFedPITSpec, only=('mode', 'lr', 'rounds', 'local_epochs', 'batch_size', 'max_length', 'bf16', 'lora_r', 'lora_alpha'))
def train_cmd(
    synthetic: str = typer.Option(..., "--synthetic", "-s", help="selfgen's JSONL (its kept "
                                  "rows)."),
    client: str = typer.Option(..., "--client", "-c", help="The client's id."),
    round_: int = typer.Option(..., "--round", min=1, help="Round r."),
    init: str = typer.Option(..., "--init", help="Round r-1's global weights directory."),
    out: str = typer.Option(..., "--out", "-o", help="Public weights directory W^g_k."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="fedmit: also the client's "
                                       "private examples (one model on both)."),
    split: str = typer.Option("train", "--split", help="Split of --data."),
    *, spec: FewFedPITSpec,
) -> None:
    """Training on the synthetic set (Algorithm 1, line 8): W^g_k from the global weights on
    selfgen's kept examples (fedmit with --data: on the private ones too)."""
    if data and spec.mode != "fedmit":
        raise InputError("--data (private examples in the same model) is fedmit's; FewFedPIT "
                         "trains the public weights on synthetic data only", field="--data")
    check_outputs([out], [synthetic, init, data])
    run_train(synthetic, client, out, spec, round_=round_, init=init, data=data, split=split)


@spec_options(FewFedPITSpec, only=('mode', 'beta', 'clip'))
def mix_cmd(
    round_: int = typer.Option(..., "--round", min=1, help="Round r."),
    init: str = typer.Option(..., "--init", help="Round r-1's global weights directory."),
    out: str = typer.Option(..., "--out", "-o", help="The upload W^a_k."),
    local: Optional[str] = typer.Option(None, "--local", help="W^l (local)."),
    public: Optional[str] = typer.Option(None, "--public", help="W^g_k (train)."),
    *, spec: FewFedPITSpec,
) -> None:
    """Local aggregation sharing (Algorithm 1, line 9): W^a = beta W^l + (1 - beta) W^g_k
    (fedit: W^l; fedmit: its one model). --clip (popri extension) clips the update W^a -
    W^g_{r-1} to that L2 norm, as the noise of 'aggregate --noise-multiplier' needs."""
    check_outputs([out], [init, local, public])
    run_mix(out, spec, round_=round_, init=init, local_dir=local, public_dir=public)


@spec_options(FewFedPITSpec, only=('mode', 'clip', 'noise_multiplier', 'lora_r', 'lora_alpha'))
def aggregate_cmd(
    uploads: List[str] = typer.Argument(..., metavar="UPLOADS...", help="The round's mixed "
                                        "weights directories."),
    round_: int = typer.Option(..., "--round", min=1, help="Round r."),
    init: str = typer.Option(..., "--init", help="Round r-1's global weights directory."),
    out: str = typer.Option(..., "--out", "-o", help="Round r's global weights directory "
                            "(with model/ for eval and audit)."),
    clients_total: Optional[int] = typer.Option(None, "--clients-total", min=1, help="N, the "
                                                "clients the K uploads were drawn from (the "
                                                "extension's q = K / N: fixed sampling, replace "
                                                "one client)."),
    public_clients: Optional[int] = typer.Option(None, "--public-clients", min=1, help="With "
                                                 "--noise-multiplier and everyone taking part: "
                                                 "N_pub, the clients, declared PUBLIC (a number "
                                                 "you state, never the count of uploads, which "
                                                 "is private under add/remove one client); the "
                                                 "noisy sum is divided by it."),
    delta: float = typer.Option(3e-6, "--delta", help="delta of the ledger entry."),
    release: bool = typer.Option(False, "--release/--research", envvar="POPRI_RELEASE",
                                 help="Release mode: noise from the OS CSPRNG, discrete Gaussian "
                                 "on a grid; round.json then holds no count of clients or "
                                 "examples and no update norm. Default: research mode, or "
                                 "POPRI_RELEASE=1."),
    diagnostics: bool = typer.Option(False, "--diagnostics", help="Release mode: also write "
                                     "the round's exact client count, example counts n_k and "
                                     "mean update norm to round.json's private_diagnostics, "
                                     "labelled NOT PRIVATE (research mode always writes them)."),
    *, spec: FewFedPITSpec,
) -> None:
    """The server (Algorithm 1, lines 12-14): W^g_r = sum_k (n_k / sum n) W^a_k; one ledger
    entry in OUT/../ledger.jsonl: eps = inf ("no DP guarantee") without the extension, else
    the Gaussian on the sum of clipped updates (uniform weights)."""
    if not 0.0 < delta < 1.0:
        raise InputError(f"must be a number in (0, 1) (got {delta!r})", field="--delta")
    if diagnostics and not release:
        raise InputError("--diagnostics is for release mode (research mode always writes the "
                         "exact statistics)", field="--diagnostics")
    check_outputs([out], [init, *uploads])
    aggregate(uploads, out, spec, round_=round_, init=init, clients_total=clients_total,
              public_clients=public_clients,
              delta=delta, release=release, diagnostics=diagnostics)


def register(app: typer.Typer) -> None:
    ffp = typer.Typer(help=HELP, no_args_is_help=True)
    for name, fn in (("init", init_cmd), ("local", local_cmd), ("selfgen", selfgen_cmd),
                     ("train", train_cmd), ("mix", mix_cmd), ("aggregate", aggregate_cmd)):
        ffp.command(name, help=unwrap(fn.__doc__ or ""))(fn)
    app.add_typer(ffp, name="fewfedpit")
