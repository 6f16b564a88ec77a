"""A hostile pass over every popri command that writes an output: nothing popri did not create
is ever deleted or altered (the directory-output rule, popri/core/outdir.py; atomic file
outputs, popri/core/atomic.py; the input guard, popri/core/guard.py).

Each case builds real, valid inputs (so the command would get as far as writing), puts a
hostile thing where the output goes, snapshots every name under the test directory (type,
inode, bytes, link target) and checks afterwards that every pre-existing entry is unchanged,
the command exited 2 with one ``popri: error: ...`` line, and (for a refusal) nothing new
appeared either.  FIFOs stand in for /dev/full: no /dev path is ever an output here (the
tests run as root and an old bug deleted device nodes).

Directory outputs (dpo, sft, train-downstream, expand, bench fetch, instruct build, run
--run-dir; fl round and fewfedpit are in tests/test_hostile_outputs.py) x targets: a user's
non-empty directory (holding names the command writes too), a regular file, a FIFO, a symlink
to a user's directory (non-empty, and empty), a directory holding the command's own input, and
a user's directory that only looks like an old popri output (outdir's ``legacy`` names).
``--force`` where a command has it: on a file, a FIFO, a link or an input it alters nothing
(a --force that writes into a directory may add files there); on a foreign directory it does
what its help says.

The pass found (and popri then fixed) a user's run.json, manifest.json and shards overwritten
and a user's directory deleted by ``--force`` when it looked like an old popri output, a run
directory's files overwritten, symlinked outputs followed, and an empty ledger left inside a
user's directory by a refused release; ``XFAIL`` holds any case that fails again.

File outputs (embed, gen, vary, expand --merged-out, score, aggregate, pe, prefs, eval, audit
extract, fred stats) x (a) a user's non-empty directory at the output path, (b) the output
path equal to one of the inputs.

    python -m pytest -q -n 2 tests/test_no_deletion.py
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import emb_set, write_jsonl

FIX = Path(__file__).parent / "fixtures"


# --------------------------------------------------------------------------- snapshot
def snap(root: Path) -> dict:
    """Every name under ``root`` (links not followed, FIFOs never opened): type, inode,
    sha256 of a file's bytes, a link's target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_ino)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    out[rel] = ("file", st.st_ino, hashlib.sha256(fh.read()).hexdigest())
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("fifo", st.st_ino)
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_ino)
    return out


def changed(before: dict, after: dict, keep=lambda rel: True) -> dict:
    """Pre-existing entries (those ``keep`` selects) that are gone or different."""
    return {k: (v, after.get(k)) for k, v in before.items() if keep(k) and after.get(k) != v}


def added(before: dict, after: dict) -> list:
    return sorted(set(after) - set(before))


