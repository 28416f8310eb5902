#!/usr/bin/env bash
# h5tilefs demo: generate a sample file, mount it, read a dataset with ls, cat, numpy, od
# and dd; then the write path: several processes write the tiles of a new dataset in
# parallel, `h5tilefs commit` makes one HDF5 file of virtual datasets, h5py and h5dump
# read it back and check it; unmount. Run through `make demo` (which builds first) or
# directly.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=${H5TILEFS_BIN:-$PWD/target/release/h5tilefs}
PY=${PY:-$PWD/.venv/bin/python}
[ -x "$BIN" ] || { echo "no binary at $BIN: run 'make build'" >&2; exit 1; }

WORK=$(mktemp -d /tmp/h5tilefs-demo.XXXXXX)
BACK=$WORK/demo/run
MNT=$WORK/mnt
cleanup() {
    if mountpoint -q "$MNT" 2>/dev/null; then
        "$BIN" umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$BACK" "$MNT"

if [ -t 1 ]; then B=$'\033[1m' N=$'\033[0m'; else B= N=; fi
run() { printf '\n%s$ %s%s\n' "$B" "$*" "$N"; "$@"; }

echo "== generating $BACK/out.h5: /fields/u float32 1024x1024, chunks 256x256, u[i,j] = 1024*i + j"
"$PY" - "$BACK/out.h5" <<'PY'
import sys, h5py, numpy as np
u = (np.arange(1024, dtype=np.float32)[:, None] * 1024 + np.arange(1024, dtype=np.float32)[None, :])
with h5py.File(sys.argv[1], "w") as f:
    d = f.create_dataset("fields/u", data=u, chunks=(256, 256), compression="gzip", shuffle=True)
    d.attrs["units"] = "m/s"
    d.attrs["step"] = 42
    f.create_dataset("fields/p", data=np.ones((64, 64), dtype="<f8"))
PY

U=$MNT/out.h5/fields/u
run "$BIN" mount "$BACK" "$MNT"
run ls "$MNT"
run ls "$MNT/out.h5/fields"
run ls "$U"
run ls "$U/tiles"
run cat "$U/meta.json"
run cat "$MNT/.h5tilefs"
echo

echo "== tile 1.3 with numpy (rows 256..511, columns 768..1023)"
run "$PY" -c "
import numpy as np
t = np.fromfile('$U/tiles/1.3', dtype='<f4').reshape(256, 256)
print(t.shape, t[0, :4], t[-1, -1])
assert t[0, 0] == 256 * 1024 + 768 and t[-1, -1] == 511 * 1024 + 1023
print('tile 1.3 OK')
"
run od -A d -f -N 64 "$U/tiles/1.3"

echo
echo "== a slice with dd: rows 100..199, every other column"
run dd if="$U/slice/100:200,::2" of="$WORK/slice.bin" bs=1M status=none
run ls -l "$WORK/slice.bin"
run od -A d -f -N 32 "$WORK/slice.bin"
run "$PY" -c "
import h5py, numpy as np
s = np.fromfile('$WORK/slice.bin', dtype='<f4').reshape(100, 512)
with h5py.File('$BACK/out.h5') as f:
    print('slice matches h5py u[100:200, ::2]:', bool((s == f['fields/u'][100:200, ::2]).all()))
"

echo
echo "== the write path: 4 processes write the 4 x 4 tiles of a new dataset in parallel"
NEW=$MNT/new.h5/fields/v
run mkdir -p "$NEW"
echo '{"shape": [2048, 1024], "dtype": "<f4", "tile_shape": [512, 256], "attrs": {"units": "K"}}' > "$NEW/meta.json"
run cat "$NEW/meta.json"
run "$BIN" status "$MNT/new.h5"
# each process writes one row of tiles: v[i, j] = i - j, as plain files (no HDF5 library)
for r in 0 1 2 3; do
    "$PY" - "$NEW" "$r" <<'PY' &
import sys, numpy as np
d, r = sys.argv[1], int(sys.argv[2])
for c in range(4):
    i = np.arange(r * 512, (r + 1) * 512, dtype=np.float32)[:, None]
    j = np.arange(c * 256, (c + 1) * 256, dtype=np.float32)[None, :]
    with open(f"{d}/tiles/{r}.{c}", "r+b") as f:
        f.write((i - j).astype("<f4").tobytes())
print(f"process {r}: tiles {r}.0 .. {r}.3 written")
PY
done
wait
run "$BIN" status "$MNT/new.h5"
run "$BIN" commit "$MNT/new.h5"
run ls -l "$BACK"
run h5dump -H -d /fields/v "$BACK/new.h5"
run h5dump -d /fields/v -s "1000,500" -c "2,3" "$BACK/new.h5"
run "$PY" -c "
import h5py, numpy as np
with h5py.File('$BACK/new.h5') as f:
    v = f['fields/v']
    print('virtual dataset:', v.is_virtual, 'with', len(v.virtual_sources()), 'tile sources', v.shape, v.dtype)
    want = np.arange(2048, dtype=np.float32)[:, None] - np.arange(1024, dtype=np.float32)[None, :]
    assert (v[()] == want).all() and v.attrs['units'] == 'K'
    print('h5py reads the committed file: every element OK')
"
out=$(h5dump -d /fields/v -s "1000,500" -c "1,1" "$BACK/new.h5")
echo "$out" | grep -q "(1000,500): 500" && echo "h5dump reads v[1000,500] = 500: OK" || { echo "h5dump check FAILED" >&2; exit 1; }

run "$BIN" umount "$MNT"
echo
echo "demo done"
