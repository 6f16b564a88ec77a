"""FewFedPIT's self-generation filters: prompts, parsing, format, Rouge-L novelty and copy filters,
and the instruction-following score (IFS) selection.

    python -c "from popri.methods.fewfedpit import filters as F; print(F.rouge_l('a b c', 'a c'))"

"FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning"
(arXiv:2403.06131), section 3.3 and Algorithm 1, line 7 (SynGen):

1. new instructions from 8 random local instructions (the global model, greedy decoding);
   :func:`parse_instructions` reads its numbered list;
2. format filter (:func:`format_ok`): drop instructions starting "As a ..." / "sorry ..." or too
   short;
3. novelty: drop an instruction whose Rouge-L to any local instruction exceeds 0.7, until 2M
   remain (:func:`novel_instructions`; the Self-Instruct filter, Wang et al. 2023,
   arXiv:2212.10560, section 2.3);
4. input + response from a 4-shot prompt whose demonstrations alternate with and without an
   input, ``[Input]`` / ``[Response]`` prefixes (:func:`io_prompt`, :func:`parse_io`), at most 3
   tries with fresh demonstrations;
5. copy filter (:func:`copy_filter`): drop a sample whose Rouge-L to a local example exceeds 0.7
   (also keeps verbatim private text out of the synthetic set);
6. IFS (:func:`ifs`, :func:`select_top`): the client's local model scores each candidate,
   IFS = L(y|x) / L(y), the mean response-token loss with the prompt over without it; the M
   candidates whose prompt helps most (lowest IFS) are kept (paper: 32 -> 16).  The highest
   ratio is IFD selection (Li et al. 2023, "From Quantity to Quality", arXiv:2308.12032), which
   FewFedPIT 4.4 finds worst.

The paper's prompt texts are a figure (appendix B); the prompts here are popri's own, in the
spirit of Self-Instruct's public prompt.  Rouge-L is the ``rouge-score`` package's (F-measure,
its default tokenizer: lower-cased alphanumeric tokens, no stemming).

Pure Python + rouge-score: no torch.
"""

from __future__ import annotations

import re
from typing import Sequence

#: Rouge-L above which a candidate counts as a copy of local data (FewFedPIT 3.3)
ROUGE_THRESHOLD = 0.7

from popri.eval.rouge import max_rouge_l, rouge_l  # noqa: F401  (re-exported)


# --------------------------------------------------------------------------- prompts
def instruction_prompt(demos: Sequence[str]) -> str:
    """Prompt for new instructions: the local instructions as a numbered list, the model
    continues with the next number (popri's wording)."""
    lines = ["Here is a list of tasks a user asked an assistant to do. Write new tasks of the "
             "same kind: different topics, one per line, each a complete instruction.", ""]
    lines += [f"{i}. {' '.join(d.split())}" for i, d in enumerate(demos, 1)]
    lines.append(f"{len(demos) + 1}.")
    return "\n".join(lines)


def parse_instructions(generated: str, first: int) -> list[str]:
    """Instructions from the continuation of :func:`instruction_prompt`: the text up to the
    first newline is item ``first``, then every ``N. text`` line; blank items dropped."""
    out = []
    lines = generated.split("\n")
    head = lines[0].strip()
    if head:
        out.append(head)
    for ln in lines[1:]:
        m = re.match(r"\s*(\d+)\s*[.)]\s*(.*)$", ln)
        if m and m.group(2).strip():
            out.append(m.group(2).strip())
    return [" ".join(o.split()) for o in out]


def io_prompt(demos: Sequence[dict], instruction: str) -> str:
    """4-shot prompt for an input and a response to ``instruction``: each demonstration is
    ``Instruction: ...`` then ``[Input] ...`` (when it has one) and ``[Response] ...``."""
    parts = ["Complete the last task the way the examples do. Give the input the task needs "
             "after [Input] (or write [Input] none), then the answer after [Response].", ""]
    for d in demos:
        parts.append(f"Instruction: {d['instruction'].strip()}")
        parts.append(f"[Input] {d['input'].strip() if d.get('input') else 'none'}")
        parts.append(f"[Response] {d['output'].strip()}")
        parts.append("")
    parts.append(f"Instruction: {instruction.strip()}")
    parts.append("[Input]")
    return "\n".join(parts)


