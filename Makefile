# channels-nats: every task of the repository.
#
# `make` (or `make help`) lists the targets. `make test` is the one test command.
# Targets are documented with a trailing "## description" comment; `help` prints those.

GO          ?= go
BUILD       ?= build
GOTESTFLAGS ?=
PYTESTFLAGS ?=
DEMO_ARGS   ?=
ARGS        ?=
FUZZTIME    ?= 20000x
FUZZMINIMIZETIME ?= 2s

.DEFAULT_GOAL := help
.PHONY: help server faultproxy lib accelerator venv lint lint-go lint-py test-go test-py test-py-matrix test-c examples install-check wheels wheels-check demo demo-check demo-browser wireview-venv wireview-check bench soak fuzz-smoke fuzz test clean

help: ## List the targets
	@echo "Targets:"
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo
	@echo "Variables: GO=$(GO)  GOTESTFLAGS=$(GOTESTFLAGS)  FUZZTIME=$(FUZZTIME)  FUZZMINIMIZETIME=$(FUZZMINIMIZETIME)"

server: ## Build build/nats-server from the nats-server module pinned in go.mod
	@mkdir -p $(BUILD)
	$(GO) build -o $(BUILD)/nats-server github.com/nats-io/nats-server/v2

faultproxy: ## Build build/faultproxy, the loopback TCP fault proxy of the tests (stall, delay, cut)
	@mkdir -p $(BUILD)
	$(GO) build -o $(BUILD)/faultproxy ./internal/faultproxy/cmd/faultproxy

lib: ## Build the C library and header for this machine into build/<goos>-<goarch>/
	capi/build.sh

VENV    := $(BUILD)/venv
PYTHON  := $(VENV)/bin/python
PYRIGHT := $(BUILD)/node/node_modules/.bin/pyright
PYRIGHT_VERSION := 1.1.414
LIB_FILE = $(BUILD)/$(shell $(GO) env GOOS)-$(shell $(GO) env GOARCH)/libchannels_nats.so

# The compiled cffi module beside the library (python/cffi_build.py): Python's fast way to call
# it. Everything that runs Python against build/<goos>-<goarch>/ depends on it.
accelerator: lib venv ## Build the compiled cffi module beside the library (Linux; else cffi's ABI mode is used)
	$(PYTHON) python/cffi_build.py $(LIB_FILE)

venv: $(VENV)/.installed ## The Python development environment in build/venv (pinned: python/requirements-dev.txt)

$(VENV)/.installed: python/requirements-dev.txt
	@echo "venv: creating $(VENV) and installing python/requirements-dev.txt"
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt
	@touch $@

$(PYRIGHT):
	@echo "pyright: installing pyright $(PYRIGHT_VERSION) from npm into $(BUILD)/node"
	npm install --silent --no-audit --no-fund --prefix $(BUILD)/node pyright@$(PYRIGHT_VERSION)

lint: lint-go lint-py ## Every linter: gofmt, go vet, ruff, pyright

# examples/wireview imports django-wireview, which needs Python 3.12+ and is only in
# build/wireview-venv: ruff checks it here, pyright in wireview-check (against that venv).
lint-py: venv $(PYRIGHT) ## ruff (lint and format check) and pyright on python/
	cd python && ../$(VENV)/bin/ruff check . && ../$(VENV)/bin/ruff format --check .
	$(PYRIGHT) --pythonpath $(PYTHON) -p python
	$(VENV)/bin/ruff check --config python/pyproject.toml examples/chat examples/demo examples/wireview bench wheels
	$(VENV)/bin/ruff format --check --config python/pyproject.toml examples/chat examples/demo examples/wireview bench wheels
	$(PYRIGHT) --pythonpath $(PYTHON) examples/chat examples/demo wheels

# The Go files to check with gofmt: everything except build output, VCS data and testdata.
GO_FILES = $(shell find . \( -name .git -o -name $(BUILD) -o -name testdata -o -name .venv \) -prune \
                -o -type f -name '*.go' -print)

lint-go: ## gofmt check (lists unformatted files) and go vet
	@files="$(GO_FILES)"; \
	if [ -n "$$files" ]; then \
		unformatted=$$(gofmt -l $$files); \
		if [ -n "$$unformatted" ]; then \
			echo "gofmt: these files need formatting (run gofmt -w):"; \
			echo "$$unformatted" | sed 's/^/  /'; \
			exit 1; \
		fi; \
	fi
	$(GO) vet ./...

test-go: lib ## Go tests with the race detector (extra flags: GOTESTFLAGS=...)
	$(GO) test -race -count=1 -timeout 12m $(GOTESTFLAGS) ./...

