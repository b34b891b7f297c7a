#!/usr/bin/env bash
# shimrun.sh — one container through DetShare's shim on a containerd whose root and state do not exist yet.
#
# Run by freshhost_test.go under freshhost.sh (a private mount namespace with an empty /run). FRESH_DIR holds what
# the test prepared: containerd.toml (root FRESH_DIR/ctrd/root, state /run/containerd, socket
# /run/containerd/containerd.sock: none of them exists yet), workload.tar (the simulated-GPU workload image) and
# bin/ (the shim and detshare); OWN_TIER is the shell command that prints the container's tier from its table slot
# (testenv.OwnTierScript). DetShare's run directory is the default, /run/detshare, which does not exist either:
# the shim creates it when it starts the scheduler on demand. Prints the container's output between "shimrun: out"
# and "shimrun: end"; removes what it started (container, containerd, the scheduler) on every exit.
set -euo pipefail
# shellcheck source=integration/teardown.sh
. "$(cd "$(dirname "$0")/.." && pwd)/teardown.sh"
dir=${FRESH_DIR:?FRESH_DIR names the test directory}
sock=/run/containerd/containerd.sock ns=freshhost id=fresh-lc
image=docker.io/library/detshare-e2e:test
ctrd_pid=""
ctr_() { ctr --address "$sock" --namespace "$ns" --connect-timeout 2s "$@"; }

cleanup() {
  local rc=$?
  set +e
  trap - EXIT
  if [ -S "$sock" ] && [ -n "$ctrd_pid" ] && kill -0 "$ctrd_pid" 2>/dev/null; then
    ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1
    ctr_ tasks rm -f "$id" >/dev/null 2>&1
    ctr_ containers rm "$id" >/dev/null 2>&1
  fi
  if [ -n "$ctrd_pid" ]; then
    kill -TERM "$ctrd_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$ctrd_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$ctrd_pid" 2>/dev/null
  fi
  # the scheduler the shim started and any shim still running: every process started from FRESH_DIR/bin
  kill_naming "$dir"
  umount_below "$dir"
  exit "$rc"
}
trap cleanup EXIT

for p in /run/containerd "$dir/ctrd" /run/detshare; do
  if [ -e "$p" ]; then echo "shimrun: $p exists before containerd started" >&2; exit 1; fi
done
PATH="$dir/bin:$PATH" setsid containerd --config "$dir/containerd.toml" >"$dir/containerd.log" 2>&1 &
ctrd_pid=$!
for _ in $(seq 200); do
  ctr_ version >/dev/null 2>&1 && break
  kill -0 "$ctrd_pid" 2>/dev/null || break
  sleep 0.1
done
ctr_ version >/dev/null 2>&1 || { tail -30 "$dir/containerd.log" >&2; echo "shimrun: containerd did not start" >&2; exit 1; }
ctr_ images import "$dir/workload.tar" >/dev/null
echo "shimrun: out"
ctr_ run --rm --runtime io.containerd.detshare.v1 --env DETSHARE_TIER=latency-critical --env DETSHARE_SMS=16 \
  --env DETSHARE_MEMORY=256MiB "$image" "$id" sh -c "simgpu-probe meminfo; cat /run/detshare/quota; $OWN_TIER" </dev/null
echo "shimrun: end"
if [ -d /run/detshare ]; then echo "shimrun: /run/detshare created"; else echo "shimrun: no /run/detshare" >&2; exit 1; fi
