#!/bin/bash
# The compressed-read benchmarks on a machine with no network: hdf5plugin comes as a
# wheel carried with the checkout, daemons as stripped binaries under dist/. Writes
# markdown tables to OUT.
#
#   tests/bench/device_decode_run.sh WHEEL_DIR OUT [OLD_BIN]
set -uo pipefail
whl=$1 out=$2 old=${3:-}
if ! command -v fusermount3 >/dev/null; then
    # The image has no fuse3 tools; root can unmount with umount.
    mkdir -p /tmp/shim && printf '#!/bin/sh\numount "$2"\n' > /tmp/shim/fusermount3
    chmod +x /tmp/shim/fusermount3
    export PATH=/tmp/shim:$PATH
fi
python3 -c "import hdf5plugin" 2>/dev/null || {
    python3 -m pip install -q --no-index --no-deps --target /tmp/hp "$whl"/*.whl
    export PYTHONPATH=/tmp/hp
}
filters=${FILTERS:-zstd,bitshuffle+lz4,blosc lz4+shuffle,gzip+shuffle}
echo "== cpu_budget ($(nproc) CPUs)"
python3 tests/bench/cpu_budget.py --bin dist/h5tilefs --floor dist/h5tilefs-floor \
    --filter "$filters" --mib "${MIB:-256}" --reps "${REPS:-3}" \
    --readahead-kb "${RA:-4096,16384}" | tee "$out/cpu_budget.md"
bins=dist/h5tilefs
[ -n "$old" ] && bins=$old,dist/h5tilefs
echo "== filter_bench"
python3 tests/bench/filter_bench.py --layout square --mib "${MIB:-256}" --repeat 3 \
    --bin "$bins" --only "$filters" | tee "$out/filter_bench.md"