# Every fuzz target of every package runs for FUZZTIME. Packages are found by grepping the
# *_test.go files for "func Fuzz"; the target names come from `go test -list`.
# The default is a count of executions, not a duration: when a duration runs out, Go's fuzzing
# coordinator can fail the target with "context deadline exceeded" although nothing failed (it
# races its own deadline, most often while it minimizes a new input). A count has no deadline.
# FUZZMINIMIZETIME bounds each minimization, which otherwise takes up to 60 s and stalls the run.
fuzz-smoke: ## Run every Go fuzz target for FUZZTIME (default 20000x: executions)
	@dirs=$$(grep -rl --include='*_test.go' '^func Fuzz' . 2>/dev/null \
		| grep -v -e '/testdata/' -e '^\./$(BUILD)/' -e '/\.venv/' \
		| xargs -r -n1 dirname | sort -u); \
	if [ -z "$$dirs" ]; then echo "fuzz: no fuzz targets found"; exit 0; fi; \
	for dir in $$dirs; do \
		pkg=$${dir#./}; \
		names=$$($(GO) test -list '^Fuzz' ./$$pkg | grep '^Fuzz') || { \
			echo "fuzz: cannot list the fuzz targets of $$pkg"; exit 1; }; \
		for name in $$names; do \
			echo "fuzz: $$pkg $$name ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) \
				-fuzzminimizetime $(FUZZMINIMIZETIME) -timeout 10m ./$$pkg || exit 1; \
		done; \
	done

fuzz: ## Long fuzz run: fuzz-smoke with 300000 executions per target (1-2 minutes each here)
	@$(MAKE) --no-print-directory fuzz-smoke FUZZTIME=300000x FUZZMINIMIZETIME=60s

test-py: accelerator server faultproxy venv ## The Python package's tests (pytest) against nats-servers built from the Go module
	cd python && CHANNELS_NATS_LIBRARY=$(abspath $(LIB_FILE)) NATS_SERVER=$(abspath $(BUILD)/nats-server) \
		FAULTPROXY=$(abspath $(BUILD)/faultproxy) \
		../$(PYTHON) -m pytest $(PYTESTFLAGS)

test-py-matrix: accelerator server faultproxy ## The Python tests and install-check on Python 3.10 and 3.13 too (pyenv's; PY_MATRIX="3.10 3.12 3.13")
	bash python/matrix.sh

install-check: venv server ## pip install ./python into a fresh venv (builds the library with Go), then two processes group_send
	bash python/install-check.sh

wheels: ## The five platform wheels and the sdist in build/wheels/dist (installs the cross tools; wheels/README.md)
	bash wheels/build.sh

wheels-check: wheels server ## Prove the wheels: tags, exports, install with no Go, the C example under qemu and Wine, the sdist
	bash wheels/check.sh

demo: accelerator server venv ## Start nats-server, two Django chat processes and the Go front; prove a message crosses; serve until Ctrl-C
	@CHANNELS_NATS_LIBRARY=$(abspath $(LIB_FILE)) $(PYTHON) examples/demo/demo.py $(DEMO_ARGS)

demo-check: accelerator server venv ## The demo's self-check under daphne, then uvicorn: proof lines both ways (and the Go front), a clean stop
	CHANNELS_NATS_LIBRARY=$(abspath $(LIB_FILE)) $(PYTHON) examples/demo/demo.py --check --require-gofront --server daphne
	CHANNELS_NATS_LIBRARY=$(abspath $(LIB_FILE)) $(PYTHON) examples/demo/demo.py --check --require-gofront --server uvicorn

demo-browser: accelerator server venv ## Headless Chromium types into the chat on each process and sees it on the others
	CHANNELS_NATS_LIBRARY=$(abspath $(LIB_FILE)) $(PYTHON) examples/demo/browser_check.py --require-gofront

WIREVIEW_VENV := $(BUILD)/wireview-venv

wireview-venv: accelerator ## build/wireview-venv: Python 3.12+ from pyenv, examples/wireview/requirements.txt, ./python with the library
	@CHANNELS_NATS_PREBUILT=$(abspath $(dir $(LIB_FILE))) bash examples/wireview/setup-venv.sh $(WIREVIEW_VENV)

wireview-check: wireview-venv server $(PYRIGHT) ## pyright on examples/wireview; headless Chromium changes its todo list on one daphne process, sees it on the other
	$(PYRIGHT) --pythonpath $(WIREVIEW_VENV)/bin/python -p examples/wireview
	$(WIREVIEW_VENV)/bin/python examples/wireview/check.py

bench: accelerator server venv ## Benchmarks: this layer vs the reference, channels_redis, in-memory, raw NATS (ARGS=...; see bench/README.md)
	$(PYTHON) bench/run.py $(ARGS)

soak: accelerator server venv ## Soak: mixed traffic with periodic broker restarts, RSS and goroutines over time (ARGS=...; bench/README.md)
	$(PYTHON) bench/soak.py $(ARGS)

test-c: lib server ## The C harness against a real nats-server: checks, fork guard, valgrind, header as C++
	bash capi/ctest/run.sh

examples: lib server ## Build and run the C and Rust examples against a real nats-server
	bash examples/run.sh

test: ## The one test command: linters, Go race tests, C harness, examples, Python tests, demo, fuzz
	@echo "==> [1/10] lint: gofmt, go vet, ruff, pyright"
	@$(MAKE) --no-print-directory lint
	@echo "==> [2/10] lib, accelerator, server: the C library, its compiled cffi module, nats-server"
	@$(MAKE) --no-print-directory lib accelerator server
	@echo "==> [3/10] test-go: go test -race (layer/, the C ABI through purego, the Go front)"
	@$(MAKE) --no-print-directory test-go
	@echo "==> [4/10] test-c: the C harness, fork guard and valgrind"
	@$(MAKE) --no-print-directory test-c
	@echo "==> [5/10] examples: C and Rust"
	@$(MAKE) --no-print-directory examples
	@echo "==> [6/10] test-py: the Python package (pytest)"
	@$(MAKE) --no-print-directory test-py
	@echo "==> [7/10] install-check: pip install ./python into a fresh venv"
	@$(MAKE) --no-print-directory install-check
	@echo "==> [8/10] demo-check: two Django processes and the Go front chat through NATS"
	@$(MAKE) --no-print-directory demo-check
	@echo "==> [9/10] demo-browser: headless Chromium on every process"
	@$(MAKE) --no-print-directory demo-browser
	@echo "==> [10/10] fuzz-smoke: every fuzz target for $(FUZZTIME) (x: executions)"
	@$(MAKE) --no-print-directory fuzz-smoke
	@echo "==> all tests passed"

clean: ## Remove build/
	rm -rf $(BUILD)
