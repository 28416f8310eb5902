#!/usr/bin/env python3
"""Probes whether cuFile can register a file on this machine (and why not)."""
import ctypes
import os
import sys

path = sys.argv[1]


class Err(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class Descr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("pad", ctypes.c_int), ("fd", ctypes.c_int64), ("fs_ops", ctypes.c_void_p)]


lib = ctypes.CDLL("libcufile.so.0")
lib.cuFileDriverOpen.restype = Err
lib.cuFileHandleRegister.restype = Err
import cupy  # noqa: F401,E402  (creates a CUDA context first)
cupy.zeros(1)
e = lib.cuFileDriverOpen()
print("driver_open", e.err, e.cu_err)
for flags in (os.O_RDONLY | os.O_DIRECT, os.O_RDONLY):
    fd = os.open(path, flags)
    h = ctypes.c_void_p()
    d = Descr(type=1, fd=fd)
    e = lib.cuFileHandleRegister(ctypes.byref(h), ctypes.byref(d))
    print("register", "O_DIRECT" if flags & os.O_DIRECT else "plain", e.err, e.cu_err)
