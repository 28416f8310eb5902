#!/usr/bin/env bash
# Same-machine A/B of cold sequential reads of one dataset's `data` through several
# daemon binaries (e.g. old commits, for a bisect) and a direct read of the same bytes:
# alternating, page cache dropped before each read, 16 MiB blocks, REPS rounds.
#   tests/bench/ab_cold_read.sh DIR MIB REPS BIN...
set -euo pipefail
dir=$1 mib=$2 reps=$3; shift 3
mkdir -p "$dir/b" "$dir/m"
python3 - "$dir/b/c.h5" "$mib" <<'PY'
import sys, h5py, numpy as np
p, mib = sys.argv[1], int(sys.argv[2]); cols = 4096; rows = (mib << 20) // (cols * 4)
with h5py.File(p, "w") as f:
    d = f.create_dataset("x", (rows, cols), "<f4")
    for r in range(0, rows, 4096):
        n = min(4096, rows - r); d[r:r+n] = np.arange(r*cols, (r+n)*cols, dtype="<f4").reshape(n, cols)
with h5py.File(p, "r") as f:
    print(f["x"].id.get_offset(), f["x"].id.get_storage_size(), file=open(p + ".off", "w"))
PY
read off len < "$dir/b/c.h5.off"
t() { python3 -c "
import os, sys, time
p, o, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(p, os.O_RDONLY); t = time.perf_counter(); pos = o
while pos < o + n:
    k = len(os.pread(fd, min(16 << 20, o + n - pos), pos))
    if not k: break
    pos += k
print(f'{time.perf_counter() - t:.3f}')" "$@"; }
declare -A res
for r in $(seq "$reps"); do
  sync; echo 3 > /proc/sys/vm/drop_caches; res[direct]+="$(t "$dir/b/c.h5" "$off" "$len") "
  for b in "$@"; do
    "$b" mount "$dir/b" "$dir/m" >/dev/null; cat "$dir/m/c.h5/x/meta.json" >/dev/null
    sync; echo 3 > /proc/sys/vm/drop_caches
    res[$b]+="$(t "$dir/m/c.h5/x/data" 0 "$len") "
    umount "$dir/m" 2>/dev/null || fusermount3 -u "$dir/m"
  done
done
med() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
d=$(echo "${res[direct]}" | med)
echo "| read | runs (s) | median s | ratio to direct |"
echo "|---|---|---:|---:|"
echo "| direct | ${res[direct]}| $d | 1.00 |"
for b in "$@"; do m=$(echo "${res[$b]}" | med); echo "| $(basename "$b") | ${res[$b]}| $m | $(python3 -c "print(f'{$d/$m:.2f}')") |"; done
