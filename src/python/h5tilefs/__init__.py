"""h5tilefs client helpers: talk to an h5tilefs mount (see docs/ioctl.md).

``h5tilefs.open(path)``: a dataset's shape, dtype, tile grid and NumPy-style slicing
through the mount's files. Submodules: ``h5tilefs.gpu`` (READ_TO_GPU with CuPy;
``gpu.load(path)``), ``h5tilefs.numpy`` (read and write datasets with NumPy),
``h5tilefs.extents`` (QUERY_EXTENTS), ``h5tilefs.zarr`` (a zarr-python store with GPU
reads), ``h5tilefs.legate`` (legate.io.hdf5's functions over a mount).
"""

__version__ = "0.1.0"


def open(path: str):  # noqa: A001 - h5py.File-like entry point, named as users expect
    """The dataset whose directory in a mount is ``path`` (MNT/run/out.h5/fields/u)."""
    from .dataset import Dataset

    return Dataset(path)
