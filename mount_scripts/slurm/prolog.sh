#!/bin/sh
# Slurm prolog: mounts h5tilefs on every node of a job's allocation.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/h5tilefs-prolog.sh
#               Epilog=/etc/slurm/epilog.d/h5tilefs-epilog.sh
#               PrologFlags=Alloc     (run at allocation, on every node)
# Site settings, /etc/h5tilefs/slurm.env (or $H5TILEFS_SLURM_CONF):
#     H5TILEFS_BACKING=/lustre/project/h5   backing directory (required)
#     H5TILEFS_MNT=/mnt/h5tilefs            mount point; %j is replaced by the job id
#     H5TILEFS_OPTIONS=cache_bytes=1G       extra -o options (allow_other is always set)
#     H5TILEFS_BIN=/usr/local/bin/h5tilefs
#     H5TILEFS_LOG_DIR=/var/log/h5tilefs
# Runs as root. The daemon runs as root with allow_other; the kernel checks every
# access against the backing files' permissions (default_permissions), and objects a
# job creates belong to the job's user.
# A non-zero exit drains the node, so failures are reported clearly.
set -eu
CONF="${H5TILEFS_SLURM_CONF:-/etc/h5tilefs/slurm.env}"
[ -r "$CONF" ] && . "$CONF"
: "${H5TILEFS_BACKING:?set H5TILEFS_BACKING in $CONF}"
BIN="${H5TILEFS_BIN:-/usr/local/bin/h5tilefs}"
JOB="${SLURM_JOB_ID:-0}"
MNT="$(printf '%s' "${H5TILEFS_MNT:-/mnt/h5tilefs}" | sed "s/%j/$JOB/g")"
LOGDIR="${H5TILEFS_LOG_DIR:-/var/log/h5tilefs}"
# Already served (a shared node, or a fixed mount point of an earlier job)?
if "$BIN" status "$MNT" >/dev/null 2>&1; then
    exit 0
fi
# A dead daemon from an earlier job: clear the stale mount first (it cannot even be
# stat'ed: "transport endpoint is not connected").
if grep -q " $MNT " /proc/self/mountinfo; then
    umount -l "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null || true
fi
mkdir -p "$MNT" "$LOGDIR"
OPTS="allow_other${H5TILEFS_OPTIONS:+,$H5TILEFS_OPTIONS}"
if ! "$BIN" mount "$H5TILEFS_BACKING" "$MNT" -o "$OPTS" --log-file "$LOGDIR/job-$JOB.log"; then
    echo "h5tilefs prolog: mounting $H5TILEFS_BACKING at $MNT failed (see $LOGDIR/job-$JOB.log)" >&2
    exit 1
fi
"$BIN" status "$MNT" >/dev/null
