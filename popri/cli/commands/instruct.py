"""popri instruct: federated instruction data (instruction, input, response) for FewFedPIT.

    popri instruct build debian --out data/instruct-debian --max-clients 10 --max-samples-per-client 16
    popri instruct build sotu --out data/instruct-sotu
    popri instruct build shakespeare --out data/instruct-shakespeare --max-clients 50
    popri instruct build my.jsonl --client-column user --out data/instruct-mine
    popri instruct build debian --out d --partition clusters --clusters 20 --num-clients 10

Library: popri/data/instruct.py (the tasks, the template, the partitions); settings:
popri/specs/instruct.py InstructSpec.
"""

from __future__ import annotations

from typing import Optional

import typer

from popri.cli.options import unwrap
from popri.core.guard import check_outputs
from popri.data.build import FILES, check_out_dir
from popri.data.instruct import build as do_build
from popri.models.embed import embed_texts
from popri.specs.instruct import InstructSpec
from popri.cli.options import command
from popri.specs.commands.instruct import InstructBuildCall

HELP = """Build federated instruction data: (instruction, input, response) triples held by
clients, the data of FewFedPIT (arXiv:2403.06131, section 4.1), from the offline corpora.

SOURCE: debian ("Describe the Debian package NAME: SYNOPSIS." -> the long description;
client = the maintainer: naturally few-shot and non-IID), sotu (a passage of an address ->
the passage that follows; client = the address), shakespeare (the previous speech -> a role's
reply; client = play/role, as LEAF), or a local .jsonl/.json file with instruction, output and
optional input fields (client in --client-column, default client_id).

--partition clusters is FewFedPIT's split: faiss k-means of the MiniLM embeddings of
instruction + input into --clusters groups (--per-cluster keeps that many of each: the few-shot
set), each group spread over --num-clients clients by Dirichlet(--alpha) proportions (Hsu et
al. 2019); iid deals examples out at random.

Writes DIR/train.jsonl, val.jsonl, test.jsonl (records id, client_id, instruction, input,
output, text = the example in the Alpaca template, source fields; split by client) and
DIR/manifest.json (how it was made, counts, sha256 of every file): a popri federated dataset
that 'popri embed', 'train-downstream' and 'eval' read as any other.  Same inputs, options and
--seed give byte-identical files.  A non-empty DIR that is not a popri dataset is refused unless
--force."""


@command(InstructBuildCall)
def build_cmd(
    name: str, out: str, seed: int, source: Optional[str], client_column: Optional[str],
    force: bool, *, spec: InstructSpec
) -> None:
    from pathlib import Path

    check_outputs([out, *(Path(out) / f for f in (*FILES, "manifest.json"))],
                  [name if Path(name).is_file() else None, source])
    check_out_dir(out, force)
    do_build(name, out, spec, seed=seed, source=source, client_column=client_column,
             embed=embed_texts)


def register(app: typer.Typer) -> None:
    ins = typer.Typer(help="Federated instruction data for FewFedPIT: build (instruction, "
                      "input, response) datasets from the offline corpora or a JSONL file.",
                      no_args_is_help=True)
    ins.command("build", help=unwrap(HELP))(build_cmd)
    app.add_typer(ins, name="instruct")
