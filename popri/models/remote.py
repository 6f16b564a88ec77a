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

A hostile or broken server (issue 37) is one error line, never a traceback: an answer that is not
JSON (an HTML login page, an empty body), one without a list of ``choices``, a malformed choice.
No message prints a secret: the URL is shown without the password of its user info, and wherever
a server's body is echoed the API key, the URL's password and anything that looks like a token
(``Bearer ...``, ``Basic ...``, ``sk-...``, ``user:pass@``) are replaced by ``***``.  Requests
run in daemon threads while the main thread waits in short slices, so Ctrl-C or SIGTERM ends
``popri`` at once (exit 130 / 143) even while a server holds a request open.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import urllib.error
import urllib.request

from popri.core import log
from popri.core.artifacts import dir_digest
from popri.core.errors import InputError, MissingResourceError, PopriError
from popri.core.urls import display_url  # noqa: F401
from popri.core.urls import url_password as _url_password
from popri.models import llm
from popri.models.decoding import derive_seed
from popri.models.lora import merged_checkpoint, require_adapter

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_CONCURRENCY = 8
#: per request; generation of J samples of ~85 tokens on a busy server can take a while
TIMEOUT_S = 600.0
#: the openai client's own retry loop (429, 5xx, connection errors; exponential backoff from
#: 0.5 s to 8 s); POPRI_OPENAI_RETRIES overrides it
MAX_RETRIES = 5
#: how often the main thread, waiting for the requests in flight, lets a signal handler run
POLL_S = 0.2
#: how much of a server's answer an error line quotes (after redaction)
QUOTE_CHARS = 300

#: what looks like a credential wherever a server's body is echoed
_TOKENS = (
    (re.compile(r"(?i)\b(bearer)(\s+|%20)[A-Za-z0-9._~+/=:-]+"), r"\1 ***"),
    (re.compile(r"(?i)\b(basic)(\s+|%20)[A-Za-z0-9+/=]{8,}"), r"\1 ***"),  # user:password
    (re.compile(r"\bsk-[A-Za-z0-9._-]{4,}"), "sk-***"),
    (re.compile(r"(//[^/\s:@'\"]*:)[^/\s@'\"]+@"), r"\1***@"),  # user:password@ in a URL
)


class Scrub:
    """Redacts the secrets of one server: ``scrub(text)`` is ``text`` with the API key, the URL's
    password (as given and percent-decoded) and token-looking strings replaced by ``***``;
    ``scrub.url`` the URL without its password."""

    #: shorter secrets are not replaced literally (they would mangle the message); the token
    #: patterns still apply
    MIN_SECRET = 4

    def __init__(self, base_url: str, key: str | None = None):
        from urllib.parse import quote, unquote

        self.url = display_url(base_url)
        secrets = set()
        for s in (key, _url_password(base_url)):
            if s and s != "EMPTY":
                secrets.update((s, unquote(s), quote(s, safe="")))
        self.secrets = sorted((s for s in secrets if len(s) >= self.MIN_SECRET), key=len,
                              reverse=True)

    def __call__(self, text: str, limit: int | None = QUOTE_CHARS) -> str:
        text = str(text)
        for s in self.secrets:
            text = text.replace(s, "***")
        for pattern, repl in _TOKENS:
            text = pattern.sub(repl, text)
        text = " ".join(text.split())
        return text if limit is None or len(text) <= limit else text[:limit] + "..."


def _import_openai():
    try:
        import openai
    except ImportError as e:
        raise MissingResourceError(
            f"backend 'openai' needs the openai package ({e}); install it with "
            "`pip install 'popri[serve]'`") from None
    return openai


