#!/bin/sh
# Wraps one Legate rank's process (legate --wrapper-inner "rank_wrapper.sh %%LEGATE_GLOBAL_RANK%%"):
# the rank gets a private mount namespace with its own h5tilefs daemon mounted at
# $H5T_MR_MNT over the shared backing directory $H5T_MR_BACKING, as on a node of its own.
# Env: H5TILEFS_BIN, H5T_MR_BACKING, H5T_MR_MNT, H5T_MR_LOGS (and H5T_MR_NODE_PIDS, below).
set -u
if [ -n "${H5T_MR_NODE_PIDS:-}" ]; then
    # Nodes made by tests/cluster/h5t_cluster.py (GlusterFS): rank R joins the mount
    # namespace of node R mod N, whose daemon is already mounted at $H5T_MR_MNT.
    rank=$1
    shift
    n=$(echo $H5T_MR_NODE_PIDS | wc -w)
    pid=$(echo $H5T_MR_NODE_PIDS | cut -d' ' -f$((rank % n + 1)))
    log="$H5T_MR_LOGS/wrapper.$rank.log"
    echo "$(date +%s.%N) start in the namespace of node pid $pid" >> "$log"
    H5T_MR_RANK=$rank nsenter -t "$pid" -m -- "$@"
    rc=$?
    echo "$(date +%s.%N) rank exited rc=$rc" >> "$log"
    exit $rc
fi
if [ "${1:-}" != "--inside" ]; then
    exec unshare -m --propagation private -- "$0" --inside "$@"
fi
rank=$2
shift 2
"$H5TILEFS_BIN" mount "$H5T_MR_BACKING" "$H5T_MR_MNT" --log-file "$H5T_MR_LOGS/daemon.$rank.log" || exit 97
# The daemon detaches (a session of its own): the harness kills it by this pid if the
# rank is killed before it can unmount.
grep -o '"pid": [0-9]*' "$H5T_MR_MNT/.h5tilefs" | grep -o '[0-9]*' >> "$H5T_MR_LOGS/daemon.$rank.pids"
log="$H5T_MR_LOGS/wrapper.$rank.log"
echo "$(date +%s.%N) start" >> "$log"
H5T_MR_RANK=$rank "$@"
rc=$?
echo "$(date +%s.%N) rank exited rc=$rc" >> "$log"
# A daemon the rank killed leaves a dead mount: detach it lazily. The daemon exits with
# its mount, and the namespace goes with the last process in it.
"$H5TILEFS_BIN" umount "$H5T_MR_MNT" >/dev/null 2>&1 || umount -l "$H5T_MR_MNT" 2>/dev/null
echo "$(date +%s.%N) unmounted" >> "$log"
exit $rc
