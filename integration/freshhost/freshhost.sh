#!/usr/bin/env bash
# freshhost.sh CMD [ARG...] — run CMD as on a host where containerd, Docker and DetShare never ran.
#
# Must run inside a private mount namespace (unshare --mount --propagation private): it refuses to run in the
# host's. It mounts an empty tmpfs over /run and over each of /var/lib/containerd, /var/lib/docker, /etc/containerd,
# /etc/docker and /etc/cdi that exists, so that none of the directories the engines create on first use
# (/run/containerd, /run/containerd/s, /run/containerd/fifo, /run/docker, /run/detshare, ...) is there; checks that;
# prints "freshhost: fresh" and runs CMD. After CMD it prints "freshhost: left <path>" for each such path CMD left
# in the fresh /run and exits with CMD's status. The mounts go away with the namespace; nothing here touches the host.
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: freshhost.sh CMD [ARG...] (inside unshare --mount --propagation private)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "freshhost: needs root (mounts)" >&2; exit 2; }
if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
  echo "freshhost: refusing to mount over /run in the host's mount namespace; run me under" \
    "unshare --mount --propagation private" >&2
  exit 2
fi

for d in /run /var/lib/containerd /var/lib/docker /etc/containerd /etc/docker /etc/cdi; do
  if [ -d "$d" ]; then mount -t tmpfs -o mode=0755 freshhost "$d"; fi
done
# Every Debian boot has /run/lock (systemd-tmpfiles, initscripts); what this emulates is a host where no engine ran.
mkdir /run/lock && chmod 1777 /run/lock

watched=(/run/containerd /run/containerd/s /run/containerd/fifo /run/containerd/runc /run/docker /run/runc
  /run/detshare /var/lib/containerd/io.containerd.content.v1.content /var/lib/docker/image /etc/containerd/config.toml
  /etc/docker/daemon.json /etc/cdi/detshare.yaml)
for p in "${watched[@]}"; do
  if [ -e "$p" ]; then echo "freshhost: $p exists after the tmpfs mounts: not a fresh host" >&2; exit 2; fi
done
echo "freshhost: fresh (/run, and the engines' directories that exist, are empty tmpfs)"

rc=0
"$@" || rc=$?

for p in "${watched[@]}"; do
  if [ -e "$p" ]; then echo "freshhost: left $p"; fi
done
exit "$rc"
