"""Privacy provenance (issue 66): every output's status derived from its inputs', the weakest
winning; not-dp refused in release mode and named wherever a total is printed.

    python -m pytest -q tests/test_provenance.py
"""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest

from conftest import emb_set, write_jsonl
from popri.core import provenance as P
from popri.specs.commands.flows import FLOWS

STATUSES = ("public", "dp", "not-dp", "private")


def _mark(path, prov: P.Provenance) -> None:
    """Give ``path`` a companion as popri writes it (the file's fingerprint included)."""
    p = str(path)
    P._write(P.companion(p) if os.path.isdir(p) else P.Path(p + P.SUFFIX), prov,
             of=None if os.path.isdir(p) else P.Path(p))


def _of(status: str) -> P.Provenance:
    return {"public": P.PUBLIC, "dp": P.dp(["rel-1"]), "not-dp": P.not_dp("x: a diagnostic"),
            "private": P.private("x: client data")}[status]


# --------------------------------------------------------------------------- the algebra
def test_the_weakest_status_wins_and_links_are_unioned():
    for a in STATUSES:
        for b in STATUSES:
            got = P.combine([_of(a), _of(b)])
            assert got.status == max(a, b, key=STATUSES.index)
    got = P.combine([P.dp(["a"]), P.dp(["b"]), P.not_dp("l1"), P.not_dp("l1", "l2")])
    assert got.status == "not-dp" and got.entries == ("a", "b") and got.links == ("l1", "l2")
    assert P.combine([]) == P.PUBLIC
    assert P.not_dp("why").words().startswith("NOT A DP GUARANTEE")
    assert P.dp(["a", "b"]).words() == "dp (2 ledger entries)"


def test_a_companion_that_does_not_match_its_file_reads_not_dp(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text('{"text": "a"}\n')
    _mark(f, P.dp(["r1"]))
    assert P.read(f) == P.dp(["r1"])
    os.utime(f, ns=(1, 1))  # touched (a copy without -p): same bytes, still trusted
    assert P.read(f) == P.dp(["r1"])
    f.write_text('{"text": "b"}\n')  # replaced after the companion was written
    got = P.read(f)
    assert got.status == "not-dp" and "changed since" in got.links[-1]
    # a user's file of the companion's name says nothing; unmarked counts as public
    g = tmp_path / "t.jsonl"
    g.write_text("{}\n")
    (tmp_path / "t.jsonl.provenance.json").write_text('{"mine": 1}')
    assert P.read(g) is None and P.status_of(g) == P.PUBLIC


def test_a_file_inside_a_marked_directory_takes_its_status(tmp_path):
    d = tmp_path / "dpo"
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "w.bin").write_bytes(b"x")
    _mark(d, P.not_dp("pairs: built from noise-free scores"))
    assert P.status_of(d / "adapter").status == "not-dp"
    assert P.status_of(d / "adapter" / "w.bin").status == "not-dp"


def test_a_diagnostic_sidecar_without_a_companion_is_not_dp(tmp_path):
    f = tmp_path / "exact.npy"
    np.save(f, np.zeros(3))
    (tmp_path / "exact.json").write_text(json.dumps({"diagnostic": True, "ids": ["a"]}))
    assert P.status_of(f).status == "not-dp"


# --------------------------------------------------------------------------- every flow x status
def _call(command: str, flow: P.Flow, tmp_path, status: str):
    """A stand-in call whose every input field names one marked file of ``status``."""
    vals = {}
    for name in flow.inputs:
        f = tmp_path / f"in-{name}.jsonl"
        f.write_text("{}\n")
        _mark(f, _of(status))
        vals[name] = [str(f)] if name in ("files", "uploads", "survivors") else str(f)
    for name in flow.outputs:
        vals[name] = str(tmp_path / f"out-{name}.jsonl")
    base = dict(command=command, diagnostic=False, noise_multiplier=1.0, convention=None,
                non_private=False, diagnostics=False, public=False, run_dirs=())
    return types.SimpleNamespace(**{**base, **vals})


