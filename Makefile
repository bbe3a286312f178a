# decodeplane — the decode-side control plane for PD-disaggregated LLM serving.
# `make help` lists the targets.

GO        ?= go
BIN       := $(CURDIR)/bin
PROTOC    ?= protoc
PROTO_DIR := proto
PROTOS    := $(shell find $(PROTO_DIR) -name '*.proto' | sort)
# VERSION: the release tag (git describe --tags: v0.4.0, or v0.4.0-3-g1a2b3c4 past
# it), v0.0.0-dev without one; COMMIT: the short commit. Both go into every
# binary (`decodeplane version`); without them a binary reads Go's VCS stamp.
VERSION   ?= $(shell git describe --tags --dirty 2>/dev/null || echo v0.0.0-dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# CONFIG: a configuration file for make run (default: none, the built-in
# defaults, which deploy/local/decodeplane.yaml documents).
CONFIG    ?=
# ETCD_DATA_DIR: a data directory for make dev-etcd, kept across runs
# (default: none, a temporary directory removed on exit).
ETCD_DATA_DIR ?=

export GOTOOLCHAIN := local

.PHONY: help build run run-demo run-traced demo demo-traced demo-fleet dev-etcd test test-short python-test fuzz fuzz-smoke check fmt fmt-check vet proto proto-check proto-python proto-check-python tidy-check bench faults jaeger jaeger-build deploy-check clean

# help colours the target names only on a terminal, and never with NO_COLOR
# set (https://no-color.org), so that `make help | less` or a log stays clean.
help: ## Show this help.
	@if [ -t 1 ] && [ -z "$$NO_COLOR" ]; then on='\033[36m'; off='\033[0m'; else on=; off=; fi; \
	awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %s%-12s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

build: ## Build the binaries into bin/.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

run: build ## Run the daemon with the embedded defaults (simulated transfers, in-memory state).
	@echo "decodeplane: gRPC on 127.0.0.1:7600, metrics on http://127.0.0.1:7601/metrics"
	@echo "  watch rooms:   $(BIN)/decodectl rooms -w   (in another terminal; 'make demo' pushes traffic)"
	@echo "  traces:        'make jaeger' in another terminal, then 'make run-traced' and 'make demo-traced'; API on http://127.0.0.1:16686"
	$(BIN)/decodeplane serve $(if $(CONFIG),--config $(CONFIG))

run-demo: build ## Run the daemon for the tour: slow transfers, a small KV pool (deploy/local/demo.yaml).
	@echo "decodeplane (tour settings, deploy/local/demo.yaml): gRPC on 127.0.0.1:7600, metrics on http://127.0.0.1:7601/metrics"
	@echo "  next: 'make demo' in a second terminal, 'bin/decodectl rooms -w' in a third"
	$(BIN)/decodeplane serve --config deploy/local/demo.yaml

run-traced: build ## Like run, exporting traces to a local Jaeger (make jaeger) on 127.0.0.1:4317.
	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 $(BIN)/decodeplane serve $(if $(CONFIG),--config $(CONFIG))

# The demo is the benchmark's simulated fleet at a steady 3 rooms/s, each
# prefill rank sending 16-page chunks (several per room). Its
# report is cut to the rooms (what was opened, succeeded, failed, why): the
# latency, CPU and allocation figures are the benchmark's (BENCHMARKS.md).
# The filter ignores Ctrl-C, so that it still prints the summary the fleet
# writes after the rooms in flight finished.
DEMO := $(BIN)/decodeplane bench --target 127.0.0.1:7600 --rate 3 --duration 0 --prefill-ranks 2 --concurrency 16 --chunk-pages 16
DEMO_REPORT := (trap '' INT; exec awk '/^latency/ { stop = 1 } !stop && !/^  (layout|api|machine) / { print; fflush() }')
demo demo-traced demo-fleet: SHELL := bash
demo demo-traced demo-fleet: .SHELLFLAGS := -o pipefail -c

demo: build ## Push 3 rooms/s (simulated prefills + decode engine) at make run-demo or make run.
	@echo "demo: a simulated prefill (2 ranks) and decode engine open 3 rooms/s at 127.0.0.1:7600 until Ctrl-C"
	@$(DEMO) | $(DEMO_REPORT)

demo-traced: build ## Like demo, with the fleet's spans in Jaeger too: one trace per request (make run-traced).
	@echo "demo: a simulated prefill (2 ranks) and decode engine open 3 rooms/s at 127.0.0.1:7600 until Ctrl-C, traced to 127.0.0.1:4317"
	@OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 $(DEMO) | $(DEMO_REPORT)

demo-fleet: build ## Like demo, over every daemon of 127.0.0.1:7600's fleet: the prefill registers through 7600 only and is told only each room (docs/fleet.md).
	@echo "demo-fleet: a simulated prefill (2 ranks, registered through 127.0.0.1:7600 only) and a decode engine per daemon of its fleet open 3 rooms/s until Ctrl-C"
	@$(DEMO) --fleet | $(DEMO_REPORT)

dev-etcd: build ## Run a single-member etcd on 127.0.0.1:2379 for a fleet on one machine (development only; ETCD_DATA_DIR=dir keeps the data).
	$(BIN)/decodeplane-dev-etcd $(if $(ETCD_DATA_DIR),--data-dir $(ETCD_DATA_DIR))

bench: build ## Benchmark the control path: the unary API against bare gRPC, then the streams (see BENCHMARKS.md).
	$(BIN)/decodeplane bench --api unary --rooms 100000 --concurrency 256
	$(BIN)/decodeplane bench --api stream --rooms 100000 --concurrency 256

faults: build ## Run every fault scenario's full variant against the real binaries (decodeplane faults --full; TESTING.md).
	$(BIN)/decodeplane faults --full

jaeger-build: $(BIN)/jaeger ## Build Jaeger v2 (v1.76.0) from tools/jaeger into bin/jaeger (~6 min cold).

$(BIN)/jaeger: tools/jaeger/go.mod tools/jaeger/go.sum
	cd tools/jaeger && $(GO) build -o $(BIN)/jaeger github.com/jaegertracing/jaeger/cmd/jaeger

jaeger: $(BIN)/jaeger ## Run Jaeger all-in-one (memory storage): OTLP gRPC :4317, query API/UI :16686.
	$(BIN)/jaeger

# The tracing end-to-end tests (cmd/decodeplane TestE2EJaeger*) need a Jaeger
# binary: DECODEPLANE_JAEGER_BIN, else bin/jaeger (make jaeger-build). Without
# one they skip, and make test says so before and after the run.
JAEGER_BIN := $(or $(DECODEPLANE_JAEGER_BIN),$(BIN)/jaeger)
JAEGER_NOTE := echo "make test: no Jaeger binary at $(JAEGER_BIN): the tracing end-to-end tests (TestE2EJaeger*) are skipped. To include them: make jaeger-build (~6 min once), then make test (or DECODEPLANE_JAEGER_BIN=/path/to/jaeger make test)."

test: ## Run every test with the race detector, then the Python client's (what CI runs; says so when it skips the Jaeger tests).
	@[ -x "$(JAEGER_BIN)" ] || $(JAEGER_NOTE)
	@echo "$(GO) test -race -count=1 ./..."; $(GO) test -race -count=1 ./...; rc=$$?; [ -x "$(JAEGER_BIN)" ] || $(JAEGER_NOTE); [ $$rc -eq 0 ] || exit $$rc
	@$(MAKE) --no-print-directory python-test

# The Python package (python/, docs/python.md), tested against the daemon
# binary with Debian's interpreter and packages (python3-grpcio,
# python3-protobuf: .ci/run). PYTHON=... picks another interpreter.
PYTHON ?= /usr/bin/python3

python-test: build ## Run the Python client's tests (python/tests) against bin/decodeplane.
	cd python && DECODEPLANE_BIN=$(BIN)/decodeplane PYTHONPATH=src $(PYTHON) -m unittest discover -s tests -t . -v

test-short: ## Run the fast tests without the race detector.
	$(GO) test -short -count=1 ./...

# Fuzz targets (native Go fuzzing; TESTING.md records the runs). go test
# -fuzz takes one target per run, so fuzz loops over every FuzzXxx of
# FUZZ_PKGS. FUZZTIME is per target: a duration (60s) or a count (1000000x).
FUZZTIME      ?= 60s
# FUZZSMOKETIME is a count, not a duration: when a duration runs out while
# the engine minimizes or shuts a worker down, go test -fuzz can report
# "context deadline exceeded" as a failure on a loaded machine (seen in CI).
FUZZSMOKETIME ?= 5000x
FUZZ_PKGS     := ./proto/decodeplane/v1 ./proto/decodeplane/transfer/v1 ./server/grpcdecode ./cmd/decodeplane

fuzz: ## Run every fuzz target for FUZZTIME each (default 60s; FUZZTIME=1000000x for a count).
	@set -e; for pkg in $(FUZZ_PKGS); do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "==> $$pkg $$t (-fuzztime $(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

fuzz-smoke: ## Run every fuzz target for FUZZSMOKETIME (default 5000x) each: what CI runs.
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZSMOKETIME)