def one_line_error(p, early: bool = True) -> None:
    """Exit 2 and one ``popri: error:`` line, no traceback.  ``early``: refused before anything
    ran, so that line is all of stderr; otherwise (a file output found to be a directory when
    it is written) the progress lines of the work done come before it."""
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [x for x in lines if x.startswith("popri: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], p.stderr[-3000:]
    if early:
        assert len(lines) == 1, p.stderr[-3000:]


class Fifo:
    """A FIFO standing in for /dev/full, with a non-blocking reader held open so that a command
    that wrongly writes into it does not hang (what it wrote is read back)."""

    def __init__(self, path: Path):
        os.mkfifo(path)
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def written(self) -> bytes:
        try:
            return os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.fd)


# --------------------------------------------------------------------------- inputs
PAIRS = [{"prompt": f"Write one line about topic {k}.", "chosen": "a clear and useful answer",
          "rejected": "no"} for k in range(4)]
SYN = [{"id": f"s{i}", "text": t} for i, t in enumerate([
    "The committee met on Tuesday to discuss the budget for the coming year.",
    "Our farmers deserve fair prices and a government that listens to them.",
    "We must invest in clean energy to secure jobs for the next generation.",
    "Small businesses are the backbone of every town in this country.",
    "The bill before us today would extend protections to seasonal workers.",
    "The minister has not answered the question about hospital waiting lists."])]


def _instruct_rows():
    return [{"client_id": f"user{c}", "instruction": f"Describe item {k} of user{c}.",
             "output": f"Item {k} of user{c} is small, round and quite heavy."}
            for c in range(12) for k in range(2)]


def dir_inputs(cmd: str, where: Path) -> dict:
    """The real input files of ``cmd`` (a directory-output command), written into ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    if cmd in ("dpo", "sft"):
        return {"main": write_jsonl(where / "pairs.jsonl", PAIRS)}
    if cmd in ("train-downstream", "expand"):
        return {"main": write_jsonl(where / "syn.jsonl", SYN)}
    if cmd == "bench-fetch":
        src = FIX / "tables" / "clients.jsonl"
        return {"main": Path(shutil.copy(src, where / src.name))}
    if cmd == "instruct-build":
        return {"main": write_jsonl(where / "tasks.jsonl", _instruct_rows())}
    if cmd == "run":
        # a real dataset; a public source of two texts stops the run at its first 'popri gen'
        # (after it wrote config.resolved.json, commands.sh and the validation embeddings)
        from popri.data.build import fetch
        from popri.specs.data import FetchSpec

        # the raw table beside ``where``: it is no input of the run (a run directory holding
        # it is refused: hostile-0.4 N10), only of the fetch that prepares data/
        table = write_jsonl(where.parent / f"{where.name}-table.jsonl", [
            {"user": f"u{i % 24}", "text": f"{SYN[i % len(SYN)]['text']} Note {i}."}
            for i in range(96)])  # 24 users: the validation and test splits are not empty
        fetch(str(table), str(where / "data"), FetchSpec(tokenizer="whitespace"),
              client_column="user")
        return {"main": write_jsonl(where / "public.jsonl", SYN[:2]), "data": where / "data"}
    raise KeyError(cmd)


def dir_argv(cmd: str, inp: dict, out, lm: str, st: str) -> list:
    main = inp["main"]
    if cmd == "run":
        return ["run", *(f"--set={kv}" for kv in (
            f"run_dir={out}", f"data.dir={inp['data']}", f"data.public_source={main}",
            f"generator.model={lm}", f"embedder={st}", "generator.bf16=false", "rounds=1",
            "score.sample_rate=null"))]
    return {
        "dpo": ["dpo", "--pairs", main, "--model", lm, "--out", out, "--max-steps", "1",
                "--batch-size", "2", "--no-bf16"],
        "sft": ["sft", "--pairs", main, "--model", lm, "--out", out, "--max-steps", "1",
                "--batch-size", "2", "--no-bf16"],
        "train-downstream": ["train-downstream", main, "--model", lm, "--out", out,
                             "--max-steps", "1", "--epochs", "1", "--batch-size", "4",
                             "--no-bf16"],
        "expand": ["expand", main, "-N", "2", "--shard-size", "2", "--model", lm,
                   "--max-new-tokens", "8", "--min-words", "1", "--no-bf16", "--allow-short",
                   "--out", out],
        "bench-fetch": ["bench", "fetch", main, "--client-column", "user", "--text-column",
                        "body", "--tokenizer", "whitespace", "--out", out],
        "instruct-build": ["instruct", "build", main, "--out", out],
    }[cmd]


#: files a user's directory holds that the command would write there too (the most hostile
#: foreign directory), besides notes.txt and sub/keep.bin
COLLIDING = {
    "dpo": {"metrics.json": '{"mine": true}\n', "adapter/adapter_config.json": '{"r": 1}\n'},
    "sft": {"metrics.json": '{"mine": true}\n', "adapter/adapter_config.json": '{"r": 1}\n'},
    "train-downstream": {"config.json": '{"mine": true}\n', "model.safetensors": "weights"},
    "expand": {"manifest.json": '{"mine": true}\n', "shard-00000.jsonl": '{"text": "mine"}\n'},
    "bench-fetch": {"train.jsonl": '{"text": "mine"}\n', "manifest.json": '{"mine": true}\n'},
    "instruct-build": {"train.jsonl": '{"text": "mine"}\n', "manifest.json": '{"mine": true}\n'},
    "run": {"commands.sh": "echo mine\n", "config.resolved.json": '{"mine": 1}\n'},
}
#: a user's directory that holds the file names an older popri always wrote there (the
#: ``legacy`` of outdir.is_ours): dpo/sft's run.json, a downstream model's metrics.json +
#: config.json (any transformers checkpoint saved with its metrics)
LOOKALIKE = {
    "dpo": {"run.json": '{"experiment": "mine"}\n'},
    "sft": {"run.json": '{"experiment": "mine"}\n'},
    "train-downstream": {"metrics.json": '{"acc": 0.9}\n', "config.json": '{"mine": true}\n'},
}
#: commands with a --force, and what their help says it does to a foreign directory
#: (train-downstream: "Replace a non-empty --out that popri wrote (a model of an earlier run); a
#: directory popri did not write is never replaced"; expand: "Start over when DIR holds another
#: expansion (its shards are removed)"; bench fetch / instruct build: "Write into a non-empty DIR
#: that is not a popri dataset")
FORCE = {"train-downstream": "replace-ours", "expand": "start-over", "bench-fetch": "write-into",
         "instruct-build": "write-into"}


def fill(d: Path, files: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "notes.txt").write_text("years of work\n")
    (d / "sub").mkdir()
    (d / "sub" / "keep.bin").write_bytes(bytes(range(256)))
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d


def make_target(kind: str, cmd: str, root: Path):
    """(inputs, out path, fifo or None) for a hostile target ``kind``."""
    user = root / "user"
    user.mkdir()
    fifo = None
    inp = dir_inputs(cmd, root / "in")
    if kind == "nonempty":
        out = fill(user / "precious", COLLIDING[cmd])
    elif kind == "nonempty-unrelated":
        out = fill(user / "precious", {})
    elif kind == "lookalike":
        out = fill(user / "precious", LOOKALIKE[cmd])
    elif kind == "file":
        out = user / "afile"
        out.write_text("my notes\n")
    elif kind == "fifo":
        fifo = Fifo(user / "full")
        out = fifo.path
    elif kind == "symlink":
        fill(user / "precious", {})
        out = user / "link"
        out.symlink_to(user / "precious", target_is_directory=True)
    elif kind == "symlink-empty":
        (user / "empty").mkdir()
        out = user / "link"
        out.symlink_to(user / "empty", target_is_directory=True)
    elif kind == "input":
        shutil.rmtree(root / "in")
        inp = dir_inputs(cmd, user / "holder")
        out = user / "holder"
    else:
        raise KeyError(kind)
    return inp, out, fifo


# --------------------------------------------------------------------------- directory outputs
DIR_CMDS = ["dpo", "sft", "train-downstream", "expand", "bench-fetch", "instruct-build", "run"]
TARGETS = ["nonempty", "file", "fifo", "symlink", "symlink-empty", "input"]
#: (cmd, target, force) -> why the case fails today (the report lists each with its reproduction)
XFAIL: dict = {}  # (cmd, target, force) -> why a case fails today; none does now
#: cases where writing INTO the directory is the command's documented behaviour, so exit 0 is
#: right as long as nothing pre-existing changed: a run directory that holds the run's own
#: inputs (a config or a prepared dataset kept beside the run)
WRITES_INTO = {("run", "input")}


def _dir_cases():
    for cmd in DIR_CMDS:
        kinds = TARGETS + (["lookalike"] if cmd in LOOKALIKE else []) + (
            ["nonempty-unrelated"] if cmd == "expand" else [])
        for kind in kinds:
            for force in ([False, True] if cmd in FORCE else [False]):
                marks = ()
                reason = XFAIL.get((cmd, kind, force))
                if reason:
                    marks = (pytest.mark.xfail(strict=True, reason=reason),)
                yield pytest.param(cmd, kind, force, marks=marks,
                                   id=f"{cmd}-{kind}" + ("-force" if force else ""))


@pytest.mark.parametrize("cmd,kind,force", list(_dir_cases()))
def test_directory_output_keeps_what_it_did_not_write(cmd, kind, force, tiny_lm, tiny_st_model,
                                                      tmp_path, run_popri):
    inp, out, fifo = make_target(kind, cmd, tmp_path)
    before = snap(tmp_path)
    try:
        p = run_popri([*dir_argv(cmd, inp, out, tiny_lm, tiny_st_model),
                       *(["--force"] if force else [])])
        after = snap(tmp_path)
        if fifo is not None:
            assert fifo.written() == b"", "the command wrote into the FIFO"
    finally:
        if fifo is not None:
            fifo.close()
    what = FORCE.get(cmd) if force else None
    if what == "write-into" and kind in ("nonempty", "nonempty-unrelated"):
        # bench fetch / instruct build --force: "Write into a non-empty DIR that is not a popri
        # dataset": its train/val/test.jsonl and manifest.json there are replaced, nothing else
        assert p.returncode == 0, p.stderr[-3000:]
        m = json.loads((out / "manifest.json").read_text())
        assert m["format"] == "popri-federated-dataset"
        rel_out = os.path.relpath(out, tmp_path)
        theirs = {os.path.join(rel_out, f) for f in COLLIDING[cmd]} if kind == "nonempty" else set()
        assert changed(before, after, lambda rel: rel not in theirs) == {}
        return
    # every pre-existing thing is unchanged, whatever else happened
    assert changed(before, after) == {}
    if (cmd, kind) in WRITES_INTO:
        # not refused (the run cases stop at their first gen on purpose: exit 1 after the
        # run's own files are written), and nothing pre-existing changed (checked above)
        assert p.returncode != 2, p.stderr[-3000:]
        return
    if what in ("write-into", "start-over") and p.returncode == 0:
        # a --force that writes into a directory (bench fetch, instruct build, expand) may
        # add files through a link or next to an input; it deleted and altered nothing
        return
    # refused before anything is read or written: one line, nothing new
    one_line_error(p)
    assert added(before, after) == []


# --------------------------------------------------------------------------- file outputs
OUT = "{OUT}"  # where the case's output option goes


def _ds(d: Path) -> Path:
    """A federated dataset directory (train/val/test.jsonl + manifest.json)."""
    d.mkdir(parents=True)
    for split, n in (("train", 8), ("val", 4), ("test", 4)):
        write_jsonl(d / f"{split}.jsonl", [{"id": f"{split}{i}", "client_id": f"c{i % 4}",
                                            "text": SYN[i % len(SYN)]["text"]}
                                           for i in range(n)])
    (d / "manifest.json").write_text(json.dumps({"format": "test"}) + "\n")
    return d


def _emb(d: Path, name: str, n: int, clients: bool, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    return Path(emb_set(d / f"{name}.npy", rng.normal(size=(n, 8)).astype(np.float32),
                        [f"c{i % 4}" for i in range(n)] if clients else None))


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """A real per-client upload (``popri score --per-client-out``) for ``popri aggregate``."""
    from conftest import _run

    d = tmp_path_factory.mktemp("uploads")
    priv, syn = _emb(d, "priv", 8, True, 0), _emb(d, "syn", 3, False, 1)
    _run(["score", "--private", priv, "--synthetic", syn, "-z", "1", "--seed", "0",
          "--per-client-out", d / "clients.npy"], check=True)
    return d / "clients.npy"


def file_case(name: str, root: Path, lm: str, st: str, uploads: Path):
    """(argv with OUT, the input that (b) writes over) of the file-output case ``name``, its
    inputs written under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    work = root.parent / "work"
    cmd, _, opt = name.partition(":")
    if cmd in ("gen", "vary", "embed", "expand"):
        texts = write_jsonl(root / "texts.jsonl", SYN)
    if cmd == "embed":  # (b): NAME.npy's sidecar NAME.jsonl is the input
        return ["embed", texts, "--model", st, "--no-cache", "--out", OUT], root / "texts.npy"
    if cmd == "gen":
        base = ["gen", texts, "-K", "2", "-J", "2", "--model", lm, "--max-new-tokens", "8",
                "--no-bf16"]
        return [*base, opt, OUT], texts
    if cmd == "vary":
        base = ["vary", texts, "--method", "paraphrase", "--model", lm, "--max-new-tokens", "8",
                "--min-words", "0", "--no-bf16"]
        if opt == "--lookahead-out":  # (b): SET.npy's sidecar SET.jsonl is the input
            return ([*base, "--lookahead", "2", "--embedder", st, "--lookahead-out", OUT],
                    root / "texts.npy")
        return [*base, opt, OUT], texts
    if cmd == "expand":
        return (["expand", texts, "-N", "2", "--shard-size", "2", "--model", lm,
                 "--max-new-tokens", "8", "--min-words", "1", "--no-bf16", "--allow-short",
                 "--out", work / "x", "--merged-out", OUT], texts)
    if cmd == "score":
        priv, syn = _emb(root, "priv", 8, True, 0), _emb(root, "syn", 3, False, 1)
        base = ["score", "--private", priv, "--synthetic", syn, "-z", "1", "--seed", "0"]
        if opt == "--ledger":
            return [*base, "--out", work / "s.npy", "--ledger", OUT], priv
        return [*base, opt, OUT], (priv if opt == "--out" else syn)
    if cmd == "aggregate":
        for f in (uploads, uploads.with_suffix(".json")):
            shutil.copy(f, root / f.name)
        return ["aggregate", root / "clients.npy", "--out", OUT], root / "clients.npy"
    if cmd == "pe-init":
        pub = write_jsonl(root / "public.jsonl", SYN)
        return ["pe", "init", pub, "--num", "3", "--out", OUT], pub
    if cmd == "pe-draw":
        from popri.core.io import save_scores

        pop = write_jsonl(root / "pop.jsonl", [{"id": f"r1-p{i}", "text": r["text"]}
                                               for i, r in enumerate(SYN[:4])])
        save_scores(root / "h.npy", np.array([0, 2, 1, 0], dtype=np.float32),
                    {"ids": [f"r1-p{i}" for i in range(4)], "mode": "nn-histogram"})
        return (["pe", "draw", "--population", pop, "--scores", root / "h.npy", "--num", "3",
                 opt, OUT], pop)
    if cmd == "pe-seeds":
        s1 = write_jsonl(root / "s1.jsonl", [{"id": "r1-s0", "round": 1, "text": "a b c"}])
        s2 = write_jsonl(root / "s2.jsonl", [{"id": "r2-s0", "round": 2, "text": "d e f"}])
        return ["pe", "seeds", s1, s2, "--out", OUT], s2
    if cmd == "prefs":
        from popri.core.io import save_scores

        S = [{"id": f"s{j}", "prompt_id": "p0", "sample_idx": j, "prompt": "P", "text": f"t{j}"}
             for j in range(3)]
        sp = write_jsonl(root / "samples.jsonl", S)
        save_scores(root / "s.npy", np.array([1, 3, 2], dtype=np.float32),
                    {"ids": [s["id"] for s in S]})
        return (["prefs", "build", "--samples", sp, "--scores", root / "s.npy",
                 "--rejected-rank", "2", opt, OUT], sp)
    if cmd == "eval-accuracy":
        ds = _ds(root / "ds")
        return (["eval", "accuracy", "--model", lm, "--data", ds, "--no-bf16", "--bootstrap",
                 "0", "--per-client-out", OUT], ds / "test.jsonl")
    if cmd == "eval-instruct":
        f = write_jsonl(root / "tasks.jsonl", [{**r, "input": ""} for r in _instruct_rows()[:6]])
        return (["eval", "instruct", "--model", lm, "--data", f, "--no-bf16", "--no-generate",
                 "--bootstrap", "0", "--per-client-out", OUT], f)
    if cmd == "audit-extract":
        f = write_jsonl(root / "train.jsonl", [{"id": f"c{i}#0", "client_id": f"c{i}",
                                                "text": r["text"]} for i, r in enumerate(SYN)])
        return (["audit", "extract", "--model", lm, "--data", f, "-n", "2", "--prefix-tokens",
                 "5", "--suffix-tokens", "4", "--no-bf16", "--out", OUT], f)
    if cmd == "fred-stats":
        priv = _emb(root, "priv", 8, True, 0)
        return ["fred", "stats", "--private", priv, "--non-private", "--out", OUT], priv
    raise KeyError(name)


#: every file output: the case name "command[:option]" and the name a user's directory gets
FILE_OUTPUTS = {
    "embed": "emb.npy",
    "gen:--out": "samples.jsonl", "gen:--prompts-out": "prompts.jsonl",
    "gen:--stats-out": "stats.json",
    "vary:--out": "var.jsonl", "vary:--lookahead-out": "la.npy", "vary:--stats-out": "st.json",
    "expand:--merged-out": "merged.jsonl",
    "score:--out": "s.npy", "score:--per-client-out": "pc.npy", "score:--ledger": "L",
    "aggregate": "agg.npy",
    "pe-init": "pop.jsonl", "pe-draw:--out": "surv.jsonl", "pe-draw:--stats-out": "st.json",
    "pe-seeds": "seeds.jsonl",
    "prefs:--out": "pairs.jsonl", "prefs:--report-out": "report.json",
    "eval-accuracy": "per.jsonl", "eval-instruct": "per.jsonl",
    "audit-extract": "rows.jsonl",
    "fred-stats": "st.npz",
}
FILE_XFAIL: dict = {}  # (case, target) -> why a case fails today; none does now
#: file outputs found to be a directory only when written, after the work (stderr carries its
#: progress before the error line)
LATE = {"eval-accuracy", "eval-instruct", "audit-extract", "fred-stats", "expand:--merged-out"}


def _file_cases():
    for name in FILE_OUTPUTS:
        for target in ("user-dir", "input"):
            reason = FILE_XFAIL.get((name, target))
            yield pytest.param(name, target, id=f"{name.replace(':--', '-')}-{target}", marks=(
                (pytest.mark.xfail(strict=True, reason=reason),) if reason else ()))


@pytest.mark.parametrize("name,target", list(_file_cases()))
def test_file_output_keeps_what_it_did_not_write(name, target, tiny_lm, tiny_st_model, uploads,
                                                 tmp_path, run_popri):
    argv, inp = file_case(name, tmp_path / "in", tiny_lm, tiny_st_model, uploads)
    user = tmp_path / "user"
    user.mkdir()
    if target == "user-dir":
        out = fill(user / FILE_OUTPUTS[name], {})
        if name == "score:--ledger":  # DIR/ledger.jsonl is a user's directory
            out = user / "L"
            fill(out / "ledger.jsonl", {})
    else:
        out = inp
    before = snap(tmp_path)
    p = run_popri([out if a == OUT else a for a in argv])
    after = snap(tmp_path)
    assert changed(before, after) == {}
    one_line_error(p, early=not (target == "user-dir" and name in LATE))
    # nothing new among the user's files or the inputs (work/ holds the command's other
    # outputs, e.g. expand's shards before --merged-out is found to be a directory)
    new = [a for a in added(before, after) if a.split(os.sep)[0] != "work"]
    assert new == [], new
