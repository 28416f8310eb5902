# h5tilefs: build, test, demo, benchmark.
#   make test        fmt + clippy + Rust unit tests + integration tests on a real mount
#   make demo        build, mount a generated sample, read it with ls/cat/numpy/od/dd
#   make bench-read  read throughput through the mount vs direct reads (not part of test)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

APT_PKGS := fuse3 libhdf5-dev pkg-config hdf5-tools
PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
PIP      := $(VENV)/bin/pip
REQS     := tests/requirements.txt
STAMP    := $(VENV)/.requirements.stamp
CARGO    ?= cargo
# HDF5 2.2 built from source and linked statically: reads every file format up to 2.x
# (the system 1.10 cannot read some files written by HDF5 2.0 with libver='latest').
# Needs CMake >= 3.26, installed into the venv. Use FEATURES= to link the system libhdf5.
FEATURES ?= --features static-hdf5
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
BIN      := target/release/h5tilefs
SUDO     := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: setup apt build test demo bench-read clean-venv

setup: apt $(STAMP)

apt:
	@if ! dpkg -s $(APT_PKGS) >/dev/null 2>&1; then \
	  echo "installing $(APT_PKGS)"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(APT_PKGS); \
	fi

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(REQS) | $(PY)
	$(PIP) install -q -r $(REQS)
	touch $@

build: setup
	$(CARGO) build --release $(FEATURES)

test: build
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets $(FEATURES) -- -D warnings
	$(CARGO) test --release $(FEATURES)
	H5TILEFS_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -x -q tests/integration

demo: build
	H5TILEFS_BIN=$(CURDIR)/$(BIN) PY=$(CURDIR)/$(PY) tests/demo.sh

bench-read: setup
	$(PY) tests/bench/read_bench.py --bin $(CURDIR)/$(BIN) $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
