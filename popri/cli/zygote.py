"""The stage zygote of ``popri run``: one process that imports the heavy libraries once and
forks a child for every stage, so a stage starts in milliseconds instead of re-importing torch,
transformers, sentence-transformers and peft (5-10 s a stage on 2 CPU cores, most of a small
run's time).  Started by :mod:`popri.pipeline.zygote` (the client; see there for when it is
used and how to turn it off, ``POPRI_ZYGOTE=0``):

    python -P -m popri.cli.zygote        # with POPRI_ZYGOTE_FD=<one end of a socketpair>

Protocol over that ``AF_UNIX`` ``SOCK_SEQPACKET`` socket (one JSON object per message):

* zygote -> client, once: ``{"ready": true, "pid": ..., "env": {...}, "added": {...}}`` after
  the imports (``env``: the environment it was given; ``added``: the variables it and its imports
  set), or
  ``{"error": "..."}`` (then it exits; the client starts stages as processes).
* client -> zygote: ``{"argv": [...], "env": {...}, "cwd": "...", "path0": null}`` (``path0``: a
  directory to put first on sys.path, as ``python -m`` without ``-P``) with the stage's stdin,
  stdout, stderr and any further descriptors to keep open (the run directory's lock) as
  ``SCM_RIGHTS``.
* zygote -> client: ``{"pid": N}`` once forked, then ``{"pid": N, "returncode": R}`` when it
  exited (``R`` as ``subprocess.Popen.returncode``: negative for a signal).  One stage at a time.

The child is the process ``python -P -m popri ARGV`` would have been: the stage's environment
(``os.environ`` replaced), working directory, standard streams (new ``sys.std*`` objects on the
received descriptors), default signal dispositions, and ``popri``'s ``__main__`` run by
``runpy``; it exits as an interpreter does (threads joined, ``atexit``, streams flushed).  It
dies with the zygote (``POPRI_DIE_WITH``: ``PR_SET_PDEATHSIG``), which dies with ``popri run``,
so a SIGKILLed run still takes its stage with it.  Forking is safe only from a process whose
Python code runs in one thread: the zygote checks after its imports and refuses (``error``)
otherwise; the native threads the imports leave (OpenBLAS's idle pools, jemalloc's background
thread) have fork handlers of their own.
"""

from __future__ import annotations

import os
import socket
import sys

from popri.cli.process import quiet_library_progress
from popri.core.runtime import die_with_parent
from popri.pipeline.zygote import FD_ENV
from popri.pipeline.zygote_server import serve


def main() -> int:
    fd = int(os.environ.pop(FD_ENV))
    sock = socket.socket(fileno=fd)
    die_with_parent()  # POPRI_DIE_WITH: popri run
    given = dict(os.environ)
    quiet_library_progress()  # a stage's stderr is a pipe (popri.cli.process.prepare)
    try:
        return serve(sock, given=given)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
