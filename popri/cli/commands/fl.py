"""popri fl: DP federated learning of the downstream model, DP-FedAvg and DP-FTRL, one round per
call (library: popri/methods/dpfl/rounds.py; settings: popri/specs/fl.py FLSpec; accounting:
popri/privacy/accounting.py, mechanisms subsampled_gaussian and tree_aggregation).

    popri fl round --data runs/x/data/private --round 1 -z 1.2 -L 8 --seed 0 --out runs/x/fl/round1
    popri fl round --data runs/x/data/private --round 2 --init runs/x/fl/round1 -z 1.2 -L 8 \
        --seed 0 --out runs/x/fl/round2
    popri eval accuracy --model runs/x/fl/round2/model --data runs/x/data/private --split test
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.methods.dpfl import rounds as lib
from popri.specs.fl import FLSpec
from popri.cli.options import command
from popri.specs.commands.fl import FlRoundCall

HELP = """DP federated learning, one round: the DP-FL baselines of POPri (section 4, appendix C.1
DP-FedAvg, C.2 DP-FTRL). Clients are sampled (--clients-per-round L of N, --sample-rate q, or
all); each sampled client trains the global model (a LoRA adapter by default, --full for the
whole model) for --local-epochs of SGD at --client-lr, batch 2, 64-token sequences, and uploads
its update clipped to L2 norm --clip C. The server sums the updates as they arrive (never all in
memory), adds noise -- fedavg: N(0, z^2 C^2); ftrl: tree-aggregation noise on the prefix sums, the
tree restarted every epoch of floor(N / L) rounds in which each client takes part once (--restart
epoch, Kairouz et al.'s TreeRestart; --restart round: a one-leaf tree per round) -- divides by the
expected number of clients and takes a server step with momentum (default 0.9 for both, PrE-Text
D.2) at --server-lr (default 1 - momentum).

Output: the directory --out (atomic): theta.npy (the global weights), server.npz (the server's
momentum), round.json (settings, the release id; in research mode also private_diagnostics: clients, update norms, clipped share, local loss, labelled NOT PRIVATE) and model/ (loadable by
'popri eval accuracy --model OUT/model'). One ledger entry per round in OUT/../ledger.jsonl
(subsampled_gaussian, or tree_aggregation for ftrl, which gets no amplification by sampling);
'popri account ledger' totals them. Round t > 1 continues from --init, round t-1's directory.
Research mode seeds everything (--seed with the round); --release draws the sampling and the
noise from the OS CSPRNG and adds discrete-Gaussian noise on a grid.

--engine flower runs the round on Flower's simulation runtime with SecAgg+ (pip install
'popri[flower]'): participant i goes to virtual SuperNode i mod --supernodes, every node trains
its clients from the global weights and uploads the sum of their clipped updates plus its share
of the noise (--secagg-mechanism ddg: the distributed discrete Gaussian, ledgered as such;
gaussian: Flower's float path); the server only sees the sum. A client trains exactly as
in-process (its data order depends on the seed, round and client id)."""


@command(FlRoundCall)
def round_cmd(
    data: str, out: str, round_: int, init: Optional[str], model: str, split: str, seed: int,
    lora: bool, diagnostics: bool, *, spec: FLSpec
) -> None:
    """Every FlRoundCall field is an option (:func:`popri.cli.options.command`)."""
    from pathlib import Path

    if spec.noise_multiplier is None:
        raise InputError("is required (popri run calibrates it to the budget; 'popri account "
                         "sigma' finds the z of a target epsilon)", field="--noise-multiplier")
    check_outputs([out], [data, init, model if Path(model).exists() else None])
    if diagnostics and not spec.release:
        raise InputError("--diagnostics is for release mode (research mode always writes the "
                         "exact statistics)", field="--diagnostics")
    lib.run_round(data, out, spec, round_=round_, noise_multiplier=spec.noise_multiplier,
                  model=model, init=init, clients_per_round=spec.clients_per_round,
                  sample_rate=spec.sample_rate, delta=spec.delta, seed=seed,
                  release=spec.release, split=split, diagnostics=diagnostics)
    print(out, flush=True)


def register(app: typer.Typer) -> None:
    fl = typer.Typer(help="DP federated learning of the downstream model: DP-FedAvg, DP-FTRL "
                     "(POPri's DP-FL baselines).", no_args_is_help=True)
    fl.command("round", help=unwrap(HELP))(round_cmd)
    app.add_typer(fl, name="fl")
