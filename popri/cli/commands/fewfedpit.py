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

from popri.cli.options import unwrap
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.methods.fewfedpit.client import init_global, run_local, run_mix, run_selfgen, run_train
from popri.methods.fewfedpit.server import aggregate
from popri.specs.fewfedpit import FewFedPITSpec
from popri.cli.options import command
from popri.specs.commands.fewfedpit import (
    FewfedpitAggregateCall,
    FewfedpitInitCall,
    FewfedpitLocalCall,
    FewfedpitMixCall,
    FewfedpitSelfgenCall,
    FewfedpitTrainCall,
)

HELP = ("FewFedPIT (arXiv:2403.06131): federated few-shot instruction tuning with "
        "self-generated data; one client-round stage per command. No DP guarantee "
        "(eps = inf) unless the popri extension --clip/--noise-multiplier is used.")


@command(FewfedpitInitCall)
def init_cmd(model: str, out: str, seed: int, *, spec: FewFedPITSpec) -> None:
    """W^g_0: the base model with a LoRA adapter initialised from --seed (B = 0: the base
    model's function), written as round 0's global weights (theta.npy, state.json, model/)."""
    check_outputs([out], [])
    init_global(model, out, spec, seed=seed)


@command(FewfedpitLocalCall)
def local_cmd(
    data: str, client: Optional[str], all_clients: bool, round_: int, init: str, out: str,
    save_model: bool, split: str, *, spec: FewFedPITSpec
) -> None:
    """Private training (Algorithm 1, line 6): W^l = AdamW on the client's examples from the
    global weights, loss on the response tokens, lr on the cosine schedule over --rounds."""
    if (client is None) == (not all_clients):
        raise InputError("give --client C or --all-clients (one of them)", field="--client")
    check_outputs([out], [data, init])
    run_local(data, client, out, spec, round_=round_, init=init, split=split,
              save_model=save_model)


@command(FewfedpitSelfgenCall)
def selfgen_cmd(
    data: str, client: str, round_: int, init: str, local: str, out: str, stats_out: Optional[str],
    split: str, *, spec: FewFedPITSpec
) -> None:
    """Self-generation (Algorithm 1, line 7; section 3.3): new instructions from --demos random
    local ones (greedy, the global model), format and Rouge-L filters until --candidates (2M)
    remain, an input + response from a --io-shots prompt (at most --retries tries), the copy
    filter, then IFS = L(y|x) / L(y) under the local model; the --keep (M) lowest are kept.
    Writes every candidate with its Rouge-L, IFS, fate and reason."""
    check_outputs([out, stats_out], [data, init, local])
    run_selfgen(data, client, out, spec, round_=round_, init=init, local_dir=local,
                split=split, stats_out=stats_out)


@command(FewfedpitTrainCall)
def train_cmd(
    synthetic: str, client: str, round_: int, init: str, out: str, data: Optional[str], split: str,
    *, spec: FewFedPITSpec
) -> None:
    """Training on the synthetic set (Algorithm 1, line 8): W^g_k from the global weights on
    selfgen's kept examples (fedmit with --data: on the private ones too)."""
    if data and spec.mode != "fedmit":
        raise InputError("--data (private examples in the same model) is fedmit's; FewFedPIT "
                         "trains the public weights on synthetic data only", field="--data")
    check_outputs([out], [synthetic, init, data])
    run_train(synthetic, client, out, spec, round_=round_, init=init, data=data, split=split)


@command(FewfedpitMixCall)
def mix_cmd(
    round_: int, init: str, out: str, local: Optional[str], public: Optional[str], *,
    spec: FewFedPITSpec
) -> None:
    """Local aggregation sharing (Algorithm 1, line 9): W^a = beta W^l + (1 - beta) W^g_k
    (fedit: W^l; fedmit: its one model). --clip (popri extension) clips the update W^a -
    W^g_{r-1} to that L2 norm, as the noise of 'aggregate --noise-multiplier' needs."""
    check_outputs([out], [init, local, public])
    run_mix(out, spec, round_=round_, init=init, local_dir=local, public_dir=public)


@command(FewfedpitAggregateCall)
def aggregate_cmd(
    uploads: List[str], round_: int, init: str, out: str, clients_total: Optional[int],
    public_clients: Optional[int], delta: float, release: bool, diagnostics: bool, *,
    spec: FewFedPITSpec
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
