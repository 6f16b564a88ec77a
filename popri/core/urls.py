"""URLs as messages and logs may show them: the password of a URL's user info hidden.

    python -c "from popri.core.urls import display_url; print(display_url('http://u:pw@h/v1'))"

Pure Python.  ``popri gen --backend openai`` prints its server's URL in errors and logs, and
``popri run`` writes every stage's command line to its log and ``RUN/commands.sh``: a
``--base-url http://user:password@host/v1`` must show as ``http://user:***@host/v1`` in all
of them (issue 37, G13).
"""

from __future__ import annotations


def _split(url: str) -> tuple[str, str, str, int]:
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0], default=len(rest))
    return scheme, sep, rest, end


def display_url(url: str) -> str:
    """``url`` as a message may show it: the password of its user info replaced by ``***``
    (``http://user:***@host/v1``).  Parsed by hand, so a malformed URL is shown too."""
    scheme, sep, rest, end = _split(url)
    userinfo, at, hostport = rest[:end].rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{hostport}{rest[end:]}"


def url_password(url: str) -> str | None:
    """The password of ``url``'s user info, or None."""
    _, _, rest, end = _split(url)
    userinfo, at, _ = rest[:end].rpartition("@")
    return userinfo.split(":", 1)[1] if at and ":" in userinfo else None


def redact_arg(arg: str) -> str:
    """A command-line word with any URL password in it hidden: the word itself when it is a
    URL, or the value of ``key=URL`` (``--set generator.base_url=...``)."""
    if "://" not in arg or "@" not in arg:
        return arg
    key, eq, value = arg.partition("=")
    if eq and "://" in value and "://" not in key:
        return f"{key}={display_url(value)}"
    return display_url(arg)
