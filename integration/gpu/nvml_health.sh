#!/usr/bin/env bash
# nvml_health.sh OUTDIR — issue 29 on a real GPU: what the Kubernetes plugins read from NVML.
#   A. gpuinfo.Facts: each GPU's architecture (an H100: hopper) and compute capability (9.0), the driver's version
#      and its CUDA version: what the DRA plugin publishes as device attributes
#   B. gpuinfo.WatchXid sets up on the real driver (event set, every GPU registered for critical Xid events): the
#      plugins' Xid health is on there (no Xid is injected: a real one needs a fault)
# Both are sched/gpuinfo's TestHostFactsAndXidWatch, run from build/tests/gpuinfo.test (built here with
# `go test -c` when missing and Go is present; carry build/ otherwise). OUTDIR/summary.txt: one line per check,
# "ok" or "FAIL"; OUTDIR/gpuinfo.out the test's verbose output (the facts it read).
#   bash integration/gpu/nvml_health.sh /tmp/nh     (repository root)
# NH_SIM=1 runs the same on the NVML double (a test double: Hopper 9.0), to check the script without a GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh" # start_script, check
start_script 12 "$@"
mkdir -p "$out" && out=$(cd "$out" && pwd)
: >"$out/summary.txt"
bin=$repo/build/tests/gpuinfo.test
if [ ! -x "$bin" ]; then
  (cd "$repo" && go test -c -o "$bin" -ldflags '-extldflags "-Wl,-z,lazy"' ./sched/gpuinfo) ||
    { echo "$bin missing and cannot be built: build it on a Go machine (go test -c) and carry build/" >&2; exit 2; }
fi
driver=$([ -e /dev/nvidiactl ] && echo yes || echo no)
tests='TestHostFactsAndXidWatch|TestHostDiscovery'
if [ "${NH_SIM:-0}" = 1 ]; then
  sim=$(mktemp -d /tmp/detshare-nh.XXXX)
  export LD_LIBRARY_PATH=$repo/build/lib/simgpu DETSHARE_SIMGPU_STATE=$sim/state DETSHARE_TEST_NVML_DOUBLE=1
  driver=yes tests=TestHostFactsAndXidWatch # the double has no nvmlDeviceGetAttributes, which discovery calls
fi
(cd "$repo/sched/gpuinfo" && "$bin" -test.run "$tests" -test.v -test.count=1) >"$out/gpuinfo.out" 2>&1
rc=$?
check "$tests pass (rc)" 0 "$rc"
check "NVML driver present (/dev/nvidiactl)" yes "$driver"
arch=$(sed -n 's/.*Architecture:\([a-z]*\).*/\1/p' "$out/gpuinfo.out" | head -1)
check "GPU 0 architecture" hopper "$arch"
cc=$(sed -n 's/.*CCMajor:\([0-9]*\) CCMinor:\([0-9]*\).*/\1.\2/p' "$out/gpuinfo.out" | head -1)
check "GPU 0 compute capability" 9.0 "$cc"
grep -q "critical Xid errors cannot be watched\|no GPU supports critical Xid" "$out/gpuinfo.out" &&
  check "every GPU registered for critical Xid events" yes no || check "every GPU registered for critical Xid events" yes yes
! grep -q '^FAIL' "$out/summary.txt"