# The deployment artifacts (deploy/kubernetes, deploy/container,
# deploy/systemd), checked by the deploy/check module: its own go.mod, so
# that the daemon's never pulls Kubernetes. Go only: kustomize runs
# in-process, the daemon and decodectl are built from this repository.
deploy-check: ## Render and strictly check the Kubernetes overlays, the Dockerfile and the systemd unit.
	cd deploy/check && $(GO) vet ./... && $(GO) test -count=1 ./...

check: fmt-check vet proto-check tidy-check test deploy-check ## Everything CI checks.

fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

fmt-check: ## Fail if gofmt would change a file.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet: ## go vet.
	$(GO) vet ./...

# The protoc plugins are the ones go.mod's tool block pins: `go tool -n NAME`
# builds each once into Go's build cache and prints its path, so generating
# writes nothing but the generated files into the checkout. PLUGIN_PATHS, at
# the start of a recipe's shell, sets $gen_go, $gen_grpc, $gen_gw, $gen_oa.
PLUGIN_PATHS = gen_go=$$($(GO) tool -n protoc-gen-go) && gen_grpc=$$($(GO) tool -n protoc-gen-go-grpc) && \
	gen_gw=$$($(GO) tool -n protoc-gen-grpc-gateway) && gen_oa=$$($(GO) tool -n protoc-gen-openapiv2)