@pytest.mark.parametrize("command", sorted(FLOWS))
@pytest.mark.parametrize("status", STATUSES)
def test_every_stage_derives_its_outputs_from_every_input_status(command, status, tmp_path):
    """The matrix of issue 66: each command with a flow x each status of its inputs.  A DP
    mechanism's inputs give dp whatever they are; a transform keeps private private; any
    other read of client data is not-dp; otherwise the input's status passes on."""
    flow = FLOWS[command]
    call = _call(command, flow, tmp_path, status)
    got = P.derive(flow, call, command)
    assert set(got) == {getattr(call, n) for n in flow.outputs}
    roles = set(flow.inputs.values())
    for name, deps in flow.outputs.items():
        prov = got[getattr(call, name)]
        if name in flow.private_out:
            assert prov.status == "private"
            continue
        used = {flow.inputs[d] for d in (flow.inputs if deps is None else deps)}
        if flow.source is not None and not flow.inputs:
            assert prov == flow.source(call)  # bench fetch / instruct build / report
            continue
        want = []
        for role in used:
            if role == "private":
                want.append(flow.mechanism(call).status)  # its own tests below
            elif role == "transform":
                want.append(status)
            else:
                want.append("not-dp" if status == "private" else status)
        expect = max(want, key=STATUSES.index) if want else "public"
        assert prov.status == expect, (command, name, status, prov)
        if expect == "not-dp":
            assert prov.links, prov
        if expect == "dp" and status == "dp" and "private" not in used:
            assert "rel-1" in prov.entries
    assert roles <= set(P.ROLES)


def test_the_mechanisms_say_when_they_are_no_guarantee():
    score = FLOWS["score"].mechanism
    base = dict(out="s.npy", diagnostic=False, noise_multiplier=1.0, convention=None)
    assert score(types.SimpleNamespace(**base)).status == "dp"
    for change, word in ((dict(diagnostic=True), "noise-free"),
                         (dict(noise_multiplier=0.0), "z = 0"),
                         (dict(convention="papers"), "not a DP guarantee")):
        got = score(types.SimpleNamespace(**{**base, **change}))
        assert got.status == "not-dp" and word in got.links[0], (change, got)
    fred = FLOWS["fred stats"].mechanism
    assert fred(types.SimpleNamespace(out="f.npz", non_private=True,
                                      noise_multiplier=None)).status == "not-dp"
    assert FLOWS["bench fetch"].source(types.SimpleNamespace(
        out="d", public=True, command="bench fetch")) == P.PUBLIC
    assert FLOWS["bench fetch"].source(types.SimpleNamespace(
        out="d", public=False, command="bench fetch")).status == "private"


# --------------------------------------------------------------------------- through the CLI
def _pipeline_inputs(tmp_path):
    rng = np.random.default_rng(0)
    priv = emb_set(tmp_path / "priv.npy", rng.normal(size=(12, 8)).astype(np.float32),
                   client_ids=[f"c{i % 4}" for i in range(12)])
    rows = [{"id": f"r1-p{p}-s{s}", "round": 1, "prompt_id": p, "sample_idx": s,
             "prompt": "P", "text": f"text {p} {s}", "model": "m"}
            for p in range(3) for s in range(6)]
    samples = write_jsonl(tmp_path / "samples.jsonl", rows)
    from popri.core.io import save_embedding_set

    syn = tmp_path / "syn.npy"
    save_embedding_set(str(syn), rng.normal(size=(len(rows), 8)).astype(np.float32),
                       [{"id": r["id"]} for r in rows], {"model": "test-model"})
    return priv, samples, syn


def test_diagnostic_scores_mark_everything_built_on_them(tmp_path, run_popri):
    """The issue's high case: `score -z 0 --diagnostic` then `prefs build` on those scores
    exited 0 with an unmarked pairs file and `account ledger` printed a plain epsilon.  Now the
    pairs are not-dp (research mode warns), release mode refuses, and the ledger total names
    the link."""
    priv, samples, syn = _pipeline_inputs(tmp_path)
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    r1.mkdir(), r2.mkdir()
    p = run_popri(["score", "--private", priv, "--synthetic", syn, "-z", "1.0", "--seed", "1",
                   "--out", r1 / "scores.npy"])
    assert p.returncode == 0, p.stderr
    ok = P.read(r1 / "scores.npy")
    assert ok.status == "dp" and len(ok.entries) == 1
    p = run_popri(["score", "--private", priv, "--synthetic", syn, "-z", "0", "--diagnostic",
                   "--out", r2 / "scores.npy"])
    assert p.returncode == 0, p.stderr
    assert P.read(r2 / "scores.npy").status == "not-dp"
    # post-processing of DP scores stays dp, with the release id
    p = run_popri(["prefs", "build", "--samples", samples, "--scores", r1 / "scores.npy",
                   "--out", r1 / "prefs.jsonl"])
    assert p.returncode == 0, p.stderr
    assert P.read(r1 / "prefs.jsonl").entries == ok.entries
    # research mode: propagated, and said
    p = run_popri(["prefs", "build", "--samples", samples, "--scores", r2 / "scores.npy",
                   "--out", r2 / "prefs.jsonl"])
    assert p.returncode == 0, p.stderr
    assert "NOT A DP GUARANTEE" in p.stderr and "noise-free" in p.stderr
    got = P.read(r2 / "prefs.jsonl")
    assert got.status == "not-dp" and any("noise-free" in x for x in got.links)
    # release mode: refused, nothing written
    out = r2 / "prefs-release.jsonl"
    p = run_popri(["prefs", "build", "--samples", samples, "--scores", r2 / "scores.npy",
                   "--out", out], env={"POPRI_RELEASE": "1"})
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "release mode" in p.stderr and "NOT A DP GUARANTEE" in p.stderr
    assert not out.exists() and not P.Path(str(out) + P.SUFFIX).exists()
    # account ledger of the directory names the link
    p = run_popri(["account", "ledger", tmp_path])
    assert p.returncode == 0, p.stderr
    assert "NOT A DP GUARANTEE" in p.stdout and "prefs.jsonl" in p.stdout, p.stdout
    p = run_popri(["account", "ledger", r1])
    assert "NOT A DP GUARANTEE" not in p.stdout + p.stderr
    # a diagnostic cannot go to a pipe, where no mark travels
    p = run_popri(["score", "--private", priv, "--synthetic", syn, "-z", "0", "--diagnostic",
                   "--out", "-"])
    assert p.returncode == 2 and "--diagnostic" in p.stderr and not p.stdout


