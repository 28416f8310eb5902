# h5tilefs: build, test, demo, benchmark.
#   make test        fmt + clippy + Rust unit tests + integration tests on a real mount
#   make demo        build, mount a generated sample, read it with ls/cat/numpy/od/dd
#   make test-cluster two nodes (mount namespaces) over one GlusterFS volume on loopback:
#                    cross-node coherence tests (part of test; needs root and FUSE)
#   make test-legate-mr  h5tilefs.legate under multi-rank Legate (2 and 3 ranks under
#                    mpirun, a mount namespace and daemon per rank; part of test)
#   make bench-read  read throughput through the mount vs direct reads (not part of test)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

APT_PKGS := fuse3 libhdf5-dev pkg-config hdf5-tools rsync libaec-dev
GLUSTER_PKGS := glusterfs-server glusterfs-client
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

.PHONY: setup apt gluster-apt mpi-apt build wheel test-wheel test test-cluster test-cluster-direct test-legate test-legate-mr demo bench-read clean-venv fuzz

# Real Legate / cuPyNumeric for the adapter tests, in a venv of their own (legate pins
# an older h5py). On machines without a GPU driver a stand-in libcuda.so.1 lets Legate
# start CPU-only; on machines with one, the real driver is used.
LEGATE_VENV  := .venv-legate
LEGATE_PY    := $(LEGATE_VENV)/bin/python
LEGATE_STAMP := $(LEGATE_VENV)/.requirements.stamp
LEGATE_REQS  := tests/legate/requirements.txt
CUDA_STUB    := build/cuda-stub/libcuda.so.1

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
	$(CARGO) build --release -p h5tilefs-preload

# A manylinux_2_28 binary wheel (src/wheel/build.py, docs/release.md): zig links the
# daemon against glibc 2.28; needs no Rust toolchain where it is installed.
WHEEL_VENV := .venv-wheel
$(WHEEL_VENV)/.stamp:
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q ziglang cargo-zigbuild auditwheel wheel
	touch $@

wheel: setup $(WHEEL_VENV)/.stamp
	PATH=$(CURDIR)/$(WHEEL_VENV)/bin:$$PATH $(WHEEL_VENV)/bin/python src/wheel/build.py

# The wheel installed in a venv without a toolchain: mount, read, write, commit, umount.
test-wheel: wheel
	$(PY) -m pytest -x -q -s tests/wheel

test: build
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --all-targets $(FEATURES) -- -D warnings
	$(CARGO) clippy --release --all-targets -p h5tilefs-preload -- -D warnings
	$(CARGO) test --release $(FEATURES)
	$(CARGO) test --release -p h5tilefs-preload
	H5TILEFS_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -x -q tests/integration
	$(MAKE) test-wheel
	$(MAKE) test-cluster
	$(MAKE) test-legate
	$(MAKE) test-legate-mr

gluster-apt:
	@if ! dpkg -s $(GLUSTER_PKGS) >/dev/null 2>&1; then \
	  echo "installing $(GLUSTER_PKGS)"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(GLUSTER_PKGS); \
	fi

# Skipped (with the reason) only when the kernel cannot mount FUSE; GlusterFS is installed.
# The suite starts its own glusterd on 127.0.0.1 and tears everything down (docs/reliability.md).
test-cluster: build
	@if [ ! -c /dev/fuse ] || ! grep -qw fuse /proc/filesystems; then \
	  echo "test-cluster: SKIPPED: this kernel has no FUSE (/dev/fuse or 'fuse' in /proc/filesystems missing)"; \
	else \
	  $(MAKE) --no-print-directory gluster-apt && \
	  H5TILEFS_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q -p no:cacheprovider tests/cluster; \
	fi

# The same two-node suites with every worker under the interception library of
# `h5tilefs run` (docs/direct.md): reads and writes of the mounts go to the backing files.
# (test-cluster itself runs node B's workers so, node A's through FUSE.)
test-cluster-direct: build
	$(MAKE) --no-print-directory gluster-apt
	H5TILEFS_TEST_DIRECT=1 H5TILEFS_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q -p no:cacheprovider tests/cluster

$(LEGATE_PY):
	python3 -m venv $(LEGATE_VENV)

$(LEGATE_STAMP): $(LEGATE_REQS) | $(LEGATE_PY)
	$(LEGATE_VENV)/bin/pip install -q --upgrade pip
	$(LEGATE_VENV)/bin/pip install -q -r $(LEGATE_REQS)
	touch $@

$(CUDA_STUB): $(LEGATE_STAMP) tests/legate/make_cuda_stub.py
	$(LEGATE_PY) tests/legate/make_cuda_stub.py "$$($(LEGATE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" build/cuda-stub

test-legate: build $(LEGATE_STAMP)
	@site="$$($(LEGATE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	libs="$$site/nvidia/cu13/lib"; \
	if ! ldconfig -p | grep -q 'libcuda.so.1 '; then $(MAKE) $(CUDA_STUB); libs="$(CURDIR)/build/cuda-stub:$$libs"; fi; \
	LD_LIBRARY_PATH="$$libs" LEGATE_CONFIG="--cpus 2" LEGATE_AUTO_CONFIG=0 \
	  H5TILEFS_BIN=$(CURDIR)/$(BIN) $(LEGATE_PY) -m pytest -q -p no:cacheprovider tests/legate

