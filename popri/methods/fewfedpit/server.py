"""FewFedPIT's server step: the n_k-weighted average of the clients' uploads (Algorithm 1, lines
12-14), one ledger entry per round, and the global model for evaluation.

    popri fewfedpit aggregate R1/c1/mixed R1/c2/mixed --round 1 --init R0 --out R1/global

"FewFedPIT" (arXiv:2403.06131) has no DP guarantee: it is an empirical defence against
training-data extraction (section 4.3).  The round still goes through popri's release protocol
(:class:`popri.privacy.release.Release`): its ledger entry is a Gaussian release with noise
multiplier 0, which every accountant totals as eps = inf, so ``popri account`` states "no DP
guarantee" instead of leaving the round out.

popri extension (not in the paper), ``--clip C --noise-multiplier z``: each upload's update
W^a_k - W^g_{r-1} is clipped to C on the client (``fewfedpit mix --clip``; the server refuses
an upload above C), the server adds
N(0, z^2 C^2) to their sum (release mode: the discrete Gaussian on a grid) and divides by the
number of uploads K when K of N clients were drawn (a public count there: q = K / N is in the
ledger, ``--clients-total N``), by the declared ``--public-clients N`` when everyone took part
(the count of uploads is private then: :func:`popri.federated.aggregation.public_count`) -- uniform weights, since
n_k-weights would let one client's data size move the average beyond C -- and the ledger gets
``subsampled_gaussian`` at q = K / N.  Local
training is still not DP within a client round; the guarantee is client-level, for the
uploaded weights.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core import log, outdir
from popri.core.artifacts import path_digest
from popri.core.errors import InputError
from popri.federated.aggregation import public_count
from popri.federated.updates import add_noise, set_flat
from popri.methods.fewfedpit import client as C
from popri.methods.fewfedpit.weights import WeightedSum
from popri.models import llm
from popri.privacy.entries import gaussian
from popri.privacy.relations import round_relation
from popri.privacy.release import NOT_PRIVATE, Release
from popri.specs.fewfedpit import FewFedPITSpec
from popri.specs.fl import FLSpec

ROUND = "round.json"
LEDGER_STAGE = "fewfedpit"
NO_DP = "no DP guarantee (eps = inf): FewFedPIT is an empirical defence against extraction"


def aggregate(uploads: Sequence[str], out: str, spec: FewFedPITSpec, *, round_: int,
              init: str, clients_total: int | None = None,
              public_clients: int | None = None, delta: float = 3e-6,
              release: bool = False, device: str | None = None,
              diagnostics: bool = False) -> dict:
    """Average the ``uploads`` (mixed weights directories of round ``round_``) into the global
    weights directory ``out`` (with ``model/``), one ledger entry in ``OUT/../ledger.jsonl``.
    Release mode writes no count of the round's clients or their examples and no update norm
    (round.json's ``private_diagnostics``, NOT PRIVATE, only with ``diagnostics``)."""
    t0 = time.perf_counter()
    if not uploads:
        raise InputError("no uploads to aggregate", field="UPLOADS")
    C.check_out(out, init, *uploads)
    device = device or llm.default_device()
    C.check_round(init, round_)
    m, tok, params, theta_g, base, gstate = C.global_weights(init, spec, device)
    seed = int(gstate["seed"])
    acc, uniform = WeightedSum(), WeightedSum()
    seen, n_k, norms = set(), [], []
    for u in uploads:
        theta, st = C.read_state(u, ("mixed",))
        if st.get("round") != round_:
            raise InputError(f"holds round {st.get('round')}, expected {round_}", path=u,
                             field="round")
        if st.get("client") in seen:
            raise InputError(f"client {st.get('client')!r} uploaded twice", path=u, field="client")
        seen.add(st.get("client"))
        if theta.shape != theta_g.shape:
            raise InputError(f"has {theta.size} weights, the global model {theta_g.size}", path=u)
        n = int(st.get("n_examples") or 0)
        if n <= 0:
            raise InputError("records no examples (n_k)", path=u, field="n_examples")
        n_k.append(n)
        acc.add(theta, n)
        if spec.clip is not None:  # `fewfedpit mix --clip` clipped it on the client
            d = theta.astype(np.float64) - theta_g.astype(np.float64)
            nrm = float(np.linalg.norm(d))
            if nrm > spec.clip * (1 + 1e-4) + 1e-7:
                raise InputError(f"update norm {nrm:.6g} is above --clip {spec.clip:g}: mix it "
                                 "with the same --clip", path=u, field="clip")
            norms.append(nrm)
            uniform.add(d, 1.0)
    z = float(spec.noise_multiplier)
    out_p = Path(out)
    ledger = out_p.parent / "ledger.jsonl"
    K = len(n_k)
    if clients_total is not None and public_clients is not None:
        raise InputError("give --clients-total N (K of N drawn) or --public-clients N (everyone "
                         "takes part), not both", field="public_clients")
    N = clients_total or public_clients or K
    if N < K:
        raise InputError(f"{K} uploads but --clients-total {N}", field="clients_total")
    private = z > 0
    # the scheme is what the operator declares, never read off the count of uploads: K of a
    # declared N drawn (fixed, q = K / N), or everyone (none; the mean divides by N_pub)
    sampling = "fixed" if private and clients_total is not None else "none"
    # K of N clients drawn without replacement: replace one client, the clipped updates' sum
    # moves by 2C under it (popri.privacy.relations); everyone: add/remove, C
    relation, sens = round_relation(spec.sensitivity, sampling, spec.convention)
    with Release(LEDGER_STAGE, seed * 100_003 + round_, secure=release, ledgers=[ledger]) as rel:
        rel.check_ledgers()
        if spec.clip is not None:
            fl = FLSpec(algorithm="fedavg", clip=float(spec.clip))
            noisy, z_eff = add_noise(uniform.total, fl, z, round_, rel, seed, sensitivity=sens)
            # a PUBLIC divisor (aggregation.public_count): K = L of N under fixed sampling
            # (q = K / N is in the ledger, replace-one neighbours keep K); with everyone the
            # declared --clients-total, never the count of uploads (private under add/remove)
            div = public_count(sampling, sample_rate=K / N,
                               clients_per_round=K if sampling == "fixed" else None,
                               public_clients=public_clients,
                               what="the noisy sum of the clipped updates") if private else K
            new = (theta_g.astype(np.float64) + noisy / div).astype(np.float32)
            weights = "uniform (clipped updates)"
        else:
            new, z_eff = acc.average(), 0.0
            weights = "n_k / sum n"
        rid = rel.release_id(round_, sorted(path_digest(Path(u) / C.THETA) for u in uploads),
                             spec.to_dict(), path_digest(Path(init) / C.THETA), base)
        # release mode: the number of uploads K is the round's participant count, private
        # under add/remove-one-client neighbours; the accountant needs only q
        info = {"round": round_, "method": spec.mode,
                **({} if release else {"clients": K}), **({} if private else {"note": NO_DP})}
        entry = gaussian(LEDGER_STAGE, noise_multiplier=float(z_eff),
                         sample_rate=K / N if private else 1.0, delta=delta,
                         sensitivity=sens, sampling=sampling, neighbouring=relation,
                         release_id=rid, mode=rel.mode, params=info)
        rel.outputs = outdir.DirOutput(out_p, kind="fewfedpit-global", legacy=C.WEIGHTS_FILES)
        tmp = rel.outputs.tmp
        set_flat(params, new)
        state = {"kind": "global", "round": round_, "client": None, "base_model": str(base),
                 "lora": C.lora_settings(spec), "mode": spec.mode, "seed": seed}
        C.stage_files(tmp, new, state, m, tok)
        summary = {"round": round_, "method": spec.mode, "beta": spec.beta_value(),
                   "weights": weights, "noise_multiplier": z, "clip": spec.clip,
                   "neighbouring": relation if private else None,
                   "sensitivity": sens if private else None,
                   "privacy": "client-level DP (popri extension), see the ledger" if private
                   else NO_DP, "mode": rel.mode, "release_id": rid, "base_model": str(base)}
        diag = {"private": False, "note": NOT_PRIVATE, "clients": K, "clients_total": N,
                "n_k": n_k, "update_norm_mean": float(np.mean(norms)) if norms else None,
                "uploads": [str(u) for u in uploads]}
        if not release or diagnostics:
            summary["private_diagnostics"] = diag
        (tmp / ROUND).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        rel.commit([entry])
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    who = "the uploads (count private in release mode)" if release and not diagnostics \
        else f"{K} clients"
    log.info(f"fewfedpit aggregate round {round_}: {who} ({weights}), "
             f"{'z ' + format(z, 'g') if private else NO_DP} -> {out}")
    return summary
