# The two set-up commands of the README:
#   make demo   -- install everything, then run the main job on the embedded default
#   make test   -- install everything, then run the test suite (what .ci/run calls)
VENV ?= .venv
PY := $(VENV)/bin/python
RUN ?= runs/demo

.PHONY: setup demo demo-client compare test test-fast test-heavy bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(VENV)/bin/popri run examples/default.yaml --run-dir $(RUN)

demo-client: setup
	@PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/client_pipeline.sh runs/client

compare: setup
	@PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) examples/compare.py --runs runs/compare

test:
	@bash scripts/test.sh

test-fast:
	@POPRI_FAST=1 bash scripts/test.sh -m "not slow"

test-heavy:
	@POPRI_SKIP_MIN=1 bash scripts/test.sh -m heavy

bench: setup
	$(PY) benchmarks/bench_score.py

clean:
	rm -rf runs .pytest_cache .hypothesis
