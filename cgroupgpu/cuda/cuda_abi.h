/*
 * cuda_abi.h — DetShare's own declarations of the CUDA driver ABI (x86-64 / aarch64 LP64, Linux).
 *
 * Why this exists: libdetshare and the simulated GPU (a test double, integration/simgpu) build without any NVIDIA
 * header. Everything here is transcribed from /work/shared/notes/cuda-driver-abi.md §1 (cuda.h 12.4/12.6, cudarc
 * bindgen for 13.0, driver docs for 13.1). Only what DetShare touches is declared; extend additively, never rename.
 *
 * Functions are declared once, in the X-macro list CUDA_ABI_FUNCTIONS(X): X(name, (parameters)). Every driver entry
 * point returns CUresult. From that list this header generates `typedef CUresult (*PFN_<name>)(...)` for every entry,
 * and, when CUDA_ABI_PROTOTYPES is defined before inclusion, the prototypes `CUresult <name>(...)` (for code linked
 * with -lcuda and for the simulated GPU, which exports every name). Names are the *exported* names
 * (cuMemAlloc_v2, cuLaunchKernel_ptsz, …); cuGetProcAddress takes the base name plus an ABI version.
 *
 * C11; no global state; nothing here allocates.
 */
#ifndef DETSHARE_CUDA_ABI_H
#define DETSHARE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * 1.2 Handles and scalar types
 * ------------------------------------------------------------------------------------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUgreenCtx_st *CUgreenCtx;               /* usable from one CPU thread at a time */
typedef struct CUdevResourceDesc_st *CUdevResourceDesc; /* opaque; there is no destroy call */
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

typedef void (*CUhostFn)(void *userData);
typedef void (*CUstreamCallback)(CUstream hStream, CUresult status, void *userData);

/* ---------------------------------------------------------------------------------------------------------------
 * 1.3 Enums and values
 * ------------------------------------------------------------------------------------------------------------- */

/* CUresult values (cuda.h 12.6; 916 from 12.8, 917 from 13.1, 918 from 13.3). */
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_PROFILER_DISABLED = 5,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_UNMAP_FAILED = 206,
    CUDA_ERROR_ARRAY_IS_MAPPED = 207,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_ALREADY_ACQUIRED = 210,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_LOSSY_QUERY = 402,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_TOO_MANY_PEERS = 711,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    CUDA_ERROR_MPS_RPC_FAILURE = 806,
    CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
    CUDA_ERROR_MPS_MAX_CLIENTS_REACHED = 808,
    CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED = 809,
    CUDA_ERROR_MPS_CLIENT_TERMINATED = 810,
    CUDA_ERROR_CDP_NOT_SUPPORTED = 811,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_TIMEOUT = 909,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    CUDA_ERROR_EXTERNAL_DEVICE = 911,
    CUDA_ERROR_INVALID_CLUSTER_SIZE = 912,
    CUDA_ERROR_FUNCTION_NOT_LOADED = 913,
    CUDA_ERROR_INVALID_RESOURCE_TYPE = 914,
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915,
    CUDA_ERROR_KEY_ROTATION = 916,
    CUDA_ERROR_STREAM_DETACHED = 917,
    CUDA_ERROR_GRAPH_RECAPTURE_FAILURE = 918,
    CUDA_ERROR_UNKNOWN = 999
};

/* CUdevResourceType. 12.4-13.0 have only 0 and 1; 1000 and 10000 from 13.1. */
typedef enum CUdevResourceType_enum {
    CU_DEV_RESOURCE_TYPE_INVALID = 0,
    CU_DEV_RESOURCE_TYPE_SM = 1,
    CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG = 1000,
    CU_DEV_RESOURCE_TYPE_WORKQUEUE = 10000
} CUdevResourceType;

enum { CU_GREEN_CTX_DEFAULT_STREAM = 0x1 }; /* CUgreenCtxCreate_flags: documented "Required" */

enum { /* CUdevSmResourceSplit_flags (12.5+) */
       CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING = 0x1,
       CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE = 0x2
};
enum { /* CUdevSmResourceGroup_flags (13.1+) */
       CU_DEV_SM_RESOURCE_GROUP_DEFAULT = 0,
       CU_DEV_SM_RESOURCE_GROUP_BACKFILL = 0x1,
       CU_DEV_SM_RESOURCE_GROUP_LOCALITY_DOMAIN_ID = 0x2
};
enum { CU_WORKQUEUE_SCOPE_DEVICE_CTX = 0, CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED = 1 };

/* cuGetProcAddress flags and result. */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1
};
typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* Streams and events. */
enum { CU_STREAM_DEFAULT = 0x0, CU_STREAM_NON_BLOCKING = 0x1 };
enum { CU_EVENT_DEFAULT = 0x0, CU_EVENT_BLOCKING_SYNC = 0x1, CU_EVENT_DISABLE_TIMING = 0x2, CU_EVENT_INTERPROCESS = 0x4 };
enum { CU_EVENT_RECORD_DEFAULT = 0x0, CU_EVENT_RECORD_EXTERNAL = 0x1 };
enum { CU_EVENT_WAIT_DEFAULT = 0x0, CU_EVENT_WAIT_EXTERNAL = 0x1 };

/* Contexts. */
enum {
    CU_CTX_SCHED_AUTO = 0x00,
    CU_CTX_SCHED_SPIN = 0x01,
    CU_CTX_SCHED_YIELD = 0x02,
    CU_CTX_SCHED_BLOCKING_SYNC = 0x04,
    CU_CTX_SCHED_MASK = 0x07,
    CU_CTX_MAP_HOST = 0x08,
    CU_CTX_LMEM_RESIZE_TO_MAX = 0x10,
    CU_CTX_COREDUMP_ENABLE = 0x20,
    CU_CTX_USER_COREDUMP_ENABLE = 0x40,
    CU_CTX_SYNC_MEMOPS = 0x80,
    CU_CTX_FLAGS_MASK = 0xFF
};
typedef enum CUlimit_enum {
    CU_LIMIT_STACK_SIZE = 0x00,
    CU_LIMIT_PRINTF_FIFO_SIZE = 0x01,
    CU_LIMIT_MALLOC_HEAP_SIZE = 0x02,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH = 0x03,
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 0x04,
    CU_LIMIT_MAX_L2_FETCH_GRANULARITY = 0x05,
    CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
} CUlimit;
typedef enum CUexecAffinityType_enum { CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0 } CUexecAffinityType;

