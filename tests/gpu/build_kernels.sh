#!/bin/bash
# Rebuilds src/gpu/kernels/*.ptx from their .cu sources with nvcc (a machine with CUDA:
# the device machine). PTX for compute_75 runs on every later GPU (the driver compiles
# it at load). Usage: tests/gpu/build_kernels.sh [OUTDIR] (default: next to the sources).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/src/gpu/kernels}
for cu in "$here"/src/gpu/kernels/*.cu; do
  nvcc -ptx -arch=compute_75 -O3 "$cu" -o "$out/$(basename "${cu%.cu}").ptx"
done
