"""Examples shown at the top of every command's ``--help`` (the simonw/llm habit).

    popri score --help          # "Examples:" right after the first paragraph
    python -m pytest -q tests/test_cli_help.py

One place for them all, keyed by the command path (``"account epsilon"``), so that
``tests/test_cli_help.py`` can check that every command has at least one and that every
``--flag`` an example uses is an option of that command (an example cannot rot silently).
:func:`attach` puts them into the click command tree that :func:`popri.cli.app.main` runs.
Paths follow the README's layout: ``data/`` for fetched corpora, ``runs/`` for outputs.
"""

from __future__ import annotations

import click

EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": (
        "popri run       # the embedded default, examples/default.yaml",
        "popri run examples/smoke.yaml --run-dir runs/smoke",
        "popri run examples/smoke.yaml --run-dir runs/e7 --set privacy.epsilon=7",
        "popri run examples/default.yaml --set privacy.epsilon=7 --set rounds=2 --dry-run",
        "popri run examples/dpfl.yaml --set method=dp-ftrl --show-config",
    ),
    "embed": (
        "popri embed data/sotu --split train --out runs/private.npy",
        "popri embed runs/samples.jsonl --out - | popri score --synthetic - ...",
    ),
    "gen": (
        "popri gen data/public --prompts 12 --samples-per-prompt 6 --round 1 "
        "--out runs/r1/samples.jsonl",
        "popri gen data/public --num-samples 64 --adapter runs/r1/dpo/adapter "
        "--out runs/synthetic.jsonl",
    ),
    "vary": (
        "popri vary runs/pe/r1/survivors.jsonl --round 2 --seed 1 --out runs/pe/r2/population.jsonl",
    ),
    "expand": (
        "popri expand runs/pe/seeds.jsonl --num-samples 2000 --out runs/expand "
        "--merged-out runs/synthetic.jsonl",
    ),
    "score": (
        "popri score --private runs/private.npy --synthetic runs/r1/samples.jsonl "
        "--sample-rate 0.5 -z 2.9 --out runs/r1/scores.npy",
        "popri score --mode nn-histogram --private data/sotu --synthetic runs/pe/pop.npy "
        "-z 2.2 --out runs/pe/hist.npy",
    ),
    "aggregate": (
        "popri aggregate runs/r1/clients.npy --out runs/r1/scores.npy",
    ),
    "dpo": (
        "popri dpo --pairs runs/r1/prefs.jsonl --model smollm2-135m --out runs/r1/dpo",
    ),
    "sft": (
        "popri sft --pairs runs/r1/prefs.jsonl --model smollm2-135m --out runs/r1/sft",
    ),
    "train-downstream": (
        "popri train-downstream runs/synthetic.jsonl --val data/sotu --out runs/downstream",
    ),
    "report": (
        "popri report runs/demo --out runs/report",
        "popri report runs/demo runs/pe --out runs/compare   # two methods side by side",
    ),
    "bench fetch": (
        "popri bench fetch sotu --out data/sotu --date-from 1900-01-01",
        "popri bench fetch my.csv --client-column user --date-column date --out data/mine",
    ),
    "bench stats": ("popri bench stats data/sotu",),
    "bench list": ("popri bench list --json",),
    "instruct build": (
        "popri instruct build debian --out data/instruct-debian --max-clients 10",
    ),
    "pe init": ("popri pe init data/public --num 48 --seed 0 --out runs/pe/r1/population.jsonl",),
    "pe draw": (
        "popri pe draw --population runs/pe/r1/population.jsonl --scores runs/pe/r1/hist.npy "
        "--num 48 --round 1 --out runs/pe/r1/survivors.jsonl",
    ),
    "pe seeds": (
        "popri pe seeds runs/pe/r1/survivors.jsonl runs/pe/r2/survivors.jsonl "
        "--out runs/pe/seeds.jsonl",
    ),
    "prefs build": (
        "popri prefs build --samples runs/r1/samples.jsonl --scores runs/r1/scores.npy "
        "--rejected-rank 5 --out runs/r1/prefs.jsonl",
        "popri prefs build --samples runs/r1/samples.jsonl --scores runs/r1/scores.npy "
        "--pair-rule fluent --fluency runs/r1/fluency.jsonl --out runs/r1/prefs.jsonl",
    ),
    "prefs gate": (
        "popri prefs gate --samples runs/r1/samples.jsonl --fluency runs/r1/fluency.jsonl "
        "--drop 0.25 --out runs/r1/samples_gated.jsonl",
    ),
    "take": (
        "popri take runs/x/synthetic_pool.jsonl --tokens-of runs/x/synthetic_t0.jsonl "
        "--out runs/x/synthetic.jsonl",
        "popri take pool.jsonl --tokens 4096 --tokenizer smollm2-135m > set.jsonl",
    ),
    "prefs pool": (
        "popri prefs pool --samples runs/r1/samples.jsonl --scores runs/r1/scores.npy "
        "--base data/public --round 1 --out runs/r1/pool.jsonl",
    ),
    "eval accuracy": (
        "popri eval accuracy --model runs/downstream --data data/sotu --split test --json",
    ),
    "eval quality": (
        "popri eval quality runs/x/synthetic.jsonl --reference data/sotu --max-reference 400 "
        "--sizes 96,384 --json",
    ),
    "eval probe": ("popri eval probe runs/r1/probe.jsonl --target data/sotu --split val",),
    "eval fluency": (
        "popri eval fluency runs/r1/prefs.jsonl --json",
        "popri eval fluency runs/r1/samples.jsonl --out runs/r1/fluency.jsonl",
        "popri eval fluency runs/probe/round0.jsonl --adapter runs/r3/dpo/adapter",
    ),
    "eval diff": (
        "popri eval diff --method runs/eval/popri.clients.jsonl "
        "--control runs/eval/t0.clients.jsonl --json",
    ),
    "eval fid": ("popri eval fid runs/synthetic.jsonl data/sotu --split val",),
    "eval gap": (
        "popri eval gap --method m.clients.jsonl --eps0 e0.clients.jsonl "
        "--epsinf ei.clients.jsonl",
    ),
    "eval instruct": ("popri eval instruct --model runs/ffp/r1/global/model --data data/ins "
                      "--split test",),
    "fl round": (
        "popri fl round --data data/sotu --round 1 -z 1.2 --sample-rate 0.1 --out runs/fl/round1",
        "popri fl round --data data/sotu --round 2 --init runs/fl/round1 -z 1.2 "
        "--sample-rate 0.1 --out runs/fl/round2",
    ),
    "fewfedpit init": ("popri fewfedpit init --model smollm2-135m --seed 0 --out runs/ffp/r0",),
    "fewfedpit local": (
        "popri fewfedpit local --data data/ins --client c1 --round 1 --init runs/ffp/r0 "
        "--out runs/ffp/r1/c1/local",
    ),
    "fewfedpit selfgen": (
        "popri fewfedpit selfgen --data data/ins --client c1 --round 1 --init runs/ffp/r0 "
        "--local runs/ffp/r1/c1/local --out runs/ffp/r1/c1/syn.jsonl",
    ),
    "fewfedpit train": (
        "popri fewfedpit train --synthetic runs/ffp/r1/c1/syn.jsonl --client c1 --round 1 "
        "--init runs/ffp/r0 --out runs/ffp/r1/c1/public",
    ),
    "fewfedpit mix": (
        "popri fewfedpit mix --local runs/ffp/r1/c1/local --public runs/ffp/r1/c1/public "
        "--round 1 --init runs/ffp/r0 --out runs/ffp/r1/c1/mixed",
    ),
    "fewfedpit aggregate": (
        "popri fewfedpit aggregate runs/ffp/r1/c1/mixed runs/ffp/r1/c2/mixed --round 1 "
        "--init runs/ffp/r0 --out runs/ffp/r1/global",
    ),
    "account epsilon": (
        "popri account epsilon -z 2.5 --sample-rate 0.1 --rounds 20 --delta 3e-6",
        "popri account epsilon -z 2.1793 --sample-rate 1 --rounds 11 --accountant pld",
    ),
    "account sigma": (
        "popri account sigma --epsilon 1 --sample-rate 0.5 --rounds 1",
        "popri account sigma --epsilon 1 --sample-rate 0.5 --rounds 3 --sampling fixed",
    ),
    "account ledger": (
        "popri account ledger runs/demo",
        "popri account ledger runs/ --json --max-epsilon 1",
    ),
    "audit release": (
        "popri audit release --mechanism cosine -z 1 --trials 10000",
        "popri audit release --mechanism fixed -z 1.5 --trials 100000",
    ),
    "audit extract": (
        "popri audit extract --model runs/ffp/r1/global/model --data data/ins --split train",
    ),
    "audit canaries": (
        "popri audit canaries examples/dpfl.yaml --run-dir runs/canary-dpfl --canaries 200",
        "popri audit canaries examples/smoke.yaml --run-dir runs/canary-inf "
        "--set privacy.epsilon=inf",
    ),
    "runs list": ("popri runs list runs/",),
    "runs show": ("popri runs show runs/demo",),
    # the two runs the "run" examples write
    "runs diff": ("popri runs diff runs/smoke runs/e7",
                  "popri runs diff runs/smoke runs/e7 --keys 'privacy.*' --keys epsilon"),
    "fred stats": (
        "popri fred stats --private data/sotu --epsilon 0.6 --delta 2e-6 --out runs/fred/sotu.npz",
    ),
    "fred compare": (
        "popri fred compare --stats runs/fred/sotu.npz data/shakespeare cand.jsonl",
    ),
}


