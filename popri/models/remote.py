"""The ``openai`` generation backend: an OpenAI-compatible server writes the samples.

    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --enable-lora --max-lora-rank 8 --port 8000
    popri gen omega.jsonl -K 1800 -J 10 --backend openai --base-url http://127.0.0.1:8000/v1 \\
        --model HuggingFaceTB/SmolLM2-135M-Instruct --adapter runs/r1/adapter --out r1.jsonl

How a user scales generation (POPri, arXiv:2504.16438, Algorithm 1 line 3; PrE-Text,
arXiv:2406.02958, Expand) past one machine: a vLLM / SGLang / transformers-serve / llama.cpp
deployment they already run.  One request per prompt asks for its rows with ``n`` and a seed
derived as the in-process backends derive theirs (``(seed, attempt, prompt_id, first sample)``);
a server that answers fewer choices than ``n`` (transformers serve and llama.cpp ignore ``n``) is
asked again for each missing row with that row's own seed.  Requests run ``concurrency`` at a
time; the ``openai`` client retries 429 / 5xx answers and dropped connections with exponential
backoff; a server that is down or rejects a request is one error line naming the URL.

LoRA adapters (POPri's round adapter): ``adapter_mode='lora'`` POSTs ``{lora_name, lora_path}``
to ``BASE/load_lora_adapter`` (vLLM, started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; SGLang has ``/load_lora_adapter`` at the server root,
tried second) and then asks for the adapter by its name, a content digest, so a changed adapter
is a new name; ``'merge'`` merges it into a cached local checkpoint and asks for that checkpoint's
path (servers that load models by path, such as ``transformers serve``, on a shared filesystem).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from popri.core import log
from popri.core.errors import InputError, MissingResourceError, PopriError

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_CONCURRENCY = 8
#: per request; generation of J samples of ~85 tokens on a busy server can take a while
TIMEOUT_S = 600.0
#: the openai client's own retry loop (429, 5xx, connection errors; exponential backoff from
#: 0.5 s to 8 s); POPRI_OPENAI_RETRIES overrides it
MAX_RETRIES = 5


def _import_openai():
    try:
        import openai
    except ImportError as e:
        raise MissingResourceError(
            f"backend 'openai' needs the openai package ({e}); install it with "
            "`pip install 'popri[serve]'`") from None
    return openai


def _post_json(url: str, body: dict, key: str | None, timeout: float = 60.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        raise PopriError(f"openai backend: cannot reach {url}: {getattr(e, 'reason', e)}") from None


def load_lora(base_url: str, adapter: str, key: str | None) -> str:
    """Load ``adapter`` into the server under a content-digest name; returns the name."""
    from popri.core.artifacts import dir_digest
    from popri.models.lora import require_adapter

    path = str(require_adapter(adapter).resolve())
    name = f"popri-{dir_digest(path)[:16]}"
    body = {"lora_name": name, "lora_path": path}
    root = base_url.rstrip("/")
    tried = []
    for url in (f"{root}/load_lora_adapter", f"{root.rsplit('/v1', 1)[0]}/load_lora_adapter"):
        if url in tried:
            continue
        tried.append(url)
        status, text = _post_json(url, body, key)
        if status == 200 or (status == 400 and "already" in text.lower()):
            log.info(f"gen: adapter {adapter} loaded into {url} as {name}")
            return name
        if status not in (404, 405):
            raise PopriError(f"openai backend: {url} refused to load adapter {adapter} "
                             f"(HTTP {status}: {text.strip()[:300]}); vLLM needs --enable-lora, "
                             "--max-lora-rank >= the adapter's r and "
                             "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    raise PopriError(f"openai backend: the server at {base_url} cannot load LoRA adapters (no "
                     f"{' or '.join(tried)}); use --adapter-mode merge with a server that loads "
                     "models by path, or a vLLM server started with --enable-lora")


class OpenAIBackend:
    """``run(prompts, keys, attempt, tick) -> [(raw text, tokens)]`` over an OpenAI-compatible
    server; ``.tok``: the model's tokenizer (samples are truncated with it)."""

    name = "openai"

    def __init__(self, model: str, adapter: str | None, *, base_url: str, params: dict,
                 seed: int, marker: str, adapter_mode: str = "lora", api: str | None = None,
                 api_key_env: str | None = None, concurrency: int | None = None,
                 tokenizer_obj=None, client=None):
        from popri.models import llm

        openai = _import_openai()
        self.openai = openai
        self.base_url = base_url.rstrip("/")
        self.params, self.seed, self.marker = params, seed, marker
        self.api = api or "completions"
        self.concurrency = concurrency or DEFAULT_CONCURRENCY
        key = os.environ.get(api_key_env or DEFAULT_KEY_ENV)
        if api_key_env and key is None:
            raise InputError(f"environment variable {api_key_env} is not set",
                             field="api_key_env")
        self.client = client or openai.OpenAI(base_url=self.base_url, api_key=key or "EMPTY",
                                              timeout=TIMEOUT_S, max_retries=int(
                                                  os.environ.get("POPRI_OPENAI_RETRIES",
                                                                 MAX_RETRIES)))
        self.tok = tokenizer_obj or llm.load_tokenizer(model)
        if adapter and adapter_mode == "merge":
            from popri.models.lora import merged_checkpoint

            self.model = merged_checkpoint(model, adapter)
        elif adapter:
            self.model = load_lora(self.base_url, adapter, key)
        else:
            self.model = llm.resolve(model)  # an offline alias: its local checkpoint path

    def _request(self, prompt: str, n: int, seed: int) -> list[str]:
        p = self.params
        common = dict(model=self.model, n=n, seed=seed, temperature=p["temperature"],
                      top_p=p["top_p"], max_tokens=p["max_new_tokens"], stop=[self.marker])
        try:
            if self.api == "chat":
                r = self.client.chat.completions.create(
                    messages=[{"role": "user", "content": prompt}], **common)
                return [c.message.content or "" for c in sorted(r.choices, key=lambda c: c.index)]
            r = self.client.completions.create(prompt=prompt, **common)
            return [c.text or "" for c in sorted(r.choices, key=lambda c: c.index)]
        except self.openai.APIConnectionError as e:
            raise PopriError(f"openai backend: cannot reach {self.base_url} ({e})") from None
        except self.openai.APIStatusError as e:
            detail = " ".join((getattr(e.response, "text", "") or str(e)).split())[:300]
            raise PopriError(f"openai backend: {self.base_url} rejected the request for model "
                             f"{self.model!r} (HTTP {e.status_code}: {detail})") from None

    def run(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int,
            tick) -> list[tuple[str, int]]:
        from popri.models.decoding import derive_seed

        # one request per run of consecutive rows sharing a prompt (a prompt's J samples)
        groups: list[list[int]] = []
        for i, pr in enumerate(prompts):
            if groups and prompts[groups[-1][0]] == pr and keys[groups[-1][0]][0] == keys[i][0]:
                groups[-1].append(i)
            else:
                groups.append([i])
        out: list[tuple[str, int] | None] = [None] * len(prompts)

        def one(g: list[int]) -> list[int]:
            first = keys[g[0]]
            texts = self._request(prompts[g[0]], len(g), derive_seed(self.seed, attempt, *first))
            for i, t in zip(g, texts):
                out[i] = (t, len(self.tok(t, add_special_tokens=False)["input_ids"]))
            for i in g[len(texts):]:  # the server ignored n: one request per missing row
                t = self._request(prompts[i], 1, derive_seed(self.seed, attempt, *keys[i]))
                t = t[0] if t else ""
                out[i] = (t, len(self.tok(t, add_special_tokens=False)["input_ids"]))
            return g

        with ThreadPoolExecutor(max_workers=self.concurrency) as ex:
            for g in ex.map(one, groups):
                tick(len(g), sum(out[i][1] for i in g))
        return out  # type: ignore[return-value]


def check_url(base_url: str) -> None:
    """A malformed URL is an input error before anything is loaded."""
    from urllib.parse import urlparse

    u = urlparse(base_url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise InputError(f"not an http(s) URL: {base_url!r}", field="base_url")