/* Device attributes (the ones DetShare, PyTorch and cudart query; values from cuda.h). */
typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT = 14,
    CU_DEVICE_ATTRIBUTE_GPU_OVERLAP = 15,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT = 17,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_TCC_DRIVER = 35,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED = 78,
    CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED = 79,
    CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED = 80,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD = 84,
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID = 85,
    CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED = 86,
    CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO = 87,
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS = 88,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED = 90,
    CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH = 96,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES = 98,
    CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100,
    CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST = 101,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
    CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED = 107,
    CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = 108,
    CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE = 109,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
    CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK = 111,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH = 120
} CUdevice_attribute;

enum { CU_COMPUTEMODE_DEFAULT = 0, CU_COMPUTEMODE_PROHIBITED = 2, CU_COMPUTEMODE_EXCLUSIVE_PROCESS = 3 };

/* Function attributes. */
typedef enum CUfunction_attribute_enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
    CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
    CU_FUNC_ATTRIBUTE_CACHE_MODE_CA = 7,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
} CUfunction_attribute;
typedef enum CUfunc_cache_enum {
    CU_FUNC_CACHE_PREFER_NONE = 0,
    CU_FUNC_CACHE_PREFER_SHARED = 1,
    CU_FUNC_CACHE_PREFER_L1 = 2,
    CU_FUNC_CACHE_PREFER_EQUAL = 3
} CUfunc_cache;
typedef enum CUmoduleLoadingMode_enum { CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2 } CUmoduleLoadingMode;
typedef int CUjit_option;     /* options are accepted and ignored by DetShare */
typedef int CUlibraryOption;

/* Launch parameters. cuLaunchKernel's `extra` array markers. */
#define CU_LAUNCH_PARAM_END_AS_INT 0x00
#define CU_LAUNCH_PARAM_END ((void *)CU_LAUNCH_PARAM_END_AS_INT)
#define CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT 0x01
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT)
#define CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT 0x02
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT)

typedef enum CUlaunchAttributeID_enum {
    CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
    CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY = 3,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT = 7,
    CU_LAUNCH_ATTRIBUTE_PRIORITY = 8,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP = 9,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN = 10,
    CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT = 12,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE = 13
} CUlaunchAttributeID;

/* Memory. */
typedef enum CUmemorytype_enum {
    CU_MEMORYTYPE_HOST = 0x01,
    CU_MEMORYTYPE_DEVICE = 0x02,
    CU_MEMORYTYPE_ARRAY = 0x03,
    CU_MEMORYTYPE_UNIFIED = 0x04
} CUmemorytype;
enum { CU_MEM_ATTACH_GLOBAL = 0x1, CU_MEM_ATTACH_HOST = 0x2, CU_MEM_ATTACH_SINGLE = 0x4 };
enum { CU_MEMHOSTALLOC_PORTABLE = 0x01, CU_MEMHOSTALLOC_DEVICEMAP = 0x02, CU_MEMHOSTALLOC_WRITECOMBINED = 0x04 };
typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4
} CUmemLocationType;
typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1
} CUmemAllocationType;
typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    CU_MEM_HANDLE_TYPE_WIN32 = 2,
    CU_MEM_HANDLE_TYPE_WIN32_KMT = 4,
    CU_MEM_HANDLE_TYPE_FABRIC = 8
} CUmemAllocationHandleType;
typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
} CUmemAllocationGranularity_flags;
typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} CUmemAccess_flags;
typedef enum CUmemPool_attribute_enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8
} CUmemPool_attribute;
typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;
typedef enum CUpointer_attribute_enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
} CUpointer_attribute;

/* Stream capture and graphs. */
typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;
typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;
typedef enum CUgraphNodeType_enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_MEMCPY = 1,
    CU_GRAPH_NODE_TYPE_MEMSET = 2,
    CU_GRAPH_NODE_TYPE_HOST = 3,
    CU_GRAPH_NODE_TYPE_GRAPH = 4,
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_WAIT_EVENT = 6,
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7,
    CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL = 8,
    CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT = 9,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
    CU_GRAPH_NODE_TYPE_BATCH_MEM_OP = 12,
    CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
} CUgraphNodeType;
enum {
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
    CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2,
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH = 4,
    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8
};
typedef enum CUgraphInstantiateResult_enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
    CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2,
    CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3,
    CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED = 4
} CUgraphInstantiateResult;
typedef enum CUgraphExecUpdateResult_enum {
    CU_GRAPH_EXEC_UPDATE_SUCCESS = 0,
    CU_GRAPH_EXEC_UPDATE_ERROR = 1,
    CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2,
    CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3,
    CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED = 4,
    CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 5,
    CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED = 6,
    CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE = 7,
    CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED = 8
} CUgraphExecUpdateResult;

/* ---------------------------------------------------------------------------------------------------------------
 * 1.4 Struct layouts (LP64). Offsets and sizes are asserted at the end of this header.
 * ------------------------------------------------------------------------------------------------------------- */
#define RESOURCE_ABI_VERSION 1
#define RESOURCE_ABI_EXTERNAL_BYTES 48 /* 12.4-13.0 union size */
#define RESOURCE_ABI_BYTES 40          /* 13.1+ union size */

/* All fields output-only. smCount is the only field before 13.0; 13.0 adds the partition metadata; 13.1 flags. */
typedef struct CUdevSmResource_st {
    unsigned int smCount;
    unsigned int minSmPartitionSize;
    unsigned int smCoscheduledAlignment;
    unsigned int flags;
} CUdevSmResource;
typedef struct CUdevWorkqueueConfigResource_st {
    CUdevice device;
    unsigned int wqConcurrencyLimit;
    int sharingScope;
} CUdevWorkqueueConfigResource;
typedef struct CUdevWorkqueueResource_st {
    unsigned char reserved[RESOURCE_ABI_BYTES];
} CUdevWorkqueueResource;

/* One 144-byte, 8-aligned struct using the 13.1 layout (notes §1.4 recommendation): always memset it to zero, treat
 * everything but `type` and `sm.*` as opaque, and never read nextResource unless the driver is >= 13010 (a 12.x
 * driver may write bytes 136..143 as part of its 48-byte union). */
