#!/bin/bash
# Runs tests/bench/adapter_bench.py on a machine that has no cuPyNumeric and no network:
# Legate comes as a wheel carried with the checkout (see docs/perf-log/2026-11-23-adapter.md). One run
# of the benchmark per LEGATE_CONFIG given; JSON results land in OUT.
#
#   tests/bench/device_adapter_bench.sh WHEEL OUT "--cpus 8 --gpus 0 --sysmem 40000" ...
set -euo pipefail
whl=$1 out=$2
shift 2
pkgs=${LEGATE_PKGS:-/tmp/lgpkgs}
if [ ! -d "$pkgs/legate" ]; then
    extra=$(ls "$(dirname "$whl")"/*.whl 2>/dev/null | grep -v "^$whl$" || true)
    python3 -m pip install -q --no-index --no-deps --target "$pkgs" "$whl" $extra
fi
export PYTHONPATH=$pkgs LEGATE_AUTO_CONFIG=0
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/local/cuda/lib64:/lib/x86_64-linux-gnu}
bin=${H5TILEFS_BIN:-dist/h5tilefs}
i=0
for cfg in "$@"; do
    i=$((i + 1))
    echo "== LEGATE_CONFIG=$cfg"
    LEGATE_CONFIG="$cfg" python3 tests/bench/adapter_bench.py --bin "$bin" --gib "${GIB:-1,4}" \
        --reps "${REPS:-3}" --prefault-gib "${PREFAULT_GIB:-24}" --raw-streams "${RAW_STREAMS:-8}" \
        --json "$out/adapter_bench_$i.json" 2>&1 | grep -v '^\[0 - ' || true
done
