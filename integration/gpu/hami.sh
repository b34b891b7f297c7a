#!/usr/bin/env bash
# hami.sh: builds HAMi-core (github.com/Project-HAMi/HAMi-core), a peer of issue 26's frontier, on the GPU machine
# from a source tree carried there (it has no network), into build/hami/libvgpu.so, where bench.py's hami-sm<P>
# configurations look for it (--hami-lib to use another). Prints the library's path.
#
#   bash integration/gpu/hami.sh SRC    # SRC: a HAMi-core checkout, e.g. `git archive` of it under build/hami-src
#
# Needs cmake, nm, a C compiler and the CUDA toolkit (CUDA_HOME, default /usr/local/cuda; its stubs for -lcuda and
# -lnvidia-ml). HAMI_OUT: where to build instead of build/hami. Built as HAMi-core's own build.sh (and its
# Dockerfile) builds it: its hooks on, CMAKE_BUILD_TYPE=Debug, its tests left out. Not Release: HAMi-core's Release
# flags add -fvisibility=hidden, which hides cuInit and the other hooks its dlsym hook hands out (only the few
# marked FUNC_ATTR_VISIBLE stay exported), so such a library loads, logs "Initializing" and limits nothing (issue
# 26's runs H1-H5 and J1-M1 were built so). The script refuses a library that does not export cuInit. Built so, the
# limit applies (runs Q1-Q3): slowly, over seconds, which is why bench.py runs HAMi-core's cases for at least 10 s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start_script 13 "$@"
src=$(cd "$out" && pwd) || exit 2
[ -f "$src/CMakeLists.txt" ] && [ -f "$src/src/libvgpu.c" ] ||
  { echo "hami.sh: $src is not a HAMi-core source tree (no CMakeLists.txt and src/libvgpu.c)" >&2; exit 2; }
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -f "$cuda/include/cuda.h" ] || { echo "hami.sh: no CUDA toolkit at $cuda (set CUDA_HOME)" >&2; exit 2; }
dest=${HAMI_OUT:-$repo/build/hami}
# an older library is removed first: a build that fails must not leave bench.py one it did not build (issue 26's
# run M1 measured a stale Release library after this script had refused its new build)
rm -rf "$dest/obj" "$dest/libvgpu.so"
mkdir -p "$dest/obj"
export CUDA_HOME=$cuda LIBRARY_PATH=$cuda/lib64/stubs:$cuda/targets/x86_64-linux/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}
# HAMi-core asks for a CMake older than 3.5, which CMake 4 refuses without this
cmake -S "$src" -B "$dest/obj" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Debug -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 \
  -DHOOK_MEMINFO_ENABLE=1 -DHOOK_NVML_ENABLE=1 -DTEST_DEVICE_ID=0 >"$dest/cmake.log" 2>&1 ||
  { tail -20 "$dest/cmake.log" >&2; echo "hami.sh: cmake failed (log: $dest/cmake.log)" >&2; exit 1; }
cmake --build "$dest/obj" --target vgpu -j "$(nproc)" >"$dest/build.log" 2>&1 ||
  { tail -20 "$dest/build.log" >&2; echo "hami.sh: build failed (log: $dest/build.log)" >&2; exit 1; }
# the dynamic symbols read whole before they are searched: `nm | grep -q` under pipefail fails when grep stops early
syms=$(nm -D --defined-only "$dest/obj/libvgpu.so") ||
  { echo "hami.sh: nm could not read $dest/obj/libvgpu.so" >&2; exit 1; }
grep -qw cuInit <<<"$syms" ||
  { echo "hami.sh: $dest/obj/libvgpu.so does not export cuInit: its hooks would never run" >&2; exit 1; }
cp "$dest/obj/libvgpu.so" "$dest/libvgpu.so"
echo "$dest/libvgpu.so"
