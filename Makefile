# attention-server: build, run and test.
#
#   make            build build/attention-server (installs nothing)
#   make SANITIZE=1 build the AddressSanitizer + UBSan variant into build/asan/
#   make run        install what is missing, build, serve on 127.0.0.1:8080
#   make test       install what is missing, build (plain and sanitized), run every test;
#                   SUITES="unit v2" runs only those suites; T=SUBSTR, in every suite, only
#                   the tests whose name contains SUBSTR (the top of tests/run.sh says what
#                   a name is in each suite; one with no match prints "0 passed, 0 failed")
#   make test-build install what is missing, build everything `make test` runs
#   make test-browser  the visualizer (GET /viz) in headless chromium
#   make lint-api, check-api-answers, lint-k8s   the OpenAPI file, the answers against it,
#                   the Kubernetes manifests (suites of `make test` that also run alone)
#   make bench      every benchmark against its competing implementation, one table of ratios
#   make bench-mhd  the server with 1, 2, 4 and 8 I/O threads measured against each other
#   make soak       three minutes at 256 connections: no errors, memory and descriptors flat
#   make fuzz       libFuzzer on everything a request body reaches, for FUZZ_SECONDS
#   make image, image-balancer, test-container, test-compose   the container image, the
#                   balancer, and their suites (docker/)
#   make clean      remove build/
#
# Installing: what is missing here (Debian packages through apt-get, the pinned npm folders
# through npm ci) is installed by scripts/provision.sh PROFILE..., never by a rule of this file.
# A goal that installs and then compiles runs the script once, as its provision-PROFILE
# prerequisite, and compiles in a recursive make that starts only when it is done: with -j
# no compile starts before the packages are there, and no two apt-gets run at once.
#
#   provision-build      (make deps)           run, soak, bench-mhd, fuzz
#   provision-test                             test, test-build
#   provision-bench                            bench
#   provision-container  (make container-deps) image, image-balancer, the container suites
#
# and the targets that install one part: checkpoint-deps (checkpoint), browser-deps (browser),
# ort-deps (ort), install-podman (podman), lint-api (api), check-api-answers (build prism),
# lint-k8s (k8s), test-browser and viz-screenshots (build browser).  When nothing is missing
# the script returns at once, so the suites that `make test` runs through make (lint-api,
# check-api-answers, lint-k8s, test-browser) install nothing a second time.

CC      ?= cc
PKGS    := libmicrohttpd jansson openblas zlib
PROVISION := bash scripts/provision.sh

CSTD    := -std=c11 -D_POSIX_C_SOURCE=200809L
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wformat=2 -Wno-format-nonliteral
COMMIT  := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
DATE    := $(shell git log -1 --format=%cI 2>/dev/null || echo unknown)
DEFS    := -DATTN_BUILD_COMMIT='"$(COMMIT)"' -DATTN_BUILD_DATE='"$(DATE)"'
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

ifeq ($(SANITIZE),1)
BUILD   := build/asan
OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
else
BUILD   := build
OPT     := -O2 -g
endif

CFLAGS_ALL = $(CSTD) $(OPT) $(WARN) $(DEFS) $(PKG_CFLAGS) -MMD -MP
LDFLAGS_ALL = $(OPT) $(PKG_LIBS) -lpthread -lm

