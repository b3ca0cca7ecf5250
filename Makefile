# Tidal: the two README commands are `make run` and `make test`; both set up .venv first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tidal-setup
PROTO_SRC := protos
PROTO_OUT := libs/rpc/src
PROTOS := $(shell find $(PROTO_SRC) -name '*.proto' | sort)
CONFIG ?= configs/default.toml
PYPROJECTS := pyproject.toml libs/rpc/pyproject.toml libs/common/pyproject.toml libs/weights/pyproject.toml \
	libs/models/pyproject.toml libs/batch/pyproject.toml libs/text/pyproject.toml \
	$(wildcard services/*/pyproject.toml)

.PHONY: setup proto proto-check lint test test-fast run bench up down clean

setup: $(STAMP)

# torch is pinned and installed first: an unpinned torch pulls gigabytes of CUDA wheels.
$(STAMP): $(PYPROJECTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e libs/rpc -e libs/common -e libs/weights -e libs/models -e libs/batch -e libs/text -e services/weightsync \
		-e services/trainer -e services/inference -e 'services/orchestrator[reasoning-gym]' -e '.[dev]'
	touch $(STAMP)

proto: setup
	$(BIN)/python -m grpc_tools.protoc -I $(PROTO_SRC) --python_out=$(PROTO_OUT) \
		--grpc_python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) $(PROTOS)

# Regenerates into a temp dir and diffs against the committed code.
proto-check: setup
	@tmp=$$(mktemp -d) && $(BIN)/python -m grpc_tools.protoc -I $(PROTO_SRC) --python_out=$$tmp \
	    --grpc_python_out=$$tmp --pyi_out=$$tmp $(PROTOS) && \
	  diff -r -x __pycache__ $$tmp/tidal/rpc $(PROTO_OUT)/tidal/rpc && echo "proto-check: generated code is up to date"; \
	  rc=$$?; rm -rf $$tmp; exit $$rc

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup proto-check
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

run: setup
	$(BIN)/tidal rl @ $(CONFIG) $(ARGS)

bench: setup
	$(BIN)/python bench/run_all.py $(BENCH)

up:
	docker compose -p tidal -f deploy/compose.yaml up -d --build

down:
	docker compose -p tidal -f deploy/compose.yaml down

clean:
	rm -rf $(VENV) outputs .pytest_cache
