# channels-nats: every task of the repository.
#
# `make` (or `make help`) lists the targets. `make test` is the one test command.
# Targets are documented with a trailing "## description" comment; `help` prints those.

GO          ?= go
BUILD       ?= build
GOTESTFLAGS ?=
FUZZTIME    ?= 8s

.DEFAULT_GOAL := help
.PHONY: help server lib lint-go test-go test-c examples fuzz-smoke fuzz test clean

help: ## List the targets
	@echo "Targets:"
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo
	@echo "Variables: GO=$(GO)  GOTESTFLAGS=$(GOTESTFLAGS)  FUZZTIME=$(FUZZTIME)"

server: ## Build build/nats-server from the nats-server module pinned in go.mod
	@mkdir -p $(BUILD)
	$(GO) build -o $(BUILD)/nats-server github.com/nats-io/nats-server/v2

lib: ## Build the C library and header for this machine into build/<goos>-<goarch>/
	capi/build.sh

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
fuzz-smoke: ## Run every Go fuzz target for FUZZTIME (default 8s)
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
			$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) ./$$pkg || exit 1; \
		done; \
	done

fuzz: ## Long fuzz run: fuzz-smoke with FUZZTIME=2m per target
	@$(MAKE) --no-print-directory fuzz-smoke FUZZTIME=2m

test-c: lib server ## The C harness against a real nats-server: checks, fork guard, valgrind, header as C++
	bash capi/ctest/run.sh

examples: lib server ## Build and run the C and Rust examples against a real nats-server
	bash examples/run.sh

test: ## The one test command: lint, Go race tests (layer and C ABI), C harness, examples, fuzz
	@echo "==> [1/6] lint-go: gofmt and go vet"
	@$(MAKE) --no-print-directory lint-go
	@echo "==> [2/6] lib, server: the C library and nats-server"
	@$(MAKE) --no-print-directory lib server
	@echo "==> [3/6] test-go: go test -race (layer/ and the C ABI through purego)"
	@$(MAKE) --no-print-directory test-go
	@echo "==> [4/6] test-c: the C harness, fork guard and valgrind"
	@$(MAKE) --no-print-directory test-c
	@echo "==> [5/6] examples: C and Rust"
	@$(MAKE) --no-print-directory examples
	@echo "==> [6/6] fuzz-smoke: every fuzz target for $(FUZZTIME)"
	@$(MAKE) --no-print-directory fuzz-smoke
	@echo "==> all tests passed"

clean: ## Remove build/
	rm -rf $(BUILD)

# Planned targets, added by later issues (not defined yet, on purpose):
#   demo    build the library and nats-server, then run the Django chat example against them
#   bench   run the benchmarks against the reference layer, channels_redis and the in-memory layer
#   wheels  build and check the platform wheels of the Python package
