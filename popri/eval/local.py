"""A client's local update of the downstream model in a DP-FL round: the model with its LoRA
adapter, the client's texts framed as the downstream evaluation frames them
(:mod:`popri.eval.downstream`), ``local_epochs`` of SGD (batch 2, sequences of 64 tokens: POPri,
"Private Federated Learning using Preference-Optimized Synthetic Data", arXiv:2504.16438,
appendix C.1) and the clipped update theta_k - theta.  The round itself (sampling, the noisy
sum, the server step, the ledger) is popri/methods/dpfl/rounds.py; a Flower node runs
:func:`node_updates` (popri/apps/flower/node.py).

    popri fl round --data runs/x/data/private --round 1 --algorithm fedavg -z 1.2 \
        --clients-per-round 8 --seed 0 --out runs/x/fl/round1
"""

from __future__ import annotations

import numpy as np

from popri.core import runtime
from popri.eval.downstream import (
    count_targets,
    encode,
    load_model,
    make_batch,
    padding_id,
    special_ids,
    token_stats,
)
from popri.federated.participation import factorize
from popri.federated.updates import clip, flat, set_flat, trainable
from popri.models import llm
from popri.models.lora import lora_config
from popri.specs.fl import FLSpec


def build_model(model: str, spec: FLSpec, seed: int, device: str):
    """(model, tokenizer, trainable params): the base model, with a LoRA adapter initialised
    from ``seed`` (A random, B = 0: theta_0 is the base model) unless ``spec.lora`` is off."""
    torch = runtime.configure_torch()

    torch.manual_seed(seed)
    m, tok = load_model(model, device=device)
    if getattr(m, "peft_config", None):
        m = m.merge_and_unload()
    if spec.lora:
        from peft import get_peft_model


        torch.manual_seed(seed)
        m = get_peft_model(m, lora_config(m, spec))
    else:
        for p in m.parameters():
            p.requires_grad_(True)
    return m, tok, trainable(m)


def client_rng(seed: int, round_: int, client_id: str) -> np.random.Generator:
    """The data order (and cap) of one client's local training in round t: a function of the
    run's seed, the round and the client id alone, so a client trains the same way in-process
    and on any Flower node (not a privacy-relevant choice: the noise and the sampling have
    their own streams)."""
    import zlib

    return np.random.default_rng([int(seed), int(round_), zlib.crc32(str(client_id).encode()),
                                  0x464C])


def cap_texts(texts: list[str], spec: FLSpec, rng) -> list[str]:
    """At most ``spec.max_samples_per_client`` of a client's texts (seeded choice)."""
    m = spec.max_samples_per_client
    if m and len(texts) > m:
        keep = rng.choice(len(texts), m, replace=False)
        return [texts[i] for i in sorted(keep)]
    return list(texts)


def prepare_tokenizer(tok, spec: FLSpec) -> int:
    """Frame texts as the downstream evaluation does (START / EOS of
    :func:`popri.eval.downstream.special_ids`), recorded in the tokenizer; returns the pad id."""
    start, eos = special_ids(tok, spec.bos_token, spec.eos_token)
    pad = padding_id(tok)
    tok.bos_token = tok.convert_ids_to_tokens(start)
    if eos is not None:
        tok.eos_token = tok.convert_ids_to_tokens(eos)
    return pad


def node_updates(settings: dict, theta, texts, client_ids, rng, *, round_seed: int):
    """A Flower node's side of a DP-FL round (:mod:`popri.apps.flower.node`): for each of
    its clients (first-appearance order) the update from the global weights ``theta`` on its
    ``texts``, clipped to C, as float64 -- one at a time.  ``rng`` (the node's noise stream) is
    not used: the data order is :func:`client_rng`'s, as in-process, from the round's seed
    ``round_seed`` (:func:`popri.kit.round_seed` of the run's seed and the round)."""
    spec = FLSpec.from_dict(settings["fl"])
    device = llm.default_device()
    m, tok, params = build_model(settings["base"], spec, int(settings["seed"]), device)
    pad = prepare_tokenizer(tok, spec)
    theta = np.asarray(theta, dtype=np.float32)
    codes, clients = factorize(list(client_ids))
    for c, cid in enumerate(clients):
        ts = [texts[i] for i in np.flatnonzero(codes == c)]
        d, _ = local_update(m, params, theta, encode_client(tok, ts, spec), spec,
                            client_rng(round_seed, int(settings["round"]), cid), pad, device)
        d, _ = clip(d, spec.clip)
        yield d.astype(np.float64)


def encode_client(tok, texts, spec: FLSpec):
    return encode(tok, texts, spec.max_length, bos_token=spec.bos_token, eos_token=spec.eos_token)


def local_update(model, params, theta: np.ndarray, seqs, spec: FLSpec, rng, pad: int,
                 device: str) -> tuple[np.ndarray, dict]:
    """Client k's update theta_k - theta from ``local_epochs`` of SGD on its sequences."""
    import torch


    set_flat(params, theta)
    opt = torch.optim.SGD(params, lr=spec.client_lr)
    model.train()
    loss_sum, n_tok, steps = 0.0, 0, 0
    for _ in range(spec.local_epochs):
        perm = rng.permutation(len(seqs))
        for s in range(0, len(perm), spec.client_batch_size):
            chunk = [seqs[i] for i in perm[s:s + spec.client_batch_size]]
            n = count_targets(chunk, spec.count_eos)
            if n == 0:
                continue
            opt.zero_grad(set_to_none=True)
            _, _, ce, loss = token_stats(model, *make_batch(chunk, pad, spec.count_eos),
                                         bf16=spec.bf16, device=device)
            (loss / n).backward()
            opt.step()
            loss_sum += float(ce.sum())
            n_tok += n
            steps += 1
    model.eval()
    delta = flat(params) - theta
    return delta, {"loss": loss_sum / n_tok if n_tok else None, "steps": steps, "tokens": n_tok}
