#!/usr/bin/env python3
"""Small, deterministic HDF5 seed files for the `h5_open` and `ioctl` fuzz targets.

    gen_seeds.py OUT_DIR

Writes OUT_DIR/h5_open/*.h5 (one storage feature per file, each a few KiB, so libFuzzer's
mutations land in the structures that matter) and OUT_DIR/ioctl_backing.h5 (the file the
`ioctl` target serves). Files use the default (earliest) format unless the name says
otherwise, so the system HDF5 1.10 and the bundled HDF5 2.x both read them.
"""
import os
import sys

import h5py
import numpy as np


def arr(shape, dtype="<f4"):
    n = int(np.prod(shape)) if shape else 1
    return (np.arange(n) % 97).astype(dtype).reshape(shape)


def gen(out):
    d = os.path.join(out, "h5_open")
    os.makedirs(d, exist_ok=True)
    p = lambda n: os.path.join(d, n)

    with h5py.File(p("contiguous.h5"), "w") as f:
        f["x"] = arr((6, 5))
    with h5py.File(p("chunked_gzip.h5"), "w") as f:
        f.create_dataset("z", data=arr((9, 7)), chunks=(4, 4), compression="gzip",
                         shuffle=True, fletcher32=True)
    with h5py.File(p("chunked_fill.h5"), "w") as f:
        ds = f.create_dataset("u", shape=(10, 10), dtype="<i2", chunks=(3, 3), fillvalue=-7)
        ds[0:3, 0:3] = 1
    with h5py.File(p("compact_scalar.h5"), "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        sp = h5py.h5s.create_simple((4, 3))
        h5py.h5d.create(f.id, b"c", h5py.h5t.NATIVE_INT32, sp, dcpl=dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, arr((4, 3), "<i4"))
        f["s"] = np.float64(3.5)
        f.create_dataset("e", shape=(0, 4), dtype="<u1")
    with h5py.File(p("groups_links.h5"), "w") as f:
        g = f.create_group("a/b")
        g["d"] = arr((3,), "<u2")
        g.attrs["units"] = "m"
        g.attrs["scale"] = np.arange(3.0)
        f["soft"] = h5py.SoftLink("/a/b/d")
        f["dangling"] = h5py.SoftLink("/nope")
        f["ext"] = h5py.ExternalLink("other.h5", "/x")
    with h5py.File(p("v110_indexes.h5"), "w", libver=("earliest", "v110")) as f:
        f.create_dataset("fixed", data=arr((6, 6), "<i4"), chunks=(2, 3))
        f.create_dataset("ext", data=arr((5,), "<f8"), chunks=(2,), maxshape=(None,))
        f.create_dataset("bt2", data=arr((4, 4), "<u1"), chunks=(2, 2), maxshape=(None, None))
        f.create_dataset("single", data=arr((3, 3), "<f4"), chunks=(3, 3), compression="gzip")
    with h5py.File(p("vds_self.h5"), "w") as f:
        f["src"] = arr((4, 6))
        lay = h5py.VirtualLayout(shape=(4, 12), dtype="<f4")
        vs = h5py.VirtualSource(".", "src", shape=(4, 6))
        lay[:, 0:6] = vs
        lay[:, 6:12] = vs
        f.create_virtual_dataset("v", lay, fillvalue=-1)
    with h5py.File(p("types.h5"), "w") as f:
        f["be"] = arr((5,), ">i4")
        f["b"] = np.array([True, False, True])
        f["str"] = np.array([b"ab", b"cd"])
        f["cpd"] = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])

    with h5py.File(os.path.join(out, "ioctl_backing.h5"), "w") as f:
        f["c"] = arr((8, 6))
        ds = f.create_dataset("z", shape=(10, 7), dtype="<f4", chunks=(4, 4),
                              compression="gzip", fillvalue=2.5)
        ds[0:8, 0:4] = arr((8, 4))
        ds[8:10, 4:7] = 1
        f["s"] = np.float64(1.25)
        lay = h5py.VirtualLayout(shape=(8, 12), dtype="<f4")
        vs = h5py.VirtualSource(".", "c", shape=(8, 6))
        lay[:, 0:6] = vs
        lay[0:4, 6:12] = vs[0:4, :]
        f.create_virtual_dataset("v", lay, fillvalue=-1)


if __name__ == "__main__":
    gen(sys.argv[1])
