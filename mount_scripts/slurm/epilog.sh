#!/bin/sh
# Slurm epilog: unmounts the job's h5tilefs mount when the job ends (see prolog.sh for
# the settings). SIGTERM makes the daemon sync the backing directory (pending tiles are
# kept for a later commit), unmount, and exit; after the grace period the mount is
# detached lazily. Always exits 0 unless the mount is still there, so a hung daemon
# drains the node instead of leaking into the next job.
set -u
CONF="${H5TILEFS_SLURM_CONF:-/etc/h5tilefs/slurm.env}"
[ -r "$CONF" ] && . "$CONF"
BIN="${H5TILEFS_BIN:-/usr/local/bin/h5tilefs}"
JOB="${SLURM_JOB_ID:-0}"
MNT="$(printf '%s' "${H5TILEFS_MNT:-/mnt/h5tilefs}" | sed "s/%j/$JOB/g")"
GRACE="${H5TILEFS_STOP_SECONDS:-40}"
# Keep a fixed mount point for the next job if other jobs still use this node.
if [ -n "${H5TILEFS_KEEP_MOUNTED:-}" ]; then
    exit 0
fi
PID="$("$BIN" status "$MNT" --json 2>/dev/null | sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' | head -n1)"
if [ -n "$PID" ]; then
    kill -TERM "$PID" 2>/dev/null || true
    i=0
    while kill -0 "$PID" 2>/dev/null && [ "$i" -lt "$((GRACE * 10))" ]; do
        sleep 0.1; i=$((i + 1))
    done
    kill -KILL "$PID" 2>/dev/null || true
fi
if grep -q " $MNT " /proc/self/mountinfo; then
    umount -l "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null || true
fi
if grep -q " $MNT " /proc/self/mountinfo; then
    echo "h5tilefs epilog: $MNT is still mounted" >&2
    exit 1
fi
case "${H5TILEFS_MNT:-}" in *%j*) rmdir "$MNT" 2>/dev/null || true ;; esac
exit 0
