# The CUDA semantics conformance suite (README.md): one program per case in build/tests/conformance/.
# Included by the top Makefile; also builds alone with gcc and make (integration/gpu/conformance.sh uses it):
#   make -f integration/conformance/build.mk conformance      (from the repository root)
CC            ?= gcc
BUILD         ?= $(CURDIR)/build
TESTBIN       ?= $(BUILD)/tests
CFLAGS_COMMON ?= -std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -D_GNU_SOURCE -I$(CURDIR)

CONF_DIR   := integration/conformance
CONF_SRCS  := $(sort $(wildcard $(CONF_DIR)/cases/c[0-9][0-9]_*.c))
CONF_BIN   := $(TESTBIN)/conformance
CONF_PROGS := $(patsubst $(CONF_DIR)/cases/%.c,$(CONF_BIN)/%,$(CONF_SRCS))

# -ffp-contract=off: the host reference of c11 must not fuse multiply-adds (the kernels do not either).
$(CONF_BIN)/%: $(CONF_DIR)/cases/%.c $(CONF_DIR)/cases/conf.h cgroupgpu/cuda/cuda_abi.h $(CONF_DIR)/build.mk
	@mkdir -p $(CONF_BIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -ffp-contract=off -pthread -o $@ $< -ldl

# another tenant's busy process for the test's "shared" mode (not a case)
$(CONF_BIN)/neighbour: $(CONF_DIR)/cases/neighbour.c $(CONF_DIR)/cases/conf.h cgroupgpu/cuda/cuda_abi.h $(CONF_DIR)/build.mk
	@mkdir -p $(CONF_BIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -pthread -o $@ $< -ldl

# the embedded PTX on stdout, for offline checks with ptxas (README.md)
$(CONF_BIN)/ptx_dump: $(CONF_DIR)/cases/ptx_dump.c $(CONF_DIR)/cases/conf.h cgroupgpu/cuda/cuda_abi.h $(CONF_DIR)/build.mk
	@mkdir -p $(CONF_BIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -pthread -o $@ $< -ldl

.PHONY: conformance
conformance: $(CONF_PROGS) $(CONF_BIN)/ptx_dump $(CONF_BIN)/neighbour
C_TARGETS += $(CONF_PROGS) $(CONF_BIN)/ptx_dump $(CONF_BIN)/neighbour