# Every server/MODULE/*.c but the build-machine generator is part of the library that the
# server (server/main.c on top), the unit tests and the benchmarks link: a new file or a new
# module folder needs no edit here (docs/design.md has the modules and their layers).
LIB_SRCS := $(sort $(filter-out server/viz/viz_embed.c,$(wildcard server/*/*.c)))
LIB_OBJS := $(LIB_SRCS:server/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/viz_assets.o
# The unit tests and the fuzzers use a test build of the library: the modules that define
# test hooks (server/core/test_hooks.h) are compiled again with -DATTN_TESTING into
# $(BUILD)/obj/testing/.  The server links none of them.
HOOKED := core/mem json/json_fast store/store_io kernel/attention_fused
TEST_LIB_OBJS := $(filter-out $(HOOKED:%=$(BUILD)/obj/%.o),$(LIB_OBJS)) \
                 $(HOOKED:%=$(BUILD)/obj/testing/%.o)
UNIT_SRCS := $(wildcard tests/unit/*.c) tests/ref/reference.c
UNIT_OBJS := $(UNIT_SRCS:tests/%.c=$(BUILD)/obj/tests/%.o)
# The integration harness (tests/integration/itest.h) that every integration program links.
HARNESS_SRCS := tests/integration/harness.c tests/integration/itest_server.c \
                tests/integration/itest_expect.c tests/integration/itest_sets.c \
                tests/integration/client.c tests/ref/reference.c
HARNESS_DEPS := $(HARNESS_SRCS) tests/integration/itest.h tests/integration/client.h tests/ref/reference.h
ITEST_SRCS := $(filter-out $(HARNESS_SRCS),$(wildcard tests/integration/itest*.c))

SERVER  := $(BUILD)/attention-server
UNIT    := $(BUILD)/unit-tests
ITEST   := build/itest

# provision-PROFILE: installs what PROFILE needs and is missing (scripts/provision.sh); its
# rule follows `all`.  `make deps` is provision-build under its older name.
PROVISION_GOALS := provision-build provision-test provision-bench provision-container

.PHONY: all run test test-build deps checkpoint-deps lint-api bench bench-mhd fuzz clean container-deps soak \
        install-podman image image-balancer test-container test-compose lint-k8s \
        browser-deps test-browser viz-screenshots ort-deps \
        check-api-answers $(PROVISION_GOALS)
all: $(SERVER)

$(PROVISION_GOALS): provision-%:
	@$(PROVISION) $*

deps: provision-build

$(BUILD)/obj/%.o: server/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(EXTRA_$(notdir $*)) -Iserver -c $< -o $@

# Only the softmax exponentials are built with -ffast-math (vector exp from libmvec);
# see server/kernel/attention_exp.h for why that is safe there.
EXTRA_attention_exp := -O3 -ffast-math

# attention.c's passes over whole arrays (float copies, the division of each output row by its
# sum, the finite checks) are loops that -O2's cheapest vectorizer leaves scalar, having no
# trip count known in advance; the full cost model vectorises them (no change to the results:
# nothing is reassociated without -ffast-math).
EXTRA_attention := -fvect-cost-model=dynamic

# The fused attention kernel, one object per instruction set (server/kernel/attention_fused.h); the
# sanitized build and the unit tests take the same flags through this one rule.  Contracting
# a * b + c into an FMA is what the kernel is written for.
FUSED_FLAGS := -O3 -ffp-contract=fast
EXTRA_attention_fused_avx512 := $(FUSED_FLAGS) -mavx512f -mfma
EXTRA_attention_fused_avx2 := $(FUSED_FLAGS) -mavx2 -mfma
EXTRA_attention_fused_portable := $(FUSED_FLAGS)
# The unit tests' avx512-on-avx2: the avx512 path's source at its widths, built for AVX2
# (tests/unit/kernel_avx512_on_avx2.c), so that a CPU without AVX-512 runs it too.  Its
# 64-byte vectors are passed only between the file's own inlined functions, so the
# warning that their ABI differs without AVX-512 (-Wpsabi) concerns no call.
EXTRA_kernel_avx512_on_avx2 := $(FUSED_FLAGS) -mavx2 -mfma -Wno-psabi

# The visualizer's page and the golden examples, built into the binary: a small generator
# (server/viz/viz_embed.c, built for the build machine) writes them as C arrays into
# build/gen/viz_assets.c; server/viz/viz.h declares them.  The page is served as /viz and the
# examples as /viz/examples/NAME.json.
VIZ_FILES := $(sort $(wildcard server/viz/page/*.html server/viz/page/*.css server/viz/page/*.js))
VIZ_EXAMPLES := $(sort $(wildcard tests/fixtures/*.json))
VIZ_GEN := build/gen/viz_assets.c

build/viz-embed: server/viz/viz_embed.c
	@mkdir -p build
	$(CC) $(CSTD) -O2 $(WARN) $< -o $@

$(VIZ_GEN): build/viz-embed $(VIZ_FILES) $(VIZ_EXAMPLES)
	@mkdir -p $(dir $@)
	build/viz-embed $(foreach f,$(VIZ_FILES),$(notdir $(f))=$(f)) \
	    $(foreach f,$(VIZ_EXAMPLES),examples/$(notdir $(f))=$(f)) > $@.tmp
	mv $@.tmp $@

$(BUILD)/obj/testing/%.o: server/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DATTN_TESTING -Iserver -c $< -o $@

$(BUILD)/obj/viz_assets.o: $(VIZ_GEN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Iserver -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(EXTRA_$(notdir $*)) -DATTN_TESTING -Iserver -Itests -c $< -o $@

$(SERVER): $(LIB_OBJS) $(BUILD)/obj/main.o
	$(CC) $^ -o $@ $(LDFLAGS_ALL)

$(UNIT): $(TEST_LIB_OBJS) $(UNIT_OBJS)
	$(CC) $^ -o $@ $(LDFLAGS_ALL)

# The integration runner is an ordinary client: never sanitized, built once.
$(ITEST): $(ITEST_SRCS) $(HARNESS_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests $(ITEST_SRCS) $(HARNESS_SRCS) -o $@ -ljansson -lm

# The v2 protocol suite (tests/integration/v2test.c): also an ordinary client, built once.
build/v2test: tests/integration/v2test.c $(HARNESS_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests tests/integration/v2test.c $(HARNESS_SRCS) -o $@ -ljansson -lm

build/crashtest: tests/integration/crashtest.c $(HARNESS_DEPS)
	@mkdir -p build
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests tests/integration/crashtest.c $(HARNESS_SRCS) -o $@ \
		-ljansson -lpthread -lm

# Slow, heavy and impatient clients against the real server (raw sockets, loopback only).
build/hostile: tests/integration/hostile.c tests/integration/rawhttp.c tests/integration/rawhttp.h \
		$(HARNESS_DEPS)
	@mkdir -p build
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests tests/integration/hostile.c tests/integration/rawhttp.c \
		$(HARNESS_SRCS) -o $@ -ljansson -lm

# The soak test (`make soak`, not part of `make test`): three runs of SOAK_SECONDS at
# SOAK_CONNECTIONS connections; see tests/soak/soak.c.
SOAK_SECONDS ?= 60
SOAK_CONNECTIONS ?= 256
build/soak: tests/soak/soak.c tests/integration/rawhttp.c tests/integration/rawhttp.h \
		tests/integration/client.c tests/integration/client.h
	@mkdir -p build
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests tests/soak/soak.c tests/integration/rawhttp.c \
		tests/integration/client.c -o $@ -lpthread -lm

soak: provision-build
	@$(MAKE) --no-print-directory SANITIZE= build/attention-server build/soak
	build/soak --server build/attention-server --seconds $(SOAK_SECONDS) \
	    --connections $(SOAK_CONNECTIONS)

# Three servers on one shared weight-set directory (tests/integration/sharetest.c).
build/sharetest: tests/integration/sharetest.c $(HARNESS_DEPS)
	@mkdir -p build
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests tests/integration/sharetest.c $(HARNESS_SRCS) -o $@ \
		-ljansson -lpthread -lm

build/ref_check: tests/ref/ref_check.c tests/ref/reference.c tests/ref/reference.h
	@mkdir -p build
	$(CC) $(CSTD) -O2 -g $(WARN) tests/ref/ref_check.c tests/ref/reference.c -o $@ -ljansson -lm

# The container tools (docker/, `make image`, `make test-container`): jq and curl for the
# container tests, and podman with what it needs where no Docker engine answers
# (scripts/provision.sh says which packages and why).  install-podman installs podman even
# where Docker answers.
container-deps: provision-container

install-podman:
	@$(PROVISION) podman

# The image (docker/Dockerfile), built with Docker or podman, whichever is present, and the
# container suite, which builds it and uses it as a user would (tests/container/image.sh).
# The suite installs what it needs through container-deps, and skips, saying why, where no
# engine can run a container.
image: provision-container
	@bash docker/build-image.sh server

test-container:
	@bash tests/container/image.sh

# The nginx load balancer of docker/compose.yaml, and the suite that brings the compose file
# up, kills a replica under load and checks that clients do not notice
# (tests/container/compose.sh).
image-balancer: provision-container
	@bash docker/build-image.sh balancer

test-compose:
	@bash tests/container/compose.sh

run: provision-build
	@$(MAKE) --no-print-directory all
	@mkdir -p data
	./$(SERVER) --data-dir data

# The checkpoint suite (tests/checkpoints/) builds its models with Debian's PyTorch and NumPy,
# run by /usr/bin/python3 (a python3 earlier on PATH may not see Debian's packages).
checkpoint-deps:
	@$(PROVISION) checkpoint

test-build: provision-test
	@$(MAKE) --no-print-directory $(SERVER) $(UNIT) $(ITEST) build/ref_check build/crashtest build/v2test \
	    build/hostile build/sharetest
	@$(MAKE) --no-print-directory SANITIZE=1 build/asan/attention-server build/asan/unit-tests

test: test-build
	@bash tests/run.sh $(if $(T),--filter '$(T)') $(SUITES)

# Benchmarks (tests/bench/): always the optimised build, whatever SANITIZE says; results go to
# build/bench/results.  provision-bench installs what `make test` needs, ONNX Runtime
# (ort-deps), and the Debian packages the benchmark scripts use (python3-numpy,
# python3-flask, gunicorn, wrk), which tests/bench/run.sh, run alone, installs itself when
# they are missing.  The visualizer's benchmark needs chromium and puppeteer-core
# (browser-deps).  BENCH_ARGS=--quick for a smoke run.
BENCH_BINS := build/bench/bench-kernel build/bench/bench-json build/bench/bench-store-load \
              build/bench/slow-clients build/bench/bench-gemm

build/obj/bench/%.o: tests/bench/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Iserver -Itests -c $< -o $@

build/bench/bench-%: $(LIB_OBJS) build/obj/bench/bench_%.o
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDFLAGS_ALL)

# The FMA peak (tests/bench/fma_peak.c), the ceiling both print.
build/bench/bench-kernel build/bench/bench-gemm: build/obj/bench/fma_peak.o

build/bench/bench-store-load: $(LIB_OBJS) build/obj/bench/bench_store_load.o
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDFLAGS_ALL)

build/bench/slow-clients: tests/bench/slow_clients.c tests/integration/rawhttp.c \
		tests/integration/client.c
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) -O2 -g $(WARN) -Itests $^ -o $@ -lm

# ONNX Runtime for the kernel's peer rows (tests/bench/ort_bench.mjs), pinned by
# tests/bench/ort/package-lock.json, installed with --ignore-scripts: the package's install
# script only fetches GPU libraries from a host these machines cannot reach; the CPU library
# is in the package.
ort-deps:
	@$(PROVISION) ort

bench: provision-bench
	@$(MAKE) --no-print-directory SANITIZE= build/attention-server $(BENCH_BINS)
	@bash tests/bench/run.sh $(BENCH_ARGS)

# The server with a fixed number of epoll I/O threads (1, 2, 4, 8), each built with its own
# http.c (HTTP_POOL_THREADS fixes the number, which --io-threads otherwise chooses);
# `make bench-mhd` measures them against each other (tests/bench/bench_mhd.sh).  Only the
# number of I/O threads differs: in every variant a large computation runs on the workers
# and a small request may be answered on the I/O thread that read it (see server/http/http.c).
MHD_VARIANTS := pool1 pool2 pool4 pool8
MHD_DEFS_pool1 := -DHTTP_POOL_THREADS=1
MHD_DEFS_pool2 := -DHTTP_POOL_THREADS=2
MHD_DEFS_pool4 := -DHTTP_POOL_THREADS=4
MHD_DEFS_pool8 := -DHTTP_POOL_THREADS=8

build/bench/mhd/http-%.o: server/http/http.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(MHD_DEFS_$*) -Iserver -c $< -o $@

build/bench/mhd/attention-server-%: $(filter-out build/obj/http/http.o,$(LIB_OBJS)) build/obj/main.o \
		build/bench/mhd/http-%.o
	$(CC) $^ -o $@ $(LDFLAGS_ALL)

.PRECIOUS: build/bench/mhd/http-%.o

bench-mhd: provision-build
	@$(MAKE) --no-print-directory SANITIZE= $(MHD_VARIANTS:%=build/bench/mhd/attention-server-%)
	@bash tests/bench/bench_mhd.sh $(BENCH_ARGS) $(MHD_VARIANTS)

# Fuzzing (libFuzzer, clang, ASan + UBSan): everything a request body reaches, through
# api_handle.  Not part of `make test` (it runs until FUZZ_SECONDS); findings land in build/fuzz.
FUZZ_SECONDS ?= 120
build/fuzz/fuzz-api: $(LIB_SRCS) $(VIZ_GEN) tests/fuzz/fuzz_api.c $(wildcard server/*/*.h server/*/*.inc)
	@mkdir -p build/fuzz/corpus
	clang $(CSTD) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    $(WARN) $(DEFS) -DATTN_TESTING $(PKG_CFLAGS) -Iserver $(LIB_SRCS) $(VIZ_GEN) \
	    tests/fuzz/fuzz_api.c -o $@ \
	    $(PKG_LIBS) -lpthread -lm

# json_fast against jansson alone: any difference aborts (tests/unit/json_fast_check.h).
build/fuzz/fuzz-json-fast: server/json/json_fast.c server/core/mem.c server/json/json_fast.h server/core/mem.h \
                           tests/fuzz/fuzz_json_fast.c tests/unit/json_fast_check.h
	@mkdir -p build/fuzz/corpus-json
	clang $(CSTD) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    $(WARN) $(DEFS) -DATTN_TESTING $(PKG_CFLAGS) -Iserver -Itests/unit server/json/json_fast.c server/core/mem.c \
	    tests/fuzz/fuzz_json_fast.c -o $@ $(PKG_LIBS) -lpthread -lm

fuzz: provision-build
	@$(MAKE) --no-print-directory build/fuzz/fuzz-api build/fuzz/fuzz-json-fast
	cd build/fuzz && ./fuzz-api -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 \
	    -print_final_stats=1 corpus ../../tests/fuzz/corpus
	cd build/fuzz && ./fuzz-json-fast -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 \
	    -print_final_stats=1 corpus-json ../../tests/fuzz/corpus-json

# The OpenAPI linter (Spectral), pinned by api/package-lock.json.  npm writes
# api/node_modules/.package-lock.json on every install, so it serves as the stamp:
# scripts/provision.sh runs npm ci only when node_modules is missing or older than the lock
# file, and so for each pinned npm folder below.
lint-api:
	@$(PROVISION) api
	api/node_modules/.bin/spectral lint --ruleset api/.spectral.yaml --fail-severity=warn api/openapi.yaml

# The server's answers checked against api/openapi.yaml: Stoplight Prism, pinned by
# tests/prism/package-lock.json, runs as a validating proxy in front of the server while
# tests/prism/conformance.mjs sends v1 and v2 requests through it.
check-api-answers:
	@$(PROVISION) build prism
	@$(MAKE) --no-print-directory $(SERVER)
	@node tests/prism/conformance.mjs $(SERVER)

# The Kubernetes manifests in docker/k8s/, validated against the API schemas carried by the
# kubernetes-models package (pinned by tests/k8s/package-lock.json), plus the deployment
# rules in tests/k8s/validate.mjs; every example in tests/k8s/bad/ must be rejected.
lint-k8s:
	@$(PROVISION) k8s
	@node tests/k8s/validate.mjs docker/k8s tests/k8s/bad

# The visualizer's browser tests (tests/browser/viz_test.mjs): Debian's chromium, headless,
# driven by puppeteer-core (pinned by tests/browser/package-lock.json) against the server
# built here.  Both are installed when missing.
browser-deps:
	@$(PROVISION) browser

test-browser:
	@$(PROVISION) build browser
	@$(MAKE) --no-print-directory $(SERVER)
	@node tests/browser/viz_test.mjs --server $(SERVER) --fixtures tests/fixtures $(if $(T),--only '$(T)')

# The pictures of docs/visualizer.md, taken from the page as built here.
viz-screenshots:
	@$(PROVISION) build browser
	@$(MAKE) --no-print-directory SANITIZE= build/attention-server
	@node tests/browser/screenshots.mjs --server build/attention-server --out docs/img

clean:
	rm -rf build

-include $(LIB_OBJS:.o=.d) $(BUILD)/obj/main.d $(UNIT_OBJS:.o=.d) $(HOOKED:%=$(BUILD)/obj/testing/%.d)
-include $(wildcard build/obj/bench/*.d build/bench/mhd/*.d)
