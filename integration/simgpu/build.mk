# The simulated GPU (a test double of the CUDA driver) and its test programs. Included by the top Makefile.
ifndef DETSHARE_SIMGPU_MK
DETSHARE_SIMGPU_MK := 1

SIMGPU_DIR     := integration/simgpu
SIMGPU_SRCS    := $(wildcard $(SIMGPU_DIR)/src/*.c)
SIMGPU_HDRS    := $(wildcard $(SIMGPU_DIR)/src/*.h) cgroupgpu/cuda/cuda_abi.h
SIMGPU_LIBDIR  := $(LIB)/simgpu
SIMGPU_LIB     := $(SIMGPU_LIBDIR)/libcuda.so.1
SIMGPU_NVML    := $(SIMGPU_LIBDIR)/libnvidia-ml.so.1
SIMGPU_PROBE   := $(TESTBIN)/simgpu-probe
SIMGPU_PROBE_L := $(TESTBIN)/simgpu-probe-linked
SIMGPU_CAPUNSAFE := $(TESTBIN)/capture-unsafe

$(SIMGPU_LIB): $(SIMGPU_SRCS) $(SIMGPU_HDRS) $(SIMGPU_DIR)/src/libcuda.map
	@mkdir -p $(SIMGPU_LIBDIR)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -shared -Wl,-soname,libcuda.so.1 \
	  -Wl,--version-script=$(SIMGPU_DIR)/src/libcuda.map -o $@ $(SIMGPU_SRCS) -lpthread
	ln -sf libcuda.so.1 $(SIMGPU_LIBDIR)/libcuda.so

# The simulated NVML reads the same state file: it is built with the driver double's state.c.
$(SIMGPU_NVML): $(SIMGPU_DIR)/nvml/nvml.c $(SIMGPU_DIR)/src/state.c $(SIMGPU_HDRS) $(SIMGPU_DIR)/nvml/libnvidia-ml.map
	@mkdir -p $(SIMGPU_LIBDIR)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -shared -Wl,-soname,libnvidia-ml.so.1 \
	  -Wl,--version-script=$(SIMGPU_DIR)/nvml/libnvidia-ml.map -o $@ $(SIMGPU_DIR)/nvml/nvml.c $(SIMGPU_DIR)/src/state.c -lpthread
	ln -sf libnvidia-ml.so.1 $(SIMGPU_LIBDIR)/libnvidia-ml.so

# The runtime-path probe reaches the driver as libcudart does (dlopen + cuGetProcAddress_v2): no -lcuda.
$(SIMGPU_PROBE): $(SIMGPU_DIR)/progs/probe.c cgroupgpu/cuda/cuda_abi.h
	@mkdir -p $(TESTBIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -o $@ $< -ldl -lpthread -lm

# The linked probe calls the exported symbols directly, like code built with -lcuda.
$(SIMGPU_PROBE_L): $(SIMGPU_DIR)/progs/probe.c cgroupgpu/cuda/cuda_abi.h $(SIMGPU_LIB)
	@mkdir -p $(TESTBIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -DPROBE_LINKED -o $@ $< -L$(SIMGPU_LIBDIR) -lcuda -ldl -lpthread -lm

# The GPU probe of unsafe calls during a capture (integration/gpu/probes/capture_unsafe.c), built here too so that
# simgpu_test.go checks it against the double's model of the rule.
$(SIMGPU_CAPUNSAFE): integration/gpu/probes/capture_unsafe.c cgroupgpu/cuda/cuda_abi.h
	@mkdir -p $(TESTBIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -o $@ $< -ldl

C_TARGETS += $(SIMGPU_LIB) $(SIMGPU_NVML) $(SIMGPU_PROBE) $(SIMGPU_PROBE_L) $(SIMGPU_CAPUNSAFE)

.PHONY: simgpu
simgpu: $(SIMGPU_LIB) $(SIMGPU_NVML) $(SIMGPU_PROBE) $(SIMGPU_PROBE_L) $(SIMGPU_CAPUNSAFE)

endif
