"""File formats the stages exchange, and atomic writes: one import for the three modules that
hold them (``from popri.core import io``; ``io.read_jsonl``, ``io.atomic_write``, ...).

Formats (see ``docs/formats.md`` for the full reference):

- **Text samples**: JSONL, one object per line with at least ``id`` and ``text``.
- **Federated dataset**: a directory with ``train.jsonl``/``val.jsonl``/``test.jsonl``
  (records ``{"client_id", "text", ...}``) and ``manifest.json``.
- **Embedding set**: ``NAME.npy`` (float32, ``[N, d]``) + row-aligned sidecar ``NAME.jsonl``
  (``id``; ``client_id`` for private data) + optional ``NAME.meta.json`` (model, normalisation).
  On a pipe an embedding set travels as JSONL whose rows carry an ``embedding`` list.
- **Score vector**: ``NAME.npy`` + ``NAME.json`` sidecar (ids in order, mode, parameters, ledger).

``-`` means stdin / stdout everywhere; stdout carries data only.

Where each lives:

- :mod:`popri.core.atomic`: every writer goes through :func:`atomic_write` /
  :class:`AtomicOutputs`: data is written to a temporary file in the destination directory and
  renamed into place only when the whole output is complete, so a failed or killed stage never
  leaves a half file and never clobbers an earlier good one;
- :mod:`popri.core.jsonl`: JSON / JSONL readers (one clear line per bad record) and writers,
  and the lenient readers of finished runs;
- :mod:`popri.core.arrays`: embedding sets, ``.npy`` loading, score vectors.
"""

from popri.core.arrays import (
    EmbeddingSet,
    check_finite,
    check_score_sidecar,
    embedding_rows_to_set,
    finite_or_none,
    is_embedding_path,
    load_embedding_set,
    load_npy,
    load_scores,
    meta_path,
    save_embedding_set,
    save_scores,
    score_sidecar_path,
    sidecar_path,
)
from popri.core.atomic import (
    STDIO,
    AtomicOutputs,
    annotate_write_error,
    as_write_error,
    atomic_write,
    is_special_file,
    open_memmap,
    sweep_temporaries,
    writing,
)
from popri.core.jsonl import (
    MAX_LINE_BYTES,
    dumps,
    iter_jsonl,
    max_line_bytes,
    parse_json,
    read_json,
    read_json_lenient,
    read_jsonl,
    read_jsonl_lenient,
    write_json,
    write_jsonl,
)

__all__ = [
    "STDIO", "AtomicOutputs", "EmbeddingSet", "MAX_LINE_BYTES", "annotate_write_error",
    "as_write_error", "atomic_write", "check_finite", "check_score_sidecar", "dumps",
    "embedding_rows_to_set", "finite_or_none", "is_embedding_path", "is_special_file",
    "iter_jsonl", "load_embedding_set", "load_npy", "load_scores", "max_line_bytes", "meta_path",
    "open_memmap", "parse_json", "read_json", "read_json_lenient", "read_jsonl",
    "read_jsonl_lenient", "save_embedding_set", "save_scores", "score_sidecar_path", "sidecar_path", "sweep_temporaries",
    "write_json", "write_jsonl", "writing",
]
