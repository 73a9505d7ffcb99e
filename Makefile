# make test                    go test -race -count=1 ./... in every module of the
#                              repository (the root and each nested go.mod; containertest
#                              only with VALKEY_IMAGE; benchmarks/, benchmarks only, never),
#                              every module even if one fails, with a count per module of
#                              the real-server tests that ran and skipped (scripts/test.sh)
# make lint                    gofmt -l, then go vet, staticcheck and go mod tidy -diff
#                              in every module; fails on any finding
# make integration             the real-server tests alone (./integration, and the
#                              TestIntegration* and TestConformance* tests of the other
#                              packages and modules), with a missing server a failure:
#                              VALKEY_SERVER=path, or valkey-server on PATH
#
# Benchmarks against a real server, in the benchmarks module (benchmarks/):
# see BENCHMARKS.md.
#
#   make bench                 run them all, save benchmarks/bench.txt, summarise
#   make benchstat             summarise an existing benchmarks/bench.txt
#   make bench BENCH=Ratios    run only the benchmarks matching a regexp
#
# The server is found as the tests find one (VALKEY_ADDR, VALKEY_SERVER or
# valkey-server on PATH); without one the run fails instead of skipping.
# ADMIT_BENCH_DELAY sets the delay proxy's one-way delay (default 500us).

SHELL       := bash
BENCH       ?= .
BENCH_COUNT ?= 6
BENCH_TIME  ?= 1s
BENCH_OUT   ?= bench.txt
# benchstat from PATH, else the pinned version through the Go toolchain.
BENCHSTAT   ?= $(shell command -v benchstat 2>/dev/null || echo go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da)
# staticcheck always at this version (not from PATH): its checks change
# between releases. Through the Go toolchain, so a fresh machine needs only Go.
STATICCHECK ?= go run honnef.co/go/tools/cmd/staticcheck@v0.8.2
# make integration's race detector; RACE= runs it without (CI does, on a
# second server, after make test has run the same tests with it).
RACE        ?= -race

.PHONY: test lint integration bench benchstat

# Every module: a nested go.mod is outside the root module's ./...
MODULES     := $(sort $(dir $(shell find . -name go.mod -not -path './.git/*')))

test:
	@bash scripts/test.sh

# Real-server tests live in the root package (limiter_integration_test.go:
# the Limiter's and the conformance suite's runs; and the few that need the
# package's insides) and in ./integration, all named TestIntegration* or
# TestConformance*, behind
# one switch: internal/testserver, which ADMIT_REQUIRE_SERVER=1 makes fail
# without a server.
integration:
	ADMIT_REQUIRE_SERVER=1 go test $(RACE) -count=1 ./integration
	ADMIT_REQUIRE_SERVER=1 go test $(RACE) -count=1 -run '^(TestIntegration|TestConformance)' . ./admithttp/ ./examples/...
	cd admitgrpc && ADMIT_REQUIRE_SERVER=1 go test $(RACE) -count=1 -run '^TestIntegration' ./...
	cd examples/outgress && ADMIT_REQUIRE_SERVER=1 go test $(RACE) -count=1 -run '^TestAdmitConformance$$' ./limits

lint:
	@echo "== gofmt -l"; out=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	@set -e; for m in $(MODULES); do \
	  echo "== go vet, staticcheck, go mod tidy -diff in $$m"; \
	  (cd $$m && go vet ./... && $(STATICCHECK) ./... && go mod tidy -diff); \
	done

bench:
	set -o pipefail; cd benchmarks && ADMIT_REQUIRE_SERVER=1 go test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCH_TIME) -count $(BENCH_COUNT) -timeout 40m ./... | tee $(BENCH_OUT)
	$(MAKE) --no-print-directory benchstat

benchstat:
	@echo "== headline ratios (BenchmarkRatios: designs interleaved)"
	cd benchmarks && $(BENCHSTAT) -filter '.name:Ratios' $(BENCH_OUT)
	@echo "== single calls, by design (vs base = vs AllowOrdered)"
	cd benchmarks && $(BENCHSTAT) -filter '.name:(AllowOrdered OR AllowOrderedOneBucket OR Sequential OR ExecMulti OR Ping)' -col .name -row /net,/path $(BENCH_OUT)
	@echo "== throughput, one shared client (vs base = vs ordered)"
	cd benchmarks && $(BENCHSTAT) -filter '.name:Parallel' -col /impl -row /net,/goroutines $(BENCH_OUT)