def _post_json(url: str, body: dict, key: str | None, scrub: Scrub,
               timeout: float = 60.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PopriError(f"openai backend: cannot reach {display_url(url)}: "
                         f"{scrub(getattr(e, 'reason', e))}") from None


def load_lora(base_url: str, adapter: str, key: str | None) -> str:
    """Load ``adapter`` into the server under a content-digest name; returns the name."""
    path = str(require_adapter(adapter).resolve())
    name = f"popri-{dir_digest(path)[:16]}"
    body = {"lora_name": name, "lora_path": path}
    scrub = Scrub(base_url, key)
    root = base_url.rstrip("/")
    tried = []
    for url in (f"{root}/load_lora_adapter", f"{root.rsplit('/v1', 1)[0]}/load_lora_adapter"):
        if url in tried:
            continue
        tried.append(url)
        status, text = _post_json(url, body, key, scrub)
        if status == 200 or (status == 400 and "already" in text.lower()):
            log.info(f"gen: adapter {adapter} loaded into {display_url(url)} as {name}")
            return name
        if status not in (404, 405):
            raise PopriError(f"openai backend: {display_url(url)} refused to load adapter "
                             f"{adapter} (HTTP {status}: {scrub(text)}); vLLM needs "
                             "--enable-lora, --max-lora-rank >= the adapter's r and "
                             "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    raise PopriError(f"openai backend: the server at {display_url(base_url)} cannot load LoRA "
                     f"adapters (no {' or '.join(display_url(u) for u in tried)}); use "
                     "--adapter-mode merge with a server that loads models by path, or a vLLM "
                     "server started with --enable-lora")


NOT_JSON = "something that is not JSON"


def parse_choices(text: str, *, chat: bool = False) -> list[str] | str:
    """A completion's texts ordered by ``index`` (a null text is ''), or, for an answer that is
    not one, a string saying what is wrong with it."""
    if not text.strip():
        return "an empty body"
    try:
        data = json.loads(text)
    except ValueError:
        return NOT_JSON
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return "JSON without a list of 'choices'"
    got = []
    for pos, c in enumerate(choices):
        idx = c.get("index", pos) if isinstance(c, dict) else None
        if chat:
            msg = c.get("message") if isinstance(c, dict) else None
            t = msg.get("content", "") if isinstance(msg, dict) else 0
        else:
            t = c.get("text", "") if isinstance(c, dict) else 0
        if isinstance(idx, bool) or not isinstance(idx, int) or not isinstance(t, (str, type(None))):
            return (f"a malformed choice (each needs an integer 'index' and a string "
                    f"'{'message.content' if chat else 'text'}')")
        got.append((idx, t or ""))
    return [t for _, t in sorted(got, key=lambda x: x[0])]


class OpenAIBackend:
    """``run(prompts, keys, attempt, tick) -> [(raw text, tokens)]`` over an OpenAI-compatible
    server; ``.tok``: the model's tokenizer (samples are truncated with it)."""

    name = "openai"

    def __init__(self, model: str, adapter: str | None, *, base_url: str, params: dict,
                 seed: int, marker: str, adapter_mode: str = "lora", api: str | None = None,
                 api_key_env: str | None = None, concurrency: int | None = None,
                 tokenizer_obj=None, client=None):
        openai = _import_openai()
        self.openai = openai
        self.base_url = base_url.rstrip("/")
        self.params, self.seed, self.marker = params, seed, marker
        #: rows asked for alone because the server answered fewer than n choices (stats)
        self.asked_again = 0
        self.api = api or "completions"
        self.concurrency = concurrency or DEFAULT_CONCURRENCY
        key = os.environ.get(api_key_env or DEFAULT_KEY_ENV)
        if api_key_env and key is None:
            raise InputError(f"environment variable {api_key_env} is not set",
                             field="api_key_env")
        self.scrub = Scrub(self.base_url, key)
        self.client = client or openai.OpenAI(base_url=self.base_url, api_key=key or "EMPTY",
                                              timeout=TIMEOUT_S, max_retries=int(
                                                  os.environ.get("POPRI_OPENAI_RETRIES",
                                                                 MAX_RETRIES)))
        self.tok = tokenizer_obj or llm.load_tokenizer(model)
        if adapter and adapter_mode == "merge":
            self.model = merged_checkpoint(model, adapter)
        elif adapter:
            self.model = load_lora(self.base_url, adapter, key)
        else:
            self.model = llm.resolve(model)  # an offline alias: its local checkpoint path

    def _request(self, prompt: str, n: int, seed: int) -> list[str]:
        p = self.params
        common = dict(model=self.model, n=n, seed=seed, temperature=p["temperature"],
                      top_p=p["top_p"], max_tokens=p["max_new_tokens"], stop=[self.marker])
        chat = self.api == "chat"
        try:
            # the raw answer: popri checks its shape itself (the client hands a non-JSON body
            # back as a str, a body without choices as a model without them)
            if chat:
                raw = self.client.chat.completions.with_raw_response.create(
                    messages=[{"role": "user", "content": prompt}], **common)
            else:
                raw = self.client.completions.with_raw_response.create(prompt=prompt, **common)
            text = raw.text
            ctype = raw.headers.get("content-type", "")
        except self.openai.APIConnectionError as e:
            raise PopriError(f"openai backend: cannot reach {self.scrub.url} "
                             f"({self.scrub(e)})") from None
        except self.openai.APIStatusError as e:
            detail = self.scrub(getattr(e.response, "text", "") or str(e))
            raise PopriError(f"openai backend: {self.scrub.url} rejected the request for model "
                             f"{self.model!r} (HTTP {e.status_code}: {detail})") from None
        got = parse_choices(text, chat=chat)
        if isinstance(got, str):
            quoted = self.scrub(text, limit=120)
            hint = ("; is --base-url the server's API root (e.g. http://HOST:8000/v1)?"
                    if got in (NOT_JSON, "an empty body") else "")
            raise PopriError(
                f"openai backend: {self.scrub.url} answered the request for model "
                f"{self.model!r} with {got} (HTTP {raw.status_code}, "
                f"{ctype or 'no content type'}{': ' + quoted if quoted else ''}){hint}")
        return got

    def run(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int,
            tick) -> list[tuple[str, int]]:
        # one request per run of consecutive rows sharing a prompt (a prompt's J samples)
        groups: list[list[int]] = []
        for i, pr in enumerate(prompts):
            if groups and prompts[groups[-1][0]] == pr and keys[groups[-1][0]][0] == keys[i][0]:
                groups[-1].append(i)
            else:
                groups.append([i])
        out: list[tuple[str, int] | None] = [None] * len(prompts)

        def one(g: list[int]) -> None:
            first = keys[g[0]]
            texts = self._request(prompts[g[0]], len(g), derive_seed(self.seed, attempt, *first))
            for i, t in zip(g, texts):
                out[i] = (t, len(self.tok(t, add_special_tokens=False)["input_ids"]))
            for i in g[len(texts):]:  # the server ignored n: one request per missing row
                self.asked_again += 1
                t = self._request(prompts[i], 1, derive_seed(self.seed, attempt, *keys[i]))
                t = t[0] if t else ""
                out[i] = (t, len(self.tok(t, add_special_tokens=False)["input_ids"]))

        # `concurrency` daemon workers; the main thread waits in POLL_S slices, so a signal
        # (Ctrl-C, SIGTERM: popri.cli.process raises KeyboardInterrupt) ends the wait at once,
        # and no request a server holds open can keep the process alive at exit (a
        # ThreadPoolExecutor joins its workers: up to TIMEOUT_S x retries)
        todo: queue.SimpleQueue = queue.SimpleQueue()
        for gi in range(len(groups)):
            todo.put(gi)
        done: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()

        def worker() -> None:
            while not stop.is_set():
                try:
                    gi = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    one(groups[gi])
                except BaseException as e:  # handed to the main thread, raised there
                    done.put((gi, e))
                    return
                done.put((gi, None))

        for k in range(min(self.concurrency, len(groups))):
            threading.Thread(target=worker, name=f"popri-openai-{k}", daemon=True).start()
        try:
            for _ in groups:
                while True:
                    try:
                        gi, err = done.get(timeout=POLL_S)
                        break
                    except queue.Empty:
                        continue
                if err is not None:
                    raise err
                g = groups[gi]
                tick(len(g), sum(out[i][1] for i in g))
        finally:
            stop.set()  # on an error or a signal: no worker starts another request
        return out  # type: ignore[return-value]


def check_url(base_url: str) -> None:
    """A malformed URL is an input error before anything is loaded (shown without its
    password)."""
    from urllib.parse import urlsplit

    shown = display_url(base_url)
    try:
        u = urlsplit(base_url)
        u.port  # noqa: B018  (a port that is not a number raises here)
        host = u.hostname
    except ValueError as e:
        raise InputError(f"not an http(s) URL: {shown!r} ({e})", field="base_url") from None
    if u.scheme not in ("http", "https") or not host:
        raise InputError(f"not an http(s) URL: {shown!r}", field="base_url")
