"""Rouge-L (the ``rouge-score`` package): FewFedPIT's filters and its extraction audit, and the
instruction evaluation.

    python -c "from popri.eval.rouge import rouge_l; print(rouge_l('the cat lay on a mat', 'the cat sat on the mat'))"

F-measure of the longest common subsequence (Lin 2004), rouge-score's default tokenizer
(lower-cased alphanumeric tokens, no stemming), as Self-Instruct's filter computes it.
"""

from __future__ import annotations

from typing import Iterable

_SCORER = None


def _scorer():
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return _SCORER


def rouge_l(candidate: str, reference: str) -> float:
    """Rouge-L F-measure of two texts."""
    return float(_scorer().score(reference, candidate)["rougeL"].fmeasure)


def max_rouge_l(candidate: str, references: Iterable[str]) -> float:
    """The largest Rouge-L of ``candidate`` to any reference (0 for none)."""
    best = 0.0
    for r in references:
        best = max(best, rouge_l(candidate, r))
        if best >= 1.0:
            break
    return best
