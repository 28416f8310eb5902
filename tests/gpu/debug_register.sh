set -x
mkdir -p /tmp/d/b /tmp/d/m
python3 -c "
import h5py, numpy as np
with h5py.File('/tmp/d/b/c.h5','w') as f: f['x']=np.arange(1<<20, dtype='f4').reshape(1024,1024)
"
RUST_BACKTRACE=1 RUST_LOG=h5tilefs=debug dist/h5tilefs mount /tmp/d/b /tmp/d/m --foreground > $OUT/fg.log 2>&1 &
sleep 2
python3 - <<'PY'
import sys, os
sys.path.insert(0, 'src/python')
import cupy as cp
from h5tilefs import gpu
buf = cp.zeros(4<<20, dtype=cp.uint8)
print("ptr", hex(buf.data.ptr))
try:
    b = gpu.register(buf, mount='/tmp/d/m')
    print("registered", b.id)
    r = b.read_into('/tmp/d/m/c.h5/x/tiles/0.0')
    print("read", r.bytes_read, r.direct_bytes, r.staged_bytes)
    print((cp.asnumpy(buf[:16]).view('f4')))
    b.close()
except Exception as e:
    print("ERR", repr(e))
PY
sleep 1
dmesg 2>/dev/null | tail -5
ls /tmp/d/m || true
fusermount3 -u /tmp/d/m || umount -l /tmp/d/m
tail -40 $OUT/fg.log
