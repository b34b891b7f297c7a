#!/usr/bin/env bash
# hami.sh: builds HAMi-core (github.com/Project-HAMi/HAMi-core), a peer of issue 26's frontier, on the GPU machine
# from a source tree carried there (it has no network), into build/hami/libvgpu.so, where bench.py's hami-sm<P>
# configurations look for it (--hami-lib to use another). Prints the library's path.
#
#   bash integration/gpu/hami.sh SRC    # SRC: a HAMi-core checkout, e.g. `git archive` of it under build/hami-src
#
# Needs cmake, a C compiler and the CUDA toolkit (CUDA_HOME, default /usr/local/cuda; its stubs for -lcuda and
# -lnvidia-ml). Built as HAMi-core's own build.sh does (its hooks on), as a release library, its tests left out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
start_script 9 "$@"
src=$(cd "$out" && pwd) || exit 2
[ -f "$src/CMakeLists.txt" ] && [ -f "$src/src/libvgpu.c" ] ||
  { echo "hami.sh: $src is not a HAMi-core source tree (no CMakeLists.txt and src/libvgpu.c)" >&2; exit 2; }
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -f "$cuda/include/cuda.h" ] || { echo "hami.sh: no CUDA toolkit at $cuda (set CUDA_HOME)" >&2; exit 2; }
dest=$repo/build/hami
rm -rf "$dest/obj"
mkdir -p "$dest/obj"
export CUDA_HOME=$cuda LIBRARY_PATH=$cuda/lib64/stubs:$cuda/targets/x86_64-linux/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}
# HAMi-core asks for a CMake older than 3.5, which CMake 4 refuses without this
cmake -S "$src" -B "$dest/obj" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Release -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 \
  -DHOOK_MEMINFO_ENABLE=1 -DHOOK_NVML_ENABLE=1 -DTEST_DEVICE_ID=0 >"$dest/cmake.log" 2>&1 ||
  { tail -20 "$dest/cmake.log" >&2; echo "hami.sh: cmake failed (log: $dest/cmake.log)" >&2; exit 1; }
cmake --build "$dest/obj" --target vgpu -j "$(nproc)" >"$dest/build.log" 2>&1 ||
  { tail -20 "$dest/build.log" >&2; echo "hami.sh: build failed (log: $dest/build.log)" >&2; exit 1; }
cp "$dest/obj/libvgpu.so" "$dest/libvgpu.so"
echo "$dest/libvgpu.so"
