# libdetshare: build/lib/libdetshare.so and its C test programs in build/tests/.
# Included by the top Makefile; also works alone with gcc and make only (no Go):
#   make -f cgroupgpu/libdetshare/build.mk build/lib/libdetshare.so     (from the repository root)
CC            ?= gcc
BUILD         ?= $(CURDIR)/build
LIB           ?= $(BUILD)/lib
TESTBIN       ?= $(BUILD)/tests
CFLAGS_COMMON ?= -std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -D_GNU_SOURCE -I$(CURDIR)

DS_DIR     := cgroupgpu/libdetshare
DS_SRCS    := $(wildcard $(DS_DIR)/*.c)
DS_HDRS    := $(wildcard $(DS_DIR)/*.h) cgroupgpu/cuda/cuda_abi.h sched/table/detshare_table.h
DS_LIB     := $(LIB)/libdetshare.so
# -fvisibility=hidden: only the hooked cu*/nvml* entry points and dlsym are exported (libdetshare.map).
DS_CFLAGS  := $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -fvisibility=hidden -ftls-model=initial-exec -pthread
DS_LDFLAGS := -shared -Wl,--version-script=$(DS_DIR)/libdetshare.map -Wl,-z,now -Wl,-z,nodelete -ldl -pthread

# Test programs (tests/*.c): each is built twice when it uses the driver, linked with -lcuda against the simulated
# GPU (a test double) and not linked (runtime-style lookup through dlopen + cuGetProcAddress).
DS_TEST_SRCS := $(wildcard $(DS_DIR)/tests/*.c)
DS_TESTS     := $(patsubst $(DS_DIR)/tests/%.c,$(TESTBIN)/ds_%,$(DS_TEST_SRCS))
SIMGPU_DIR   ?= $(LIB)/simgpu

$(DS_LIB): $(DS_SRCS) $(DS_HDRS) $(DS_DIR)/libdetshare.map $(DS_DIR)/build.mk
	@mkdir -p $(dir $@)
	$(CC) $(DS_CFLAGS) -o $@ $(DS_SRCS) $(DS_LDFLAGS)

# Test programs never link libcuda at build time: they take the driver through dlopen (runtime style) or, for the
# -lcuda path, through ds_test_lcuda.h which links against the exported names resolved at load time (-z lazy,
# --unresolved-symbols) so that they build before the simulated GPU exists.
$(TESTBIN)/ds_%: $(DS_DIR)/tests/%.c $(wildcard $(DS_DIR)/tests/*.h) cgroupgpu/cuda/cuda_abi.h sched/table/detshare_table.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -pthread -o $@ $< -ldl -lm -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy

# `make build/lib/libdetshare.so` (relative name) works as documented.
ifneq ($(DS_LIB),build/lib/libdetshare.so)
build/lib/libdetshare.so: $(DS_LIB)
endif

.PHONY: libdetshare
libdetshare: $(DS_LIB) $(DS_TESTS)
C_TARGETS += $(DS_LIB) $(DS_TESTS)
