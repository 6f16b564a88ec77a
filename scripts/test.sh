#!/usr/bin/env bash
# Install (if needed) and run the whole test suite: fast unit/property/CLI tests and the
# slow end-to-end tests on the real small models and corpora.  `make test` runs this; so
# does CI (.ci/run).  Extra arguments go to pytest (e.g. -m "not slow", -k score).
#
# pytest exits 5 when it collected no tests: that is a failure here, never a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
VENV=${VENV:-.venv}
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" tests
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests -- treating as failure" >&2
  exit 1
fi
exit "$rc"
