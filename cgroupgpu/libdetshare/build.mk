# libdetshare: build/lib/libdetshare.so and its C test programs in build/tests/.
# Included by the top Makefile; also works alone with gcc and make only (no Go):
#   make -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so     (from the repository root)
CC            ?= gcc
BUILD         ?= $(CURDIR)/build
LIB           ?= $(BUILD)/lib
TESTBIN       ?= $(BUILD)/tests
CFLAGS_COMMON ?= -std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -D_GNU_SOURCE -I$(CURDIR)

DS_DIR     := cgroupgpu/libdetshare
# Every src/*.c is one job of the library and every src/*.h its interface (file map: docs/libdetshare.md, "Source
# files"); a new file is built and tracked as a dependency without an edit here.
DS_SRCS    := $(wildcard $(DS_DIR)/src/*.c)
DS_HDRS    := $(wildcard $(DS_DIR)/src/*.h) cgroupgpu/cuda/cuda_abi.h internal/table/detshare_table.h internal/table/detshare_table_client.h
DS_LIB     := $(LIB)/libdetshare.so
# -fvisibility=hidden: only the hooked cu*/nvml* entry points and dlsym are exported (libdetshare.map).
# -include ds_glibc.h: the library needs no glibc newer than 2.17 (it is preloaded into images with old glibc);
# libdl.so.2 and libpthread.so.0 are named as needed because before glibc 2.34 the dl*/pthread_* functions are there.
DS_CFLAGS  := $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -fvisibility=hidden -ftls-model=initial-exec -pthread \
              -include $(DS_DIR)/src/ds_glibc.h
DS_LDFLAGS := -shared -Wl,--version-script=$(DS_DIR)/src/libdetshare.map -Wl,-z,now -Wl,-z,nodelete -pthread \
              -Wl,--no-as-needed -l:libdl.so.2 -l:libpthread.so.0

$(DS_LIB): $(DS_SRCS) $(DS_HDRS) $(DS_DIR)/src/libdetshare.map $(DS_DIR)/build.mk
	@mkdir -p $(dir $@)
	$(CC) $(DS_CFLAGS) -o $@ $(DS_SRCS) $(DS_LDFLAGS)

# Test programs (tests/), all test doubles or clients; none links libcuda at build time except ds_probe_lcuda,
# which is linked with -lcuda against the simulated GPU (a test double) when that is part of the build.
DS_TDEPS := $(wildcard $(DS_DIR)/tests/*.h) cgroupgpu/cuda/cuda_abi.h internal/table/detshare_table.h $(DS_DIR)/build.mk
DS_TESTS := $(TESTBIN)/ds_probe_rt $(TESTBIN)/ds_bench_launch $(TESTBIN)/ds_dlsym_old $(TESTBIN)/ds_procmap \
            $(TESTBIN)/nulldrv/libcuda.so.1 $(TESTBIN)/libds_nextlib.so
DS_SIMGPU_LIBDIR := $(LIB)/simgpu

$(TESTBIN)/ds_probe_rt: $(DS_DIR)/tests/probe.c $(DS_TDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -pthread -o $@ $< -ldl

$(TESTBIN)/ds_bench_launch: $(DS_DIR)/tests/bench_launch.c $(DS_TDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -pthread -o $@ $< -ldl

$(TESTBIN)/ds_dlsym_old: $(DS_DIR)/tests/dlsym_old.c $(DS_TDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -pthread -o $@ $< -ldl

$(TESTBIN)/ds_procmap: $(DS_DIR)/tests/procmap.c $(DS_TDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -o $@ $< -ldl

$(TESTBIN)/nulldrv/libcuda.so.1: $(DS_DIR)/tests/nulldrv.c $(DS_TDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -shared -Wl,-soname,libcuda.so.1 -o $@ $<

$(TESTBIN)/libds_nextlib.so: $(DS_DIR)/tests/nextlib.c $(DS_TDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -shared -o $@ $< -ldl

ifneq ($(wildcard integration/simgpu/build.mk),)
DS_TESTS += $(TESTBIN)/ds_probe_lcuda
$(TESTBIN)/ds_probe_lcuda: $(DS_DIR)/tests/probe.c $(DS_TDEPS) $(DS_SIMGPU_LIBDIR)/libcuda.so.1
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -DDRV_LINKED -o $@ $< -L$(DS_SIMGPU_LIBDIR) -l:libcuda.so.1 -ldl
endif

# `make build/lib/libdetshare.so` (relative name) works as documented.
ifneq ($(DS_LIB),build/lib/libdetshare.so)
build/lib/libdetshare.so: $(DS_LIB)
endif

.PHONY: libdetshare
libdetshare: $(DS_LIB) $(DS_TESTS)
C_TARGETS += $(DS_LIB) $(DS_TESTS)
