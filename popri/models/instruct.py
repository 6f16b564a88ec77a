"""Instruction examples as token sequences, and greedy text continuations: shared by FewFedPIT's
stages (:mod:`popri.methods.fewfedpit.client`) and ``popri eval instruct``
(:mod:`popri.eval.instruct`).

    python -c "from popri.models.instruct import encode; help(encode)"

An example (instruction, input, output) is ``[BOS] + the Alpaca prompt
(:func:`popri.data.instruct.prompt`) + the response + EOS``; the loss and the token accuracy are
on the response and EOS only.
"""

from __future__ import annotations

from typing import Sequence

from popri.data.instruct import prompt
from popri.models.llm import autocast


def encode(tok, examples: Sequence[dict], max_length: int) -> list[tuple[list[int], int]]:
    """Each example -> (ids, n_prompt): [BOS] + Alpaca prompt + response + EOS, the prompt cut
    from the left so the response fits; the loss is on ids[n_prompt:] (response + EOS)."""
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    out = []
    for e in examples:
        y = tok(e["output"].strip(), add_special_tokens=False)["input_ids"] + eos
        y = y[: max_length - len(bos) - 1]
        p = tok(prompt(e["instruction"], e.get("input") or ""), add_special_tokens=False)["input_ids"]
        p = bos + p[max(0, len(p) - (max_length - len(bos) - len(y))):]
        out.append((p + y, len(p)))
    return out


def greedy_texts(model, tok, prompts: Sequence[str], max_new_tokens: int, *, device: str,
                 bf16: bool, batch_size: int = 8, stop: str | None = None) -> list[str]:
    """Greedy continuations of text prompts (left-padded batches, BOS first when the tokenizer
    has one), cut at ``stop`` when given."""
    import torch

    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = [""] * len(prompts)
    enc = [bos + tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    for s in range(0, len(enc), batch_size):
        seqs = enc[s: s + batch_size]
        width = max(len(x) for x in seqs)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in seqs], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in seqs], device=device)
        with torch.no_grad(), autocast(device, bf16):
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=pad)
        for j in range(len(seqs)):
            t = tok.decode(gen[j, width:], skip_special_tokens=True)
            out[s + j] = t.split(stop)[0] if stop else t
    return out