typedef struct CUdevResource_st {
    CUdevResourceType type;
    unsigned char _internal_padding[92];
    union {
        CUdevSmResource sm;
        CUdevWorkqueueConfigResource wqConfig;
        CUdevWorkqueueResource wq;
        unsigned char _oversize[RESOURCE_ABI_BYTES];
    };
    struct CUdevResource_st *nextResource;
} CUdevResource;

typedef struct CU_DEV_SM_RESOURCE_GROUP_PARAMS_st { /* 13.1+; zero-initialise */
    unsigned int smCount;
    unsigned int coscheduledSmCount;
    unsigned int preferredCoscheduledSmCount;
    unsigned int flags;
    unsigned int reserved[12];
} CU_DEV_SM_RESOURCE_GROUP_PARAMS;

/* Launch attributes: id, 4 bytes of padding, a 64-byte value union -> 72 bytes. */
typedef union CUlaunchAttributeValue_union {
    char pad[64];
    int cooperative;
    int priority;
    struct {
        unsigned int x, y, z;
    } clusterDim;
    int clusterSchedulingPolicyPreference;
    int programmaticStreamSerializationAllowed;
    struct {
        CUevent event;
        int flags;
        int triggerAtBlockStart;
    } programmaticEvent;
    int memSyncDomain;
} CUlaunchAttributeValue;
typedef CUlaunchAttributeValue CUkernelNodeAttrValue;
typedef CUlaunchAttributeValue CUstreamAttrValue;
typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st { /* argument of cuLaunchKernelEx */
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream; /* offset 32: the field libdetshare redirects (on a copy) */
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct CUDA_LAUNCH_PARAMS_st { /* cuLaunchCooperativeKernelMultiDevice (deprecated) */
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st { /* argument of cuMemCreate; device memory only if location.type==DEVICE */
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;
typedef struct CUmemPoolProps_st { /* reserved[54] checked in 12.6 only */
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
/* Graph memory-allocation node parameters (CUDA_MEM_ALLOC_NODE_PARAMS_v1, 11.4+); dptr is set by the driver. */
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* Kernel node parameters. CUDA_KERNEL_NODE_PARAMS is _v2 since 12.0 (v3 has the same layout). ctx is ignored when
 * func is set; kern (a context-less CUkernel) + ctx selects the node's context. */
typedef struct CUDA_KERNEL_NODE_PARAMS_v1_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef CUDA_KERNEL_NODE_PARAMS_v2 CUDA_KERNEL_NODE_PARAMS;
typedef CUDA_KERNEL_NODE_PARAMS_v2 CUDA_KERNEL_NODE_PARAMS_v3;

typedef struct CUDA_MEMSET_NODE_PARAMS_st {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize; /* 1, 2 or 4 */
    size_t width;             /* in elements */
    size_t height;
} CUDA_MEMSET_NODE_PARAMS;

/* 12.2+: the memset node parameters of cuGraphNodeSetParams / cuGraphAddNode, with the context the node runs in. */
typedef struct CUDA_MEMSET_NODE_PARAMS_v2_st {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
    CUcontext ctx;
} CUDA_MEMSET_NODE_PARAMS_v2;

typedef struct CUDA_HOST_NODE_PARAMS_st {
    CUhostFn fn;
    void *userData;
} CUDA_HOST_NODE_PARAMS;

typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes;
    size_t srcY;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes;
    size_t dstY;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes;
    size_t Height;
} CUDA_MEMCPY2D;

typedef struct CUDA_MEMCPY3D_st {
    size_t srcXInBytes;
    size_t srcY;
    size_t srcZ;
    size_t srcLOD;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch;
    size_t srcHeight;
    size_t dstXInBytes;
    size_t dstY;
    size_t dstZ;
    size_t dstLOD;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch;
    size_t dstHeight;
    size_t WidthInBytes;
    size_t Height;
    size_t Depth;
} CUDA_MEMCPY3D;

/* 12.2+: the memcpy node parameters of cuGraphNodeSetParams / cuGraphAddNode, with the context the copy runs in. */
typedef struct CUDA_MEMCPY_NODE_PARAMS_st {
    int flags;
    int reserved;
    CUcontext copyCtx;
    CUDA_MEMCPY3D copyParams;
} CUDA_MEMCPY_NODE_PARAMS;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUgraphExecUpdateResultInfo_st {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

typedef struct CUgraphEdgeData_st { /* 12.3+ */
    unsigned char from_port;
    unsigned char to_port;
    unsigned char type;
    unsigned char reserved[5];
} CUgraphEdgeData;

/* Conditional nodes (12.3+; the ctx field and SWITCH 12.4+/12.8+): a handle made with
 * cuGraphConditionalHandleCreate (flag CU_GRAPH_COND_ASSIGN_DEFAULT: set to its default value at every launch), and
 * the node's parameters; the driver creates the body graphs and returns them through phGraph_out. */
typedef unsigned long long CUgraphConditionalHandle;
enum { CU_GRAPH_COND_ASSIGN_DEFAULT = 1 };
typedef enum { CU_GRAPH_COND_TYPE_IF = 0, CU_GRAPH_COND_TYPE_WHILE = 1, CU_GRAPH_COND_TYPE_SWITCH = 2 }
    CUgraphConditionalNodeType;
typedef struct CUDA_CONDITIONAL_NODE_PARAMS_st {
    CUgraphConditionalHandle handle;
    CUgraphConditionalNodeType type;
    unsigned int size;     /* bodies: 1 for IF and WHILE */
    CUgraph *phGraph_out;  /* set by the driver: the body graphs */
    CUcontext ctx;         /* every body node must be in this context */
} CUDA_CONDITIONAL_NODE_PARAMS;

/* cuGraphAddNode / cuGraphNodeSetParams generic parameters (12.2+): 256 bytes. DetShare sets the context of memset
 * and memcpy nodes through it. */
typedef struct CUgraphNodeParams_st {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_KERNEL_NODE_PARAMS_v3 kernel;
        CUDA_MEMCPY_NODE_PARAMS memcpy;
        CUDA_MEMSET_NODE_PARAMS_v2 memset;
        CUDA_HOST_NODE_PARAMS host;
        CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* CUDA_MEM_ALLOC_NODE_PARAMS_v2: the same layout */
        CUDA_CONDITIONAL_NODE_PARAMS conditional;
    };
    long long reserved2;
} CUgraphNodeParams;

/* Context creation parameters (cuCtxCreate_v3 / _v4). */
typedef struct CUexecAffinitySmCount_st {
    unsigned int val;
} CUexecAffinitySmCount;
typedef struct CUexecAffinityParam_st {
    CUexecAffinityType type;
    union {
        CUexecAffinitySmCount smCount;
    } param;
} CUexecAffinityParam;
typedef struct CUctxCigParam_st {
    int sharedDataType;
    void *sharedData;
} CUctxCigParam;
typedef struct CUctxCreateParams_st {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    CUctxCigParam *cigParams;
} CUctxCreateParams;

/* ---------------------------------------------------------------------------------------------------------------
 * 1.5 Driver entry points: X(exported_name, (parameters)). All return CUresult.
 * The ABI version cuGetProcAddress associates with each base name is in the notes §1.5 table.
 * ------------------------------------------------------------------------------------------------------------- */
#define CUDA_ABI_FUNCTIONS_CORE(X)                                                                                   \
    /* init, version, errors, entry points */                                                                       \
    X(cuInit, (unsigned int Flags))                                                                                  \
    X(cuDriverGetVersion, (int *driverVersion))                                                                      \
    X(cuGetErrorName, (CUresult error, const char **pStr))                                                           \
    X(cuGetErrorString, (CUresult error, const char **pStr))                                                         \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))                         \
    X(cuGetProcAddress_v2, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                       \
                            CUdriverProcAddressQueryResult *symbolStatus))                                           \
    X(cuGetExportTable, (const void **ppExportTable, const CUuuid *pExportTableId))                                  \
    /* devices */                                                                                                    \
    X(cuDeviceGet, (CUdevice * device, int ordinal))                                                                 \
    X(cuDeviceGetCount, (int *count))                                                                                \
    X(cuDeviceGetName, (char *name, int len, CUdevice dev))                                                          \
    X(cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev))                                                                \
    X(cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev))                                                             \
    X(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev))                                                            \
    X(cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev))                                      \
    X(cuDeviceComputeCapability, (int *major, int *minor, CUdevice dev))                                             \
    X(cuDeviceGetPCIBusId, (char *pciBusId, int len, CUdevice dev))                                                  \
    X(cuDeviceGetByPCIBusId, (CUdevice * dev, const char *pciBusId))                                                 \
    X(cuDeviceCanAccessPeer, (int *canAccessPeer, CUdevice dev, CUdevice peerDev))                                   \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool_out, CUdevice dev))                                            \
    X(cuDeviceGetMemPool, (CUmemoryPool * pool, CUdevice dev))                                                       \
    X(cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool))                                                         \
    /* primary context */                                                                                            \
    X(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev))                                                    \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                                                  \
    X(cuDevicePrimaryCtxSetFlags_v2, (CUdevice dev, unsigned int flags))                                             \
    X(cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active))                                  \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice dev))                                                                    \
    /* contexts */                                                                                                   \
    X(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev))                                          \
    X(cuCtxCreate_v3, (CUcontext * pctx, CUexecAffinityParam * paramsArray, int numParams, unsigned int flags,       \
                       CUdevice dev))                                                                                \
    X(cuCtxCreate_v4, (CUcontext * pctx, CUctxCreateParams * ctxCreateParams, unsigned int flags, CUdevice dev))     \
    X(cuCtxDestroy_v2, (CUcontext ctx))                                                                              \
    X(cuCtxPushCurrent_v2, (CUcontext ctx))                                                                          \
    X(cuCtxPopCurrent_v2, (CUcontext * pctx))                                                                        \
    X(cuCtxSetCurrent, (CUcontext ctx))                                                                              \
    X(cuCtxGetCurrent, (CUcontext * pctx))                                                                           \
    X(cuCtxGetDevice, (CUdevice * device))                                                                           \
    X(cuCtxGetDevice_v2, (CUdevice * device, CUcontext ctx))                                                         \
    X(cuCtxGetFlags, (unsigned int *flags))                                                                          \
    X(cuCtxSetFlags, (unsigned int flags))                                                                           \
    X(cuCtxGetId, (CUcontext ctx, unsigned long long *ctxId))                                                        \
    X(cuCtxGetApiVersion, (CUcontext ctx, unsigned int *version))                                                    \
    X(cuCtxSynchronize, (void))                                                                                      \
    X(cuCtxSynchronize_v2, (CUcontext ctx))                                                                          \
    X(cuCtxGetLimit, (size_t *pvalue, CUlimit limit))                                                                \
    X(cuCtxSetLimit, (CUlimit limit, size_t value))                                                                  \
    X(cuCtxGetStreamPriorityRange, (int *leastPriority, int *greatestPriority))                                      \
    X(cuCtxGetDevResource, (CUcontext hCtx, CUdevResource * resource, CUdevResourceType type))                       \
    X(cuCtxRecordEvent, (CUcontext hCtx, CUevent hEvent))                                                            \
    X(cuCtxWaitEvent, (CUcontext hCtx, CUevent hEvent))                                                              \
    /* green contexts */                                                                                             \
    X(cuDeviceGetDevResource, (CUdevice device, CUdevResource * resource, CUdevResourceType type))                   \
    X(cuDevSmResourceSplitByCount, (CUdevResource * result, unsigned int *nbGroups, const CUdevResource *input,      \
                                    CUdevResource *remaining, unsigned int useFlags, unsigned int minCount))         \
    X(cuDevSmResourceSplit, (CUdevResource * result, unsigned int nbGroups, const CUdevResource *input,              \
                             CUdevResource *remainder, unsigned int flags,                                           \
                             CU_DEV_SM_RESOURCE_GROUP_PARAMS *groupParams))                                          \
    X(cuDevResourceGenerateDesc, (CUdevResourceDesc * phDesc, CUdevResource * resources, unsigned int nbResources))  \
    X(cuGreenCtxCreate, (CUgreenCtx * phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags))              \
    X(cuGreenCtxDestroy, (CUgreenCtx hCtx))                                                                          \
    X(cuCtxFromGreenCtx, (CUcontext * pContext, CUgreenCtx hCtx))                                                    \
    X(cuGreenCtxGetDevResource, (CUgreenCtx hCtx, CUdevResource * resource, CUdevResourceType type))                 \
    X(cuGreenCtxRecordEvent, (CUgreenCtx hCtx, CUevent hEvent))                                                      \
    X(cuGreenCtxWaitEvent, (CUgreenCtx hCtx, CUevent hEvent))                                                        \
    X(cuGreenCtxStreamCreate, (CUstream * phStream, CUgreenCtx greenCtx, unsigned int flags, int priority))          \
    X(cuGreenCtxGetId, (CUgreenCtx greenCtx, unsigned long long *greenCtxId))                                        \
    /* modules, libraries, functions, kernels */                                                                     \
    X(cuModuleLoad, (CUmodule * module, const char *fname))                                                          \
    X(cuModuleLoadData, (CUmodule * module, const void *image))                                                      \
    X(cuModuleLoadDataEx, (CUmodule * module, const void *image, unsigned int numOptions, CUjit_option *options,     \
                           void **optionValues))                                                                     \
    X(cuModuleLoadFatBinary, (CUmodule * module, const void *fatCubin))                                              \
    X(cuModuleUnload, (CUmodule hmod))                                                                               \
    X(cuModuleGetFunction, (CUfunction * hfunc, CUmodule hmod, const char *name))                                    \
    X(cuModuleGetGlobal_v2, (CUdeviceptr * dptr, size_t *bytes, CUmodule hmod, const char *name))                    \
    X(cuModuleGetLoadingMode, (CUmoduleLoadingMode * mode))                                                          \
    X(cuLibraryLoadData, (CUlibrary * library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,  \
                          unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,   \
                          unsigned int numLibraryOptions))                                                           \
    X(cuLibraryLoadFromFile, (CUlibrary * library, const char *fileName, CUjit_option *jitOptions,                   \
                              void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,  \
                              void **libraryOptionValues, unsigned int numLibraryOptions))                           \
    X(cuLibraryUnload, (CUlibrary library))                                                                          \
    X(cuLibraryGetKernel, (CUkernel * pKernel, CUlibrary library, const char *name))                                 \
    X(cuLibraryGetModule, (CUmodule * pMod, CUlibrary library))                                                      \
    X(cuKernelGetFunction, (CUfunction * pFunc, CUkernel kernel))                                                    \
    X(cuKernelGetName, (const char **name, CUkernel hfunc))                                                          \
    X(cuKernelGetAttribute, (int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev))                   \
    X(cuKernelSetAttribute, (CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev))                   \
    X(cuFuncGetName, (const char **name, CUfunction hfunc))                                                          \
    X(cuFuncGetModule, (CUmodule * hmod, CUfunction hfunc))                                                          \
    X(cuFuncGetAttribute, (int *pi, CUfunction_attribute attrib, CUfunction hfunc))                                  \
    X(cuFuncSetAttribute, (CUfunction hfunc, CUfunction_attribute attrib, int value))                                \
    X(cuFuncSetCacheConfig, (CUfunction hfunc, CUfunc_cache config))                                                 \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, (int *numBlocks, CUfunction func, int blockSize,                  \
                                                    size_t dynamicSMemSize))                                         \
    /* launches (deprecated forms included) */                                                                       \
    X(cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,            \
                       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                       \
                       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra))            \
    X(cuLaunchKernel_ptsz, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,       \
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                  \
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra))       \
    X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))             \
    X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))        \
    X(cuLaunchCooperativeKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, \
                                  unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,            \
                                  unsigned int sharedMemBytes, CUstream hStream, void **kernelParams))               \
    X(cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY,                   \
                                       unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,        \
                                       unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,        \
                                       void **kernelParams))                                                         \
    X(cuLaunchCooperativeKernelMultiDevice, (CUDA_LAUNCH_PARAMS * launchParamsList, unsigned int numDevices,         \
                                             unsigned int flags))                                                    \
    X(cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void *userData))                                             \
    X(cuLaunchHostFunc_ptsz, (CUstream hStream, CUhostFn fn, void *userData))                                        \
    X(cuLaunch, (CUfunction f))                                                                                      \
    X(cuLaunchGrid, (CUfunction f, int grid_width, int grid_height))                                                 \
    X(cuLaunchGridAsync, (CUfunction f, int grid_width, int grid_height, CUstream hStream))

