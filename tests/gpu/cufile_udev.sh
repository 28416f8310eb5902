#!/usr/bin/env bash
# Lets cuFile register files in a container without a udev database.
#
# cuFile reads the block device's udev properties (ID_FS_USAGE, ID_FS_TYPE) to build its
# file object, even in compatibility mode. Where /run/udev/data has no entry for the
# device (containers without udevd), cuFileHandleRegister fails with 5027 and every
# cuFile read is impossible. This writes the minimal entry for the file system holding
# DIR, and only when none exists. Test machines only: on a host with udev the entry is
# already there and this does nothing.
#
#   tests/gpu/cufile_udev.sh DIR
set -euo pipefail
dir=${1:?usage: cufile_udev.sh DIR}
src=$(findmnt -n -o SOURCE -T "$dir")
fstype=$(findmnt -n -o FSTYPE -T "$dir")
case "$src" in
  /dev/*) ;;
  *) echo "cufile_udev: $dir is on $src ($fstype), not a block device: nothing to do"; exit 0 ;;
esac
devno=$(printf '%d:%d' "0x$(stat -L -c %t "$src")" "0x$(stat -L -c %T "$src")")
db=/run/udev/data/b$devno
if [ -e "$db" ]; then
  echo "cufile_udev: $db exists: nothing to do"
  exit 0
fi
mkdir -p /run/udev/data
printf 'I:1000000\nE:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$fstype" > "$db"
echo "cufile_udev: wrote $db for $src ($fstype)"
