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

.PHONY: setup proto proto-check config-check lint test test-fast run bench dist wheelhouse images up down test-deploy clean

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

# Regenerates docs/config.md (its key reference, from the config classes) into a temp file
# and diffs against the committed page; `tidal config-docs` rewrites the page itself.
config-check: setup
	@tmp=$$(mktemp) && $(BIN)/tidal config-docs --out $$tmp && \
	  { diff -u docs/config.md $$tmp && echo "config-check: docs/config.md is up to date" || \
	    { echo "config-check: docs/config.md is stale: run 'tidal config-docs'"; false; }; }; \
	  rc=$$?; rm -f $$tmp; exit $$rc

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup proto-check config-check
	$(BIN)/python -m pytest -m "not gpu and not deploy" $(PYTEST_ARGS)

run: setup
	$(BIN)/tidal rl @ $(CONFIG) $(ARGS)

bench: setup
	$(BIN)/python bench/run_all.py $(BENCH)

# One wheel per package of this repo (pip resolves the siblings with --find-links dist).
PACKAGES := libs/rpc libs/common libs/weights libs/models libs/batch libs/text \
	services/weightsync services/trainer services/inference services/orchestrator .
dist: setup
	rm -f dist/*.whl
	$(BIN)/python -m pip wheel -q --no-deps -w dist $(PACKAGES)

# Every third-party wheel the four images need (torch from the machine's CPU wheel path,
# per `pip config list`): the images install offline from dist/wheelhouse.
wheelhouse: dist
	$(BIN)/python -m pip wheel -q -w dist/wheelhouse --find-links dist \
		tidal-orchestrator tidal-inference tidal-trainer tidal-weightsync
	rm -f dist/wheelhouse/tidal*.whl

# The compose stack (docs/deployment.md). `docker compose` (v2) where installed, else
# Debian's docker-compose (v1). STACK_DIR holds the run outputs and the TLS folder, bind
# mounted into the containers (uid 10001 in the images).
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
STACK_DIR ?= $(CURDIR)/outputs/compose
BASE_IMAGE ?= tidal-base:bookworm
# As root the containers run as the images' uid 10001 (stack-dir.sh chowns to it); as a
# user, as that user, so the bind-mounted outputs stay theirs.
TIDAL_UID ?= $(shell [ "$$(id -u)" = 0 ] && echo 10001 || id -u)
TIDAL_GID ?= $(shell [ "$$(id -u)" = 0 ] && echo 10001 || id -g)
export STACK_DIR BASE_IMAGE TIDAL_UID TIDAL_GID
# The offline base is built only when it is the one asked for (BASE_IMAGE=python:3.11-slim
# pulls the standard one instead, where a registry is reachable).
images: wheelhouse
	case "$(BASE_IMAGE)" in tidal-base:*) TIDAL_BASE_IMAGE="$(BASE_IMAGE)" deploy/base-image.sh;; esac
	$(COMPOSE) -p tidal -f deploy/compose.yaml build

up: images
	deploy/stack-dir.sh "$(STACK_DIR)"
	$(COMPOSE) -p tidal -f deploy/compose.yaml up -d

down:
	$(COMPOSE) -p tidal -f deploy/compose.yaml down

# Builds and runs the real stack on a Docker engine (installed and started when none
# answers): tests/deploy/test_compose_stack.py. Not part of `make test`.
test-deploy: wheelhouse
	$(BIN)/python -m pytest -m deploy tests/deploy -x -s -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs .pytest_cache