#define CUDA_ABI_FUNCTIONS_STREAMS(X)                                                                                \
    /* streams */                                                                                                    \
    X(cuStreamCreate, (CUstream * phStream, unsigned int Flags))                                                     \
    X(cuStreamCreateWithPriority, (CUstream * phStream, unsigned int flags, int priority))                           \
    X(cuStreamDestroy_v2, (CUstream hStream))                                                                        \
    X(cuStreamQuery, (CUstream hStream))                                                                             \
    X(cuStreamQuery_ptsz, (CUstream hStream))                                                                        \
    X(cuStreamSynchronize, (CUstream hStream))                                                                       \
    X(cuStreamSynchronize_ptsz, (CUstream hStream))                                                                  \
    X(cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int Flags))                                     \
    X(cuStreamWaitEvent_ptsz, (CUstream hStream, CUevent hEvent, unsigned int Flags))                                \
    X(cuStreamAddCallback, (CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags))        \
    X(cuStreamAddCallback_ptsz, (CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags))   \
    X(cuStreamGetPriority, (CUstream hStream, int *priority))                                                        \
    X(cuStreamGetPriority_ptsz, (CUstream hStream, int *priority))                                                   \
    X(cuStreamGetFlags, (CUstream hStream, unsigned int *flags))                                                     \
    X(cuStreamGetFlags_ptsz, (CUstream hStream, unsigned int *flags))                                                \
    X(cuStreamGetId, (CUstream hStream, unsigned long long *streamId))                                               \
    X(cuStreamGetId_ptsz, (CUstream hStream, unsigned long long *streamId))                                          \
    X(cuStreamGetCtx, (CUstream hStream, CUcontext * pctx))                                                          \
    X(cuStreamGetCtx_ptsz, (CUstream hStream, CUcontext * pctx))                                                     \
    X(cuStreamGetCtx_v2, (CUstream hStream, CUcontext * pCtx, CUgreenCtx * pGreenCtx))                               \
    X(cuStreamGetCtx_v2_ptsz, (CUstream hStream, CUcontext * pCtx, CUgreenCtx * pGreenCtx))                          \
    X(cuStreamGetDevice, (CUstream hStream, CUdevice * device))                                                      \
    X(cuStreamGetDevice_ptsz, (CUstream hStream, CUdevice * device))                                                 \
    X(cuStreamGetGreenCtx, (CUstream hStream, CUgreenCtx * phCtx))                                                   \
    X(cuStreamGetDevResource, (CUstream hStream, CUdevResource * resource, CUdevResourceType type))                  \
    /* stream capture */                                                                                             \
    X(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode))                                         \
    X(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, CUstreamCaptureMode mode))                                    \
    X(cuStreamBeginCaptureToGraph, (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,               \
                                    const CUgraphEdgeData *dependencyData, size_t numDependencies,                   \
                                    CUstreamCaptureMode mode))                                                       \
    X(cuStreamBeginCaptureToGraph_ptsz, (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,          \
                                         const CUgraphEdgeData *dependencyData, size_t numDependencies,              \
                                         CUstreamCaptureMode mode))                                                  \
    X(cuStreamEndCapture, (CUstream hStream, CUgraph * phGraph))                                                     \
    X(cuStreamEndCapture_ptsz, (CUstream hStream, CUgraph * phGraph))                                                \
    X(cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus * captureStatus))                                \
    X(cuStreamIsCapturing_ptsz, (CUstream hStream, CUstreamCaptureStatus * captureStatus))                           \
    X(cuStreamGetCaptureInfo_v2, (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out,  \
                                  CUgraph * graph_out, const CUgraphNode **dependencies_out,                         \
                                  size_t *numDependencies_out))                                                      \
    X(cuStreamGetCaptureInfo_v2_ptsz, (CUstream hStream, CUstreamCaptureStatus * captureStatus_out,                  \
                                       cuuint64_t * id_out, CUgraph * graph_out,                                     \
                                       const CUgraphNode **dependencies_out, size_t *numDependencies_out))           \
    X(cuStreamGetCaptureInfo_v3, (CUstream hStream, CUstreamCaptureStatus * captureStatus_out, cuuint64_t * id_out,  \
                                  CUgraph * graph_out, const CUgraphNode **dependencies_out,                         \
                                  const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out))                \
    X(cuStreamGetCaptureInfo_v3_ptsz, (CUstream hStream, CUstreamCaptureStatus * captureStatus_out,                  \
                                       cuuint64_t * id_out, CUgraph * graph_out,                                     \
                                       const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out,   \
                                       size_t *numDependencies_out))                                                 \
    X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode * mode))                                               \
    /* events */                                                                                                     \
    X(cuEventCreate, (CUevent * phEvent, unsigned int Flags))                                                        \
    X(cuEventDestroy_v2, (CUevent hEvent))                                                                           \
    X(cuEventRecord, (CUevent hEvent, CUstream hStream))                                                             \
    X(cuEventRecord_ptsz, (CUevent hEvent, CUstream hStream))                                                        \
    X(cuEventRecordWithFlags, (CUevent hEvent, CUstream hStream, unsigned int flags))                                \
    X(cuEventRecordWithFlags_ptsz, (CUevent hEvent, CUstream hStream, unsigned int flags))                           \
    X(cuEventQuery, (CUevent hEvent))                                                                                \
    X(cuEventSynchronize, (CUevent hEvent))                                                                          \
    X(cuEventElapsedTime, (float *pMilliseconds, CUevent hStart, CUevent hEnd))                                      \
    X(cuEventElapsedTime_v2, (float *pMilliseconds, CUevent hStart, CUevent hEnd))                                   \
    /* graphs */                                                                                                     \
    X(cuGraphCreate, (CUgraph * phGraph, unsigned int flags))                                                        \
    X(cuGraphDestroy, (CUgraph hGraph))                                                                              \
    X(cuGraphClone, (CUgraph * phGraphClone, CUgraph originalGraph))                                                 \
    X(cuGraphChildGraphNodeGetGraph, (CUgraphNode hNode, CUgraph * phGraph))                                         \
    X(cuGraphAddKernelNode_v2, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,          \
                                size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams))                  \
    X(cuGraphAddMemsetNode, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,             \
                             size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx))    \
    X(cuGraphAddMemcpyNode, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,             \
                             size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx))                \
    X(cuGraphAddHostNode, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,               \
                           size_t numDependencies, const CUDA_HOST_NODE_PARAMS *nodeParams))                         \
    X(cuGraphAddMemAllocNode, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,           \
                               size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams))                     \
    X(cuGraphAddEmptyNode, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,              \
                            size_t numDependencies))                                                                 \
    X(cuGraphAddNode, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,                   \
                       size_t numDependencies, CUgraphNodeParams *nodeParams))                                       \
    X(cuGraphMemAllocNodeGetParams, (CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS * params_out))                   \
    X(cuGraphAddNode_v2, (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,                \
                          const void *edgeData, size_t numDependencies, CUgraphNodeParams *nodeParams))              \
    X(cuGraphGetNodes, (CUgraph hGraph, CUgraphNode * nodes, size_t *numNodes))                                      \
    X(cuGraphNodeGetType, (CUgraphNode hNode, CUgraphNodeType * type))                                               \
    X(cuGraphKernelNodeGetParams_v2, (CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS * nodeParams))                      \
    X(cuGraphKernelNodeSetParams_v2, (CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *nodeParams))                 \
    X(cuGraphMemsetNodeGetParams, (CUgraphNode hNode, CUDA_MEMSET_NODE_PARAMS * nodeParams))                         \
    X(cuGraphMemcpyNodeGetParams, (CUgraphNode hNode, CUDA_MEMCPY3D * nodeParams))                                  \
    X(cuGraphNodeSetParams, (CUgraphNode hNode, CUgraphNodeParams * nodeParams))                                      \
    X(cuGraphInstantiateWithFlags, (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags))            \
    X(cuGraphInstantiateWithParams, (CUgraphExec * phGraphExec, CUgraph hGraph,                                      \
                                     CUDA_GRAPH_INSTANTIATE_PARAMS * instantiateParams))                             \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec * phGraphExec, CUgraph hGraph,                                 \
                                          CUDA_GRAPH_INSTANTIATE_PARAMS * instantiateParams))                        \
    X(cuGraphExecKernelNodeSetParams_v2, (CUgraphExec hGraphExec, CUgraphNode hNode,                                 \
                                          const CUDA_KERNEL_NODE_PARAMS *nodeParams))                                \
    X(cuGraphExecUpdate_v2, (CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo * resultInfo))      \
    X(cuGraphExecDestroy, (CUgraphExec hGraphExec))                                                                  \
    X(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))                                                     \
    X(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))                                                \
    X(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream))                                                     \
    X(cuGraphUpload_ptsz, (CUgraphExec hGraphExec, CUstream hStream))

