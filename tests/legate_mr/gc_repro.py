"""The rank-divergent garbage collection without h5tilefs (docs/adapter-notes.md, "The
multi-rank hang, second look"): cupynumeric and legate.io.hdf5
only, over a plain directory, no mount. Rank 0 alone keeps SKEW extra container objects,
as our Python tasks' allocations did, so its cyclic collector runs at other points in the
program than the other ranks' collectors. Run it with Legion's checker:

    LEGION_DEFAULT_ARGS="-lg:safe_ctrlrepl 1" REALM_DEFAULT_ARGS="-ll:bgwork 1 -ucx:pollers_max 1" \\
      legate --launcher mpirun --ranks-per-node 3 --cpus 1 --sysmem 256 \\
      --launcher-extra=--oversubscribe tests/legate_mr/gc_repro.py SKEW DIR

(plus the suite's environment: LD_PRELOAD of the UCX shim, LD_LIBRARY_PATH,
OMPI_ALLOW_RUN_AS_ROOT*). SKEW 0: every rank allocates the same.
"""
import os
import sys

import cupynumeric as cn
from legate.core import get_legate_runtime
from legate.io import hdf5 as lgh5

RT = get_legate_runtime()
SKEW = int(sys.argv[1])
DIR = sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 30

kept = [[] for _ in range(SKEW)] if RT.node_id == 0 else []
ok = True
for i in range(ROUNDS):
    for shape, dtype in (((37, 23), "float64"), ((9, 8, 7), "int32"), ((100,), "float32")):
        n = 1
        for s in shape:
            n *= s
        a = ((cn.arange(n) + i) % 200).astype(dtype).reshape(shape)
        p = os.path.join(DIR, f"r{i}_{dtype}.h5")
        lgh5.to_file(array=a, path=p, dataset_name="/data")
        RT.issue_execution_fence(block=True)
        b = lgh5.from_file(p, dataset_name="/data")
        ok = ok and bool(cn.array_equal(a, b))
print(f"rank {RT.node_id}: rounds={ROUNDS} skew={SKEW if RT.node_id == 0 else 0} equal={ok} kept={len(kept)}",
      flush=True)