def test_embedding_private_data_stays_private_and_a_failed_command_leaves_no_mark(
        tmp_path, run_popri):
    priv, samples, syn = _pipeline_inputs(tmp_path)
    _mark(samples, P.private("samples.jsonl: client data"))
    out = tmp_path / "pairs.jsonl"
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros(5))
    p = run_popri(["prefs", "build", "--samples", samples, "--scores", bad, "--out", out])
    assert p.returncode == 2
    assert not out.exists() and not P.Path(str(out) + P.SUFFIX).exists()


# --------------------------------------------------------------------------- where it prints
def test_runs_list_show_diff_say_not_a_dp_guarantee_and_name_the_link(tmp_path, run_popri):
    """The papers' convention showed as a plain `1 / 1` in `runs list` and `epsilon 1 1 =` in
    `runs diff` (issue 66); a release whose chain holds a not-dp link said nothing."""
    from test_runs import _fake_run

    plain = _fake_run(tmp_path / "runs" / "plain", 1.0, 0.30)
    conv = _fake_run(tmp_path / "runs" / "conv", 1.0, 0.30)
    cfg = json.loads((conv / "config.resolved.json").read_text())
    cfg["privacy"]["convention"] = "papers"
    (conv / "config.resolved.json").write_text(json.dumps(cfg))
    res = json.loads((conv / "results.json").read_text())
    res.update(dp_guarantee=False, guarantee="NOT A DP GUARANTEE (papers' convention)")
    (conv / "results.json").write_text(json.dumps(res))
    diag = _fake_run(tmp_path / "runs" / "diag", 1.0, 0.30)
    res = json.loads((diag / "results.json").read_text())
    res["release_provenance"] = {"path": str(diag / "synthetic.jsonl"), "status": "not-dp",
                                 "entries": [], "dp_guarantee": False,
                                 "links": ["r2/scores.npy: noise-free scores"]}
    (diag / "results.json").write_text(json.dumps(res))
    out = run_popri(["runs", "list", tmp_path / "runs"], check=True).stdout
    row = {ln.split()[0]: ln for ln in out.splitlines()[1:4]}
    assert "NOT A DP GUARANTEE" in row[str(conv)] and "NOT A DP GUARANTEE" in row[str(diag)]
    assert "NOT A DP GUARANTEE" not in row[str(plain)]
    assert "noise-free scores" in out and "'papers' convention" in out
    d = run_popri(["runs", "diff", plain, conv], check=True).stdout
    line = next(x for x in d.splitlines() if x.strip().startswith("dp_guarantee"))
    assert "yes" in line and "NOT A DP GUARANTEE" in line
    s = run_popri(["runs", "show", diag], check=True).stdout
    assert "NOT A DP GUARANTEE" in s and "noise-free scores" in s