#define CUDA_ABI_FUNCTIONS_MEMORY(X)                                                                                 \
    /* allocation (notes §3.4) */                                                                                    \
    X(cuMemGetInfo_v2, (size_t *free, size_t *total))                                                                \
    X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))                                                          \
    X(cuMemAllocPitch_v2, (CUdeviceptr * dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,                   \
                           unsigned int ElementSizeBytes))                                                           \
    X(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags))                                  \
    X(cuMemFree_v2, (CUdeviceptr dptr))                                                                              \
    X(cuMemGetAddressRange_v2, (CUdeviceptr * pbase, size_t *psize, CUdeviceptr dptr))                               \
    X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))                                      \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))                                 \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))           \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))      \
    X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))                                                          \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream))                                                     \
    X(cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps *poolProps))                                       \
    X(cuMemPoolDestroy, (CUmemoryPool pool))                                                                         \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep))                                                   \
    X(cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value))                             \
    X(cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value))                             \
    X(cuMemCreate, (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,             \
                    unsigned long long flags))                                                                       \
    X(cuMemRelease, (CUmemGenericAllocationHandle handle))                                                           \
    X(cuMemAddressReserve, (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,                      \
                            unsigned long long flags))                                                               \
    X(cuMemAddressFree, (CUdeviceptr ptr, size_t size))                                                              \
    X(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,                   \
                 unsigned long long flags))                                                                          \
    X(cuMemUnmap, (CUdeviceptr ptr, size_t size))                                                                    \
    X(cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))                     \
    X(cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop,                          \
                                      CUmemAllocationGranularity_flags option))                                      \
    X(cuArrayCreate_v2, (CUarray * pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray))                            \
    X(cuArray3DCreate_v2, (CUarray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray))                        \
    X(cuArrayDestroy, (CUarray hArray))                                                                              \
    X(cuMipmappedArrayCreate, (CUmipmappedArray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,       \
                               unsigned int numMipmapLevels))                                                        \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray))                                                   \
    X(cuMemAllocHost_v2, (void **pp, size_t bytesize))                                                               \
    X(cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags))                                              \
    X(cuMemFreeHost, (void *p))                                                                                      \
    X(cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags))                                          \
    X(cuMemHostUnregister, (void *p))                                                                                \
    X(cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr))                           \
    /* copies: synchronous (_ptds per-thread twins) and asynchronous (_ptsz twins) */                                \
    X(cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))                                                \
    X(cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))                                           \
    X(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream))                         \
    X(cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream))                    \
    X(cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))                               \
    X(cuMemcpyHtoD_v2_ptds, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))                          \
    X(cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))                                     \
    X(cuMemcpyDtoH_v2_ptds, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))                                \
    X(cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))                             \
    X(cuMemcpyDtoD_v2_ptds, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))                        \
    X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream))        \
    X(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream))   \
    X(cuMemcpyDtoHAsync_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))              \
    X(cuMemcpyDtoHAsync_v2_ptsz, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))         \
    X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))      \
    X(cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
    X(cuMemcpyPeer, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,       \
                     size_t ByteCount))                                                                              \
    X(cuMemcpyPeerAsync, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,  \
                          size_t ByteCount, CUstream hStream))                                                       \
    X(cuMemcpy2D_v2, (const CUDA_MEMCPY2D *pCopy))                                                                   \
    X(cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D *pCopy))                                                              \
    X(cuMemcpy2DUnaligned_v2, (const CUDA_MEMCPY2D *pCopy))                                                          \
    X(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D *pCopy, CUstream hStream))                                            \
    X(cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D *pCopy, CUstream hStream))                                       \
    X(cuMemcpy3D_v2, (const CUDA_MEMCPY3D *pCopy))                                                                   \
    X(cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D *pCopy))                                                              \
    X(cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D *pCopy, CUstream hStream))                                            \
    X(cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D *pCopy, CUstream hStream))                                       \
    /* memset */                                                                                                     \
    X(cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N))                                            \
    X(cuMemsetD8_v2_ptds, (CUdeviceptr dstDevice, unsigned char uc, size_t N))                                       \
    X(cuMemsetD16_v2, (CUdeviceptr dstDevice, unsigned short us, size_t N))                                          \
    X(cuMemsetD16_v2_ptds, (CUdeviceptr dstDevice, unsigned short us, size_t N))                                     \
    X(cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N))                                            \
    X(cuMemsetD32_v2_ptds, (CUdeviceptr dstDevice, unsigned int ui, size_t N))                                       \
    X(cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream))                        \
    X(cuMemsetD8Async_ptsz, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream))                   \
    X(cuMemsetD16Async, (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream))                      \
    X(cuMemsetD16Async_ptsz, (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream))                 \
    X(cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream))                        \
    X(cuMemsetD32Async_ptsz, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream))                   \
    X(cuMemsetD2D8_v2, (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height))      \
    X(cuMemsetD2D32_v2, (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height))      \
    X(cuMemsetD2D8Async, (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,     \
                          CUstream hStream))                                                                         \
    X(cuMemsetD2D32Async, (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,     \
                           CUstream hStream))

