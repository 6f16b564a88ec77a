"""The instruction-following score of a candidate under a client's local model (FewFedPIT 3.3).

    python -c "from popri.methods.fewfedpit.ifs import response_losses; help(response_losses)"

"FewFedPIT" (arXiv:2403.06131), section 3.3: IFS = L(y|x) / L(y), with L the mean cross-entropy
of the response tokens y under the local model M^l, once after the prompt x (instruction and
input in the Alpaca template, :func:`popri.data.instruct.prompt`) and once without it.  Both
losses score exactly the same tokens: the response's tokens and an end-of-sequence token, after
the prompt or after the tokenizer's BOS token (its EOS token where it has no BOS: a document
boundary), so the ratio compares like with like.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _context_ids(tok) -> list[int]:
    t = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if t is None:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token")
    return [int(t)]


def response_losses(model, tok, prompts: Sequence[str], responses: Sequence[str],
                    max_length: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(L(y|x), L(y)) per pair: the mean negative log-likelihood (nats) of the response tokens
    + EOS, after ``prompt`` and after the BOS/EOS context alone.  The response is tokenised on
    its own (the same ids in both), the prompt cut from the left to fit ``max_length``."""
    import torch

    dev = next(model.parameters()).device
    ctx = _context_ids(tok)
    eos = tok.eos_token_id
    cond, uncond = [], []
    model.eval()
    with torch.no_grad():
        for p, y in zip(prompts, responses):
            y_ids = tok(y, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
            y_ids = y_ids[: max_length - 1]
            p_ids = tok(p, add_special_tokens=False)["input_ids"]
            p_ids = (ctx + p_ids)[-(max_length - len(y_ids)):] if p_ids else ctx
            losses = []
            for pre in (p_ids, ctx):
                ids = torch.tensor([pre + y_ids], device=dev)
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                pos = torch.arange(len(pre) - 1, len(pre) + len(y_ids) - 1, device=dev)
                tgt = ids[0, len(pre):]
                losses.append(float(-logp[pos, tgt].mean()))
            cond.append(losses[0])
            uncond.append(losses[1])
    return np.asarray(cond), np.asarray(uncond)
