"""The ioctl ABI, mirrored from src/ioctl.rs (a test checks that both agree)."""
import ctypes

ABI_VERSION = 1
MAGIC = ord("H")
MAX_RUNS = 64
MAX_FILES = 8
PATH_LEN = 256


def _ioc(direction, nr, size):
    return (direction << 30) | (size << 16) | (MAGIC << 8) | nr


class RegisterBuffer(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("device", ctypes.c_int32),
        ("ipc_handle", ctypes.c_uint8 * 64),
        ("alloc_size", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("buffer_id", ctypes.c_uint64),
    ]


class UnregisterBuffer(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("buffer_id", ctypes.c_uint64)]


class ReadToGpu(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("buffer_id", ctypes.c_uint64),
        ("buf_offset", ctypes.c_uint64),
        ("file_offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("bytes_read", ctypes.c_uint64),
        ("direct_bytes", ctypes.c_uint64),
        ("staged_bytes", ctypes.c_uint64),
    ]


class WriteFromGpu(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("buffer_id", ctypes.c_uint64),
        ("buf_offset", ctypes.c_uint64),
        ("file_offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("bytes_written", ctypes.c_uint64),
        ("direct_bytes", ctypes.c_uint64),
        ("staged_bytes", ctypes.c_uint64),
    ]


class ExtentRun(ctypes.Structure):
    _fields_ = [
        ("file_offset", ctypes.c_uint64),
        ("backing_offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("file_index", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
    ]


class QueryExtents(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("nruns", ctypes.c_uint32),
        ("file_offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("next_offset", ctypes.c_uint64),
        ("nfiles", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("files", (ctypes.c_char * PATH_LEN) * MAX_FILES),
        ("runs", ExtentRun * MAX_RUNS),
    ]


DIRECT_FILES = 4
DIRECT_READ = 1
DIRECT_WRITE = 2
#: DIRECT_MAP of a pending chunked dataset's ``data`` in tile order (docs/direct.md)
DIRECT_TILE_ORDER = 4
RECORD_CHECK = 1
#: RECORD_WRITE of whole chunks of that tile-order view
RECORD_TILE_ORDER = 2


class DirectFile(ctypes.Structure):
    _fields_ = [
        ("dev", ctypes.c_uint64),
        ("ino", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("mtime_ns", ctypes.c_int64),
        ("path", ctypes.c_char * PATH_LEN),
    ]


class DirectMap(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("file_offset", ctypes.c_uint64),
        ("view_size", ctypes.c_uint64),
        ("next_offset", ctypes.c_uint64),
        ("nfiles", ctypes.c_uint32),
        ("nruns", ctypes.c_uint32),
        ("files", DirectFile * DIRECT_FILES),
        ("runs", ExtentRun * MAX_RUNS),
    ]


class RecordWrite(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("file_offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64),
    ]


REGISTER_BUFFER = _ioc(3, 1, ctypes.sizeof(RegisterBuffer))
UNREGISTER_BUFFER = _ioc(1, 2, ctypes.sizeof(UnregisterBuffer))
READ_TO_GPU = _ioc(3, 3, ctypes.sizeof(ReadToGpu))
QUERY_EXTENTS = _ioc(3, 4, ctypes.sizeof(QueryExtents))
WRITE_FROM_GPU = _ioc(3, 5, ctypes.sizeof(WriteFromGpu))
DIRECT_MAP = _ioc(3, 6, ctypes.sizeof(DirectMap))
RECORD_WRITE = _ioc(1, 7, ctypes.sizeof(RecordWrite))