/* Every declared entry point. */
#define CUDA_ABI_FUNCTIONS(X)                                                                                        \
    CUDA_ABI_FUNCTIONS_CORE(X)                                                                                       \
    CUDA_ABI_FUNCTIONS_STREAMS(X)                                                                                    \
    CUDA_ABI_FUNCTIONS_MEMORY(X)

#define CUDA_ABI_DECLARE_PFN_(name, params) typedef CUresult(*PFN_##name) params;
CUDA_ABI_FUNCTIONS(CUDA_ABI_DECLARE_PFN_)
#undef CUDA_ABI_DECLARE_PFN_
/* Graph entry points of the real driver only (the test double has no child-graph or conditional nodes, so they are
 * not in CUDA_ABI_FUNCTIONS, whose every entry it exports): used by GPU-only conformance cases. */
typedef CUresult (*PFN_cuGraphAddChildGraphNode)(CUgraphNode *phGraphNode, CUgraph hGraph,
                                                  const CUgraphNode *dependencies, size_t numDependencies,
                                                  CUgraph childGraph);
typedef CUresult (*PFN_cuGraphConditionalHandleCreate)(CUgraphConditionalHandle *pHandle_out, CUgraph hGraph,
                                                        CUcontext ctx, unsigned int defaultLaunchValue,
                                                        unsigned int flags);