def alternate_demos(pool: Sequence[dict], k: int, rng) -> list[dict]:
    """``k`` demonstrations drawn by ``rng`` (random.Random), half with an input and half
    without, placed alternately (FewFedPIT 3.3); falls back to any when one kind runs out."""
    with_in = [d for d in pool if (d.get("input") or "").strip()]
    without = [d for d in pool if not (d.get("input") or "").strip()]
    rng.shuffle(with_in)
    rng.shuffle(without)
    out = []
    for i in range(k):
        first, second = (with_in, without) if i % 2 == 0 else (without, with_in)
        src = first if first else second
        if not src:
            break
        out.append(src.pop())
    return out


def parse_io(generated: str) -> tuple[str, str] | None:
    """(input, response) from the continuation of :func:`io_prompt` (which ends in
    ``[Input]``), or None when the ``[Response]`` prefix is missing or the response is empty.
    The response ends at the next ``Instruction:`` line or ``[Input]`` prefix."""
    if "[Response]" not in generated:
        return None
    inp, _, resp = generated.partition("[Response]")
    resp = re.split(r"\n\s*Instruction:|\[Input\]", resp)[0].strip()
    inp = inp.strip()
    if inp.lower().rstrip(".") in ("none", "no input", "n/a", ""):
        inp = ""
    if not resp:
        return None
    return inp, resp


# --------------------------------------------------------------------------- filters
_BAD_START = re.compile(r"^[\W_]*(as an?\b|sorry\b|i'm sorry\b|i am sorry\b)", re.IGNORECASE)


def format_ok(instruction: str, min_words: int = 3, max_words: int = 150) -> bool:
    """FewFedPIT's format filter: not starting "As a(n) ..." / "sorry ...", at least
    ``min_words`` and at most ``max_words`` words, starting with a letter or digit."""
    t = instruction.strip()
    n = len(t.split())
    return bool(t) and min_words <= n <= max_words and not _BAD_START.match(t) \
        and t[0].isalnum()


def novel_instructions(candidates: Sequence[str], local: Sequence[str], keep: int,
                       threshold: float = ROUGE_THRESHOLD,
                       kept_before: Sequence[str] = ()) -> tuple[list[dict], dict]:
    """Walk the candidates in order and keep one when it passes :func:`format_ok` and its
    Rouge-L to every local instruction and every instruction kept so far (``kept_before``: by
    earlier calls) is <= threshold, until ``keep`` (2M) more remain.  Returns (one row per candidate looked at, with ``rouge_l``,
    ``kept`` and the ``reason`` it was dropped; counts)."""
    rows, kept = [], list(kept_before)
    counts = {"format": 0, "rouge_local": 0, "rouge_kept": 0, "kept": 0}
    for c in candidates:
        if len(kept) - len(kept_before) >= keep:
            break
        row = {"instruction": c, "rouge_l": None, "kept": False, "reason": None}
        if not format_ok(c):
            row["reason"] = "format"
        else:
            r_local = max_rouge_l(c, local)
            row["rouge_l"] = r_local
            if r_local > threshold:
                row["reason"] = "rouge_local"
            elif max_rouge_l(c, kept) > threshold:
                row["reason"] = "rouge_kept"
            else:
                row["kept"] = True
                kept.append(c)
        counts["kept" if row["kept"] else row["reason"]] += 1
        rows.append(row)
    return rows, counts


def example_text(ex: dict) -> str:
    """An example's text for the copy filter: instruction, input and response."""
    return " ".join(x.strip() for x in (ex.get("instruction", ""), ex.get("input") or "",
                                        ex.get("output", "")) if x and x.strip())


def copy_filter(samples: Sequence[dict], local: Sequence[dict],
                threshold: float = ROUGE_THRESHOLD) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): a sample is dropped when the Rouge-L of its text (instruction + input +
    response) to any local example's exceeds ``threshold``; each gets ``rouge_l_local``."""
    refs = [example_text(e) for e in local]
    kept, dropped = [], []
    for s in samples:
        r = max_rouge_l(example_text(s), refs)
        s = {**s, "rouge_l_local": r}
        (dropped if r > threshold else kept).append(s)
    return kept, dropped


def ifs(loss_with_prompt: float, loss_without_prompt: float) -> float:
    """Instruction-following score L(y|x) / L(y) (mean response-token losses); below 1 the
    prompt helps predict the response.  inf when L(y) is 0."""
    if loss_without_prompt <= 0:
        return float("inf")
    return float(loss_with_prompt) / float(loss_without_prompt)


def select_top(samples: Sequence[dict], m: int, key: str = "ifs") -> list[dict]:
    """The ``m`` samples with the lowest ``key`` (ties: earlier first); the order kept."""
    order = sorted(range(len(samples)), key=lambda i: (samples[i][key], i))[:m]
    return [samples[i] for i in sorted(order)]
