SHELL := /bin/bash
# The two commands of the README. Both set up .venv (idempotent, fast when already done).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export TRANSFORMERS_VERBOSITY := error

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt torch==2.13.0
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[dev,tensorboard]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlft quickstart

test: $(STAMP)
	@set -o pipefail; $(VENV)/bin/python -m pytest 2>&1 | tee .ci/last-pytest.log; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests (exit 5): that is a failure" >&2; fi; exit $$status

clean:
	rm -rf outputs .pytest_cache