#ifdef CUDA_ABI_PROTOTYPES
#define CUDA_ABI_DECLARE_PROTO_(name, params) CUresult name params;
CUDA_ABI_FUNCTIONS(CUDA_ABI_DECLARE_PROTO_)
#undef CUDA_ABI_DECLARE_PROTO_
#endif

/* The driver version the 13.0 layout corresponds to, and the first versions of the green-context features. */
#define CUDA_ABI_VERSION_GREEN_CTX 12040
#define CUDA_ABI_VERSION_GREEN_STREAM 12050
#define CUDA_ABI_VERSION_SM_PARTITION_METADATA 13000
#define CUDA_ABI_VERSION_RESOURCE_NEXT 13010

/* ---------------------------------------------------------------------------------------------------------------
 * Layout checks (sizes/offsets from the notes §1.4; LP64 only).
 * ------------------------------------------------------------------------------------------------------------- */
#if !defined(__cplusplus) && (__SIZEOF_POINTER__ == 8)
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr is 64-bit on LP64");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams is 256 bytes");
_Static_assert(offsetof(CUgraphNodeParams, memset.ctx) == 56, "CUDA_MEMSET_NODE_PARAMS_v2.ctx at 40 of the union");
_Static_assert(offsetof(CUgraphNodeParams, memcpy.copyCtx) == 24, "CUDA_MEMCPY_NODE_PARAMS.copyCtx at 8 of the union");
_Static_assert(offsetof(CUgraphNodeParams, memcpy.copyParams) == 32, "copyParams at 16 of the union");
_Static_assert(offsetof(CUgraphNodeParams, conditional.ctx) == 40, "CUDA_CONDITIONAL_NODE_PARAMS.ctx at 24 of the union");
_Static_assert(sizeof(CUdevResource) == 144, "CUdevResource is 144 bytes in every 12.4+ version");
_Static_assert(_Alignof(CUdevResource) == 8, "13.1 layout is 8-aligned (nextResource)");
_Static_assert(offsetof(CUdevResource, type) == 0, "CUdevResource.type at 0");
_Static_assert(offsetof(CUdevResource, sm) == 96, "CUdevResource.sm at 96");
_Static_assert(offsetof(CUdevResource, sm.smCount) == 96, "sm.smCount at 96");
_Static_assert(offsetof(CUdevResource, sm.minSmPartitionSize) == 100, "sm.minSmPartitionSize at 100");
_Static_assert(offsetof(CUdevResource, sm.smCoscheduledAlignment) == 104, "sm.smCoscheduledAlignment at 104");
_Static_assert(offsetof(CUdevResource, nextResource) == 136, "nextResource at 136");
_Static_assert(sizeof(CU_DEV_SM_RESOURCE_GROUP_PARAMS) == 64, "group params are 64 bytes");
_Static_assert(sizeof(CUlaunchAttributeValue) == 64, "launch attribute value union is 64 bytes");
_Static_assert(sizeof(CUlaunchAttribute) == 72, "launch attribute is 72 bytes");
_Static_assert(offsetof(CUlaunchAttribute, value) == 8, "launch attribute value at 8");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream at 32");
_Static_assert(offsetof(CUlaunchConfig, attrs) == 40, "CUlaunchConfig.attrs at 40");
_Static_assert(offsetof(CUlaunchConfig, numAttrs) == 48, "CUlaunchConfig.numAttrs at 48");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig is 56 bytes");
_Static_assert(sizeof(CUDA_LAUNCH_PARAMS) == 56, "CUDA_LAUNCH_PARAMS is 56 bytes");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation is 8 bytes");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location at 8");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");
_Static_assert(offsetof(CUmemPoolProps, maxSize) == 24, "CUmemPoolProps.maxSize at 24");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104, "CUDA_MEM_ALLOC_NODE_PARAMS.bytesize at 104");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps is 88 bytes (12.6)");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v1) == 56, "kernel node params v1 is 56 bytes");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, kernelParams) == 40, "kernelParams at 40");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, kern) == 56, "kern at 56");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, ctx) == 64, "ctx at 64");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS) == 72, "kernel node params v2/v3 is 72 bytes");
_Static_assert(sizeof(CUDA_MEMSET_NODE_PARAMS) == 40, "memset node params is 40 bytes");
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes");
_Static_assert(sizeof(CUDA_MEMCPY3D) == 200, "CUDA_MEMCPY3D is 200 bytes");
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24, "CUDA_ARRAY_DESCRIPTOR is 24 bytes");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR is 40 bytes");
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "instantiate params is 32 bytes");
_Static_assert(sizeof(CUgraphEdgeData) == 8, "CUgraphEdgeData is 8 bytes");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams is 256 bytes");
_Static_assert(sizeof(CUctxCreateParams) == 24, "CUctxCreateParams is 24 bytes");
_Static_assert(sizeof(CUuuid) == 16, "CUuuid is 16 bytes");
#endif

/* added for conformance */
/* CUjit_option values (cuda.h CUjit_option_enum) that integration/conformance passes to cuModuleLoadDataEx so a PTX
 * JIT failure on a real GPU prints the compiler's log. */
enum {
    CU_JIT_INFO_LOG_BUFFER = 3,
    CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    CU_JIT_ERROR_LOG_BUFFER = 5,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
};

#ifdef __cplusplus
}
#endif

#endif /* DETSHARE_CUDA_ABI_H */