# The JSON-over-HTTP gateway and its OpenAPI document: decodeplane.v1 only,
# bound by the gRPC API configuration GW_RULES (no googleapis protos needed).
GW_PROTOS := $(patsubst $(PROTO_DIR)/%,%,$(wildcard $(PROTO_DIR)/decodeplane/v1/*.proto))
GW_RULES  := $(PROTO_DIR)/decodeplane/v1/decodeplane_http.yaml
# pb_gen OUT: generate the protobuf and gRPC code into OUT.
pb_gen = $(PROTOC) -I $(PROTO_DIR) \
		--plugin=protoc-gen-go=$$gen_go --go_out=$(1) --go_opt=paths=source_relative \
		--plugin=protoc-gen-go-grpc=$$gen_grpc --go-grpc_out=$(1) --go-grpc_opt=paths=source_relative \
		$(patsubst $(PROTO_DIR)/%,%,$(PROTOS))
# gw_gen OUT: generate the gateway into OUT and the OpenAPI document into OUT/decodeplane/v1.
gw_gen = $(PROTOC) -I $(PROTO_DIR) \
		--plugin=protoc-gen-grpc-gateway=$$gen_gw --grpc-gateway_out=$(1) \
		--grpc-gateway_opt=paths=source_relative,grpc_api_configuration=$(GW_RULES) \
		--plugin=protoc-gen-openapiv2=$$gen_oa --openapiv2_out=$(1)/decodeplane/v1 \
		--openapiv2_opt=grpc_api_configuration=$(GW_RULES),allow_merge=true,merge_file_name=decodeplane \
		$(GW_PROTOS)

# The Python package's stubs: protobuf modules, their typing stubs (.pyi)
# and gRPC stubs of every proto, generated with protoc's Python output and
# grpc_python_plugin (Debian's protobuf-compiler-grpc), into python/src.
# -I $(PROTO_DIR) lays them out as the package's own subpackages
# (decodeplane/v1/rooms_pb2.py is decodeplane.v1.rooms_pb2), so protoc's
# absolute imports ("from decodeplane.v1 import common_pb2") work as
# generated. The status details the client decodes (google.rpc.Status,
# ErrorInfo, RetryInfo) come from wire-compatible copies in
# python/proto_vendor, under a private package.
PY_SRC       := python/src
PY_VENDOR    := python/proto_vendor
PY_VENDORED  := $(shell find $(PY_VENDOR) -name '*.proto' 2>/dev/null | sort)
GRPC_PYTHON_PLUGIN ?= $(or $(shell command -v grpc_python_plugin 2>/dev/null),/usr/bin/grpc_python_plugin)
PY_GENERATED := -name '*_pb2.py' -o -name '*_pb2.pyi' -o -name '*_pb2_grpc.py'
# py_gen OUT: generate the Python stubs into OUT.
py_gen = $(PROTOC) -I $(PROTO_DIR) --python_out=$(1) --pyi_out=$(1) \
		--plugin=protoc-gen-grpc=$(GRPC_PYTHON_PLUGIN) --grpc_out=$(1) \
		$(patsubst $(PROTO_DIR)/%,%,$(PROTOS)) && \
	$(PROTOC) -I $(PY_VENDOR) --python_out=$(1) --pyi_out=$(1) $(patsubst $(PY_VENDOR)/%,%,$(PY_VENDORED))

# proto-python (part of proto) regenerates the Python stubs, removing those
# of protos that are gone; proto-check-python (part of proto-check) fails
# when they are stale.
proto-python:
	mkdir -p $(PY_SRC)
	find $(PY_SRC) \( $(PY_GENERATED) \) -delete
	$(call py_gen,$(PY_SRC))

proto-check-python:
	@tmp=$$(mktemp -d); \
	$(call py_gen,$$tmp) || { echo "proto-check: generating failed (are protoc and grpc_python_plugin installed? see .ci/run)"; rm -rf $$tmp; exit 1; }; \
	( cd $$tmp && find . $(PY_GENERATED) | sort ) > $$tmp/.gen && \
	( cd $(PY_SRC) && find . $(PY_GENERATED) | sort ) > $$tmp/.have && \
	if ! diff -q $$tmp/.gen $$tmp/.have >/dev/null || ! for f in $$(cat $$tmp/.gen); do cmp -s $$tmp/$$f $(PY_SRC)/$$f || { echo "stale: $(PY_SRC)/$$f"; exit 1; }; done; then \
		echo "generated Python stubs are stale: run 'make proto' and commit the result"; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp; echo "proto-check: generated Python code is current"

proto: proto-python ## Regenerate the protobuf, gRPC and gateway code, the OpenAPI document and the Python stubs.
	@echo 'protoc: $(PROTO_DIR) (plugins from go.mod, built into the Go build cache)'
	@$(PLUGIN_PATHS) && $(call pb_gen,$(PROTO_DIR)) && $(call gw_gen,$(PROTO_DIR))

proto-check: proto-check-python ## Fail if the generated code (Go and Python) or the OpenAPI document is stale.
	@tmp=$$(mktemp -d); \
	{ $(PLUGIN_PATHS) && $(call pb_gen,$$tmp) && $(call gw_gen,$$tmp); } || { echo "proto-check: generating failed (is protoc installed? see .ci/run)"; rm -rf $$tmp; exit 1; }; \
	( cd $$tmp && find . -name '*.go' -o -name '*.swagger.json' | sort ) > $$tmp/.gen && \
	( cd $(PROTO_DIR) && find . -name '*.pb.go' -o -name '*.pb.gw.go' -o -name '*.swagger.json' | sort ) > $$tmp/.have && \
	if ! diff -q $$tmp/.gen $$tmp/.have >/dev/null || ! for f in $$(cat $$tmp/.gen); do cmp -s $$tmp/$$f $(PROTO_DIR)/$$f || { echo "stale: $$f"; exit 1; }; done; then \
		echo "generated protobuf code or OpenAPI document is stale: run 'make proto' and commit the result"; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp; echo "proto-check: generated code is current"

tidy-check: ## Fail if go.mod/go.sum are not tidy (the main module and deploy/check).
	$(GO) mod tidy -diff
	cd deploy/check && $(GO) mod tidy -diff

clean: ## Remove build outputs.
	rm -rf $(BIN)