# --------------------------------------------------------------------------- H08, I06
def test_a_users_file_inside_popris_output_survives_the_rerun(tmp_path):
    """Hostile case H08: `echo mine > runs/smoke/downstream/popri/mynote.txt` was deleted by
    the rerun that replaced the directory.  It is kept (and said); its provenance is not a
    user file."""
    from popri.core import outdir

    dest = tmp_path / "model"
    for n in (1, 2):
        tmp = outdir.staging_dir(dest)
        (tmp / "weights.bin").write_text(f"v{n}")
        outdir.replace(tmp, dest, kind="downstream-model")
        if n == 1:
            (dest / "mynote.txt").write_text("mine")
            (dest / "sub").mkdir()
            (dest / "sub" / "x.txt").write_text("mine too")
            _mark(dest, P.PUBLIC)
    assert (dest / "weights.bin").read_text() == "v2"
    assert (dest / "mynote.txt").read_text() == "mine"
    assert (dest / "sub" / "x.txt").read_text() == "mine too"
    assert outdir.foreign_files(dest) == ["mynote.txt", "sub/x.txt"]
    # a user's file of a name the new output writes is refused, not overwritten
    tmp = outdir.staging_dir(dest)
    (tmp / "mynote.txt").write_text("popri's")
    with pytest.raises(Exception, match="popri did not write"):
        outdir.replace(tmp, dest, kind="downstream-model")
    assert (dest / "mynote.txt").read_text() == "mine"


def test_an_unwritable_out_is_refused_before_any_work(tmp_path, run_popri):
    """Hostile case I06: `popri gen ... --out /dev/full` generated everything, then failed.
    Refused first, one line, whatever the model (it is never loaded)."""
    omega = write_jsonl(tmp_path / "omega.jsonl", [{"text": "a b c"}] * 4)
    p = run_popri(["gen", omega, "-K", "1", "-J", "2", "--model", "no-such-model",
                   "--out", "/dev/full"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "/dev/full: cannot write: No space left" in p.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("root writes into a read-only directory")
        p = run_popri(["gen", omega, "-K", "1", "-J", "2", "--model", "no-such-model",
                       "--out", ro / "s.jsonl"])
        assert p.returncode == 2 and "Permission denied" in p.stderr, p.stderr
    finally:
        ro.chmod(0o755)


def test_the_python_api_says_it_too(tmp_path):
    import popri
    from test_runs import _fake_run

    d = _fake_run(tmp_path / "runs" / "conv", 1.0, 0.30)
    res = json.loads((d / "results.json").read_text())
    res["release_provenance"] = {"path": "s.jsonl", "status": "not-dp", "entries": [],
                                 "links": ["x: a research read"], "dp_guarantee": False}
    (d / "results.json").write_text(json.dumps(res))
    with pytest.warns(UserWarning, match="NOT A DP GUARANTEE: x: a research read"):
        run = popri.load_run(str(d))
    assert run.guarantee == {"dp_guarantee": False, "links": ["x: a research read"]}


def test_a_report_of_research_runs_is_not_dp(tmp_path):
    from test_runs import _fake_run

    research = _fake_run(tmp_path / "runs" / "r", 1.0, 0.30)
    res = json.loads((research / "results.json").read_text())
    res["research_reads"] = ["the evaluation on the private test split"]
    (research / "results.json").write_text(json.dumps(res))
    release = _fake_run(tmp_path / "runs" / "rel", 1.0, 0.30)
    res = json.loads((release / "results.json").read_text())
    res.update(mode="release", release_provenance={"path": "s", "status": "dp",
                                                   "entries": ["id1"], "links": [],
                                                   "dp_guarantee": True})
    (release / "results.json").write_text(json.dumps(res))
    src = FLOWS["report"].source
    got = src(types.SimpleNamespace(run_dirs=[str(research), str(release)]))
    assert got.status == "not-dp" and "private test split" in got.links[0]
    assert src(types.SimpleNamespace(run_dirs=[str(release)])) == P.dp(["id1"])


def test_every_command_that_writes_a_file_has_a_flow():
    """A new command with an --out (or --X-out) file and no provenance flow would write
    unmarked files: it fails here until its flow is declared in popri/specs/commands/flows.py."""
    import dataclasses
    import importlib
    import pkgutil
    import typing

    import popri.specs.commands as pc
    from popri.core.spec import Call

    #: commands whose outputs are not the data's: a run directory of stage outputs (each stage
    #: marks its own), and the others' printed JSON (stdout)
    exempt = {"run"}
    missing = []
    for m in pkgutil.iter_modules(pc.__path__):
        mod = importlib.import_module(f"popri.specs.commands.{m.name}")
        for c in vars(mod).values():
            if not (isinstance(c, type) and issubclass(c, Call) and c is not Call
                    and c.command and c.__module__ == mod.__name__):
                continue
            hints = typing.get_type_hints(c)
            outs = [f.name for f in dataclasses.fields(c)
                    if (f.name == "out" or f.name.endswith("_out")) and f.name != "json_out"
                    and hints[f.name] in (str, typing.Optional[str], str | None)]
            if outs and c.command not in FLOWS and c.command not in exempt:
                missing.append((c.command, outs))
            for name in outs:
                if c.command in FLOWS:
                    assert name in FLOWS[c.command].outputs, (c.command, name)
    assert not missing, missing
