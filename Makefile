# `make export` and `make test` are the whole set-up on a fresh machine: the first target that
# needs the virtual environment creates it and installs the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?=
OUT    ?= artifacts
BUILD  := $(BIN)/exporter build $(if $(MODEL),--checkpoint $(MODEL)) --out $(OUT)

.PHONY: export android ios linux-arm64 reference release server bench bench-peer sweep test test-fast test-large lint clean artifacts arm64-check arm64-tools

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Default device targets for the shipped model (or MODEL=<checkpoint folder>).
export: android ios linux-arm64

android: $(VENV)/.installed
	$(BUILD) android-arm64

ios: $(VENV)/.installed
	$(BUILD) ios-arm64

linux-arm64: $(VENV)/.installed
	$(BUILD) linux-arm64

reference: $(VENV)/.installed
	$(BUILD) reference-fp32

# The default artifacts as an app-team release in OUT/release (every artifact under OUT verified
# first; one deterministic archive per target, index.json, a Hub-style folder, SHA256SUMS).
release: export
	$(BIN)/exporter release $(OUT) --out $(OUT)/release \
	    $(if $(wildcard $(OUT)/arm64-check/report.json),--arm64-report $(OUT)/arm64-check/report.json)
	cd $(OUT)/release && sha256sum -c --quiet SHA256SUMS

# Every job of `exporter plan` (MODELS x RECIPES, default: the shipped model x every recipe) as its own
# make target, so `make artifacts -j2` runs two builds at a time; a job whose build key matches a
# finished artifact (in OUT or $EXPORTER_CACHE) is reused in well under a second.
MODELS  ?=
RECIPES ?=
artifacts: $(VENV)/.installed
	mkdir -p $(OUT)
	$(BIN)/exporter plan --make --out $(OUT) $(foreach m,$(MODELS),--models $(m)) \
	    $(foreach r,$(RECIPES),--recipes $(r)) > $(OUT)/.jobs.mk
	$(MAKE) -f $(OUT)/.jobs.mk EXPORTER=$(abspath $(BIN)/exporter)

# x86 server targets (AOTInductor .pt2) and the reference C++ consumer.
server: $(VENV)/.installed
	$(BUILD) server-x86-int4
	$(BUILD) server-x86-fp32
	$(MAKE) -C backends/aoti PYTHON=$(abspath $(BIN)/python)

# Benchmark the built artifacts of MODEL against eager PyTorch (artifacts/bench/bench.{json,md,png}).
bench: $(VENV)/.installed
	$(BIN)/exporter bench $(wildcard $(OUT)/$(notdir $(or $(MODEL),pycode-4m))/*/) \
	    $(if $(MODEL),--checkpoint $(MODEL)) --export android-arm64 --out $(OUT)/bench

# Race ExecuTorch's own export_llm on the same checkpoint, with RECIPE's settings (default
# android-arm64); both sides are exported afresh every time. SHAPES="smollm2-135m llama-3.2-1b" adds
# random-weight checkpoints of those shapes (no perplexity; each takes many minutes on 2 cores).
SHAPES ?=
RECIPE ?=
bench-peer: $(VENV)/.installed
	$(BIN)/python -m tools.peer $(if $(MODEL),--checkpoint $(MODEL)) $(if $(RECIPE),--recipe $(RECIPE)) \
	    $(foreach s,$(SHAPES),--shape $(s)) --out $(OUT)/bench/peer

# Perplexity ratio to fp32 (prose, code) against file size of MODEL's built artifacts, plus the peer
# race's export_llm program when PEER names its peer.json (default: the last bench-peer's, if any).
PEER ?= $(wildcard $(OUT)/bench/peer/peer.json)
sweep: $(VENV)/.installed
	$(BIN)/exporter sweep $(wildcard $(OUT)/$(notdir $(or $(MODEL),pycode-4m))/*/) \
	    $(if $(MODEL),--checkpoint $(MODEL)) $(if $(PEER),--peer $(PEER)) --out $(OUT)/bench/sweep

# Run the default device artifacts' .pte files on an emulated aarch64 (qemu-user, one process per CPU
# model) and compare greedy tokens and logits with this machine's run (report outside the sealed
# artifact folders). Needs qemu-user-static and binutils-aarch64-linux-gnu; the aarch64 sysroot is
# built once into $EXPORTER_ARM64_ROOT (default ~/.cache/exporter/arm64).
ARM64_CPUS ?= neoverse-n1
arm64-check: export arm64-tools
	$(BIN)/python -m tools.arm64 \
	    $(foreach r,android-arm64 ios-arm64 linux-arm64,$(OUT)/$(notdir $(or $(MODEL),pycode-4m))/$(r)) \
	    $(foreach c,$(ARM64_CPUS),--cpu $(c)) --out $(OUT)/arm64-check/report.json

# qemu-user and the cross binutils the ARM64 check needs (Debian packages), installed when missing;
# `make test` needs them too (its slow ARM64 test), so a fresh machine is set up by make alone.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
arm64-tools:
	@command -v qemu-aarch64-static >/dev/null && command -v aarch64-linux-gnu-readelf >/dev/null || { \
	    $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq --no-install-recommends qemu-user-static binutils-aarch64-linux-gnu; }

# Everything, slow end-to-end builds included, but for the large real-model builds (test-large).
test: $(VENV)/.installed arm64-tools
	$(BIN)/python -m pytest -q -m "not large"

# The device recipe on Qwen2.5-Coder-0.5B-Instruct, tuned and untuned, and on Gemma 3 270M (about
# 30 minutes on 2 cores).
test-large: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m large

test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(VENV)/.installed
	$(BIN)/ruff check exporter backends tools tests
	$(BIN)/ruff format --check exporter backends tools tests
	$(BIN)/mypy

clean:
	find $(OUT) -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
	rm -rf build backends/aoti/build .pytest_cache .mypy_cache .ruff_cache
