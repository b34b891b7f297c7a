# lib.sh: what the GPU scripts that run the real scheduler share. Sourced (". lib.sh"), never run.

# need_builds REPO: build/lib/libdetshare.so (built here when missing: make and cc suffice) and build/bin/detshare
# (built by `make build`, or carried to the device) must exist; returns 1 with a message when one cannot.
need_builds() {
  local repo=$1
  if [ ! -f "$repo/build/lib/libdetshare.so" ]; then
    echo "building libdetshare.so" >&2
    make -s -C "$repo" -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so || return 1
  fi
  [ -x "$repo/build/bin/detshare" ] || { echo "build/bin/detshare missing: run make build" >&2; return 1; }
}