# Multi-rank Legate (tests/legate_mr, docs/adapter-notes.md "Multi-rank"): 2 and 3 ranks
# under mpirun, each rank a "node" of its own (a mount namespace with its own daemon).
# legate 26.1 is the newest line whose wheels carry networking (26.06's have none); its
# venv (about 3 GB) lives outside the clone, named by its requirements' hash, so runs on
# one machine reuse it (installed once, about 3 minutes). Open MPI comes from Debian. The
# libucx-cu12 wheel has no InfiniBand and Realm stops on its refused IB_* settings: an
# LD_PRELOAD shim accepts those.
LEGATE_MR_REQS  := tests/legate_mr/requirements.txt
LEGATE_MR_HASH  := $(shell sha256sum $(LEGATE_MR_REQS) 2>/dev/null | cut -c1-12)
LEGATE_MR_VENV  ?= $(HOME)/.cache/h5tilefs/venv-legate-26.1-$(LEGATE_MR_HASH)
LEGATE_MR_PY    := $(LEGATE_MR_VENV)/bin/python
LEGATE_MR_STAMP := $(LEGATE_MR_VENV)/.requirements.stamp
MPI_PKGS        := openmpi-bin libopenmpi-dev
UCX_SHIM        := build/ucx_ib_shim.so
CUDA_STUB_MR    := build/cuda-stub-26.1/libcuda.so.1
# 1: also run the scenarios over GlusterFS (tests/legate_mr/test_gluster.py); empty: leave them out
H5T_MR_GLUSTER  ?= 1

mpi-apt:
	@if ! dpkg -s $(MPI_PKGS) >/dev/null 2>&1; then \
	  echo "installing $(MPI_PKGS)"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(MPI_PKGS); \
	fi

# Order-only on the requirements: the hash in the venv's name already tracks them, and a
# fresh clone's newer file times must not reinstall.
$(LEGATE_MR_STAMP): | $(LEGATE_MR_REQS)
	python3 -m venv $(LEGATE_MR_VENV)
	$(LEGATE_MR_VENV)/bin/pip install -q --upgrade pip
	$(LEGATE_MR_VENV)/bin/pip install -q -r $(LEGATE_MR_REQS)
	touch $@

$(UCX_SHIM): tests/legate_mr/ucx_ib_shim.c
	@mkdir -p $(@D)
	cc -shared -fPIC -O2 -Wall -Wextra -o $@ $< -ldl

$(CUDA_STUB_MR): tests/legate/make_cuda_stub.py | $(LEGATE_MR_STAMP)
	$(LEGATE_MR_PY) tests/legate/make_cuda_stub.py "$$($(LEGATE_MR_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" $(@D)

test-legate-mr: build
	@if [ ! -c /dev/fuse ] || ! grep -qw fuse /proc/filesystems; then \
	  echo "test-legate-mr: SKIPPED: this kernel has no FUSE (/dev/fuse or 'fuse' in /proc/filesystems missing)"; \
	elif [ "$$(id -u)" -ne 0 ]; then \
	  echo "test-legate-mr: SKIPPED: each rank's private mount namespace (unshare -m) needs root"; \
	else \
	  $(MAKE) --no-print-directory mpi-apt $(LEGATE_MR_STAMP) $(UCX_SHIM) && \
	  if [ "$(H5T_MR_GLUSTER)" = 1 ]; then $(MAKE) --no-print-directory gluster-apt; fi && \
	  site="$$($(LEGATE_MR_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && \
	  libs="$$site/nvidia/cuda_runtime/lib" && \
	  if ! ldconfig -p | grep -q 'libcuda.so.1 '; then \
	    $(MAKE) --no-print-directory $(CUDA_STUB_MR) && libs="$(CURDIR)/$(dir $(CUDA_STUB_MR)):$$libs"; fi && \
	  LD_LIBRARY_PATH="$$libs" H5T_MR_SHIM=$(CURDIR)/$(UCX_SHIM) H5TILEFS_BIN=$(CURDIR)/$(BIN) \
	    H5T_MR_GLUSTER=$(H5T_MR_GLUSTER) $(LEGATE_MR_PY) -m pytest -q -p no:cacheprovider tests/legate_mr; \
	fi

demo: build
	H5TILEFS_BIN=$(CURDIR)/$(BIN) PY=$(CURDIR)/$(PY) tests/demo.sh

bench-read: setup
	$(PY) tests/bench/read_bench.py --bin $(CURDIR)/$(BIN) $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)

# Fuzzing (docs/fuzzing.md): every cargo-fuzz target for FUZZ_SECONDS seconds on the
# nightly toolchain, linked to the system libhdf5. New crashes land in
# fuzz/artifacts/<target>/ and make the target fail. h5_open runs forked so that an
# abort inside libhdf5 1.10 (C, not h5tilefs) is recorded and fuzzing goes on, without
# leak checks (libhdf5's global state would be reported at every exit) and with
# malloc returning NULL as libc does (libhdf5 checks it; Rust still aborts on it).
FUZZ_SECONDS   ?= 60
FUZZ_TOOLCHAIN ?= nightly
FUZZ_TARGETS   ?= slice_name pending_meta ioctl h5_open

fuzz:
	@cd fuzz && status=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus/$$t; \
	  dirs="corpus/$$t"; for d in seeds/$$t regressions/$$t; do [ -d $$d ] && dirs="$$dirs $$d"; done; \
	  opts="-max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1"; \
	  [ -f dicts/$$t.dict ] && opts="$$opts -dict=dicts/$$t.dict"; \
	  asan="ASAN_OPTIONS=$${ASAN_OPTIONS:-}"; \
	  if [ $$t = h5_open ]; then \
	    opts="$$opts -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -detect_leaks=0"; \
	    asan="ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1"; \
	  fi; \
	  echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
	  env $$asan cargo +$(FUZZ_TOOLCHAIN) fuzz run $$t $$dirs -- $$opts || status=1; \
	done; \
	found="$$(find artifacts -type f 2>/dev/null || true)"; \
	if [ -n "$$found" ]; then echo "fuzz: inputs to triage (docs/fuzzing.md):"; echo "$$found"; status=1; fi; \
	exit $$status
