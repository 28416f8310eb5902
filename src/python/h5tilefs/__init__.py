"""h5tilefs client helpers: talk to an h5tilefs mount (see docs/ioctl.md).

Submodules: ``h5tilefs.gpu`` (READ_TO_GPU with CuPy), ``h5tilefs.extents``
(QUERY_EXTENTS, pure Python).
"""

__version__ = "0.1.0"