#: the width an example line may take inside the help (click indents it by 2 more; 80 columns)
WIDTH = 76


def _lines(example: str) -> list[str]:
    """One example as shell lines of at most WIDTH characters: long ones continue with
    backslashes (a trailing comment stays on the first line when it fits)."""
    if len(example) + 2 <= WIDTH:
        return [f"  {example}"]
    code, _, comment = example.partition("  #")
    out, cur = [], "  "
    for w in code.split():
        if len(cur) + len(w) + 3 > WIDTH and cur.strip():
            out.append(cur.rstrip() + " \\")
            cur = "      "
        cur += w + " "
    out.append(cur.rstrip())
    if comment.strip():
        out.append(f"  # {comment.strip()}")
    return out


def block(path: str) -> str:
    """The "Examples:" paragraph of command ``path`` (click keeps a ``\\b`` paragraph as
    written), or "" when it has none."""
    ex = EXAMPLES.get(path)
    if not ex:
        return ""
    return "\b\nExamples:\n" + "\n".join(line for e in ex for line in _lines(e))


def attach(cmd: click.Command, path: str = "") -> click.Command:
    """Put each command's examples at the end of its help, after its options (the epilog:
    the lines a terminal still shows after a long ``--help``; issue 68), in place."""
    subs = getattr(cmd, "commands", None)
    if subs:
        for name, sub in subs.items():
            attach(sub, f"{path} {name}".strip())
        return cmd
    ex = block(path)
    if ex and not (cmd.epilog or "").startswith("\b\nExamples:"):
        cmd.epilog = ex + (f"\n\n{cmd.epilog}" if cmd.epilog else "")
    return cmd


def walk(cmd: click.Command, path: str = ""):
    """(path, leaf command) for every leaf of the tree."""
    subs = getattr(cmd, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from walk(sub, f"{path} {name}".strip())
    else:
        yield path, cmd
