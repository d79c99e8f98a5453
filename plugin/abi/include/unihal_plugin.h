/*
 * unihal_plugin.h: the C ABI of unihal backend plugins.
 *
 * A plugin is one shared library that exports one symbol, UH_PLUGIN_ENTRY_SYMBOL
 * ("unihal_plugin_entry"), of type uh_plugin_entry_fn. unihal (the host) loads it, calls the entry
 * with its own ABI version and services, and gets back a function table (uh_plugin_api). Through
 * the table the host wraps the plugin into the HAL traits: the framework and the conformance suite
 * cannot tell a plugin from a built-in backend.
 *
 * Rules (docs/PLUGIN_ABI.md explains them, with the changelog):
 *
 *  1. Versions. UH_ABI_MAJOR changes only when a rule or a layout already published changes; the
 *     host refuses a plugin of another major before any call other than the entry, and a plugin
 *     refuses a host of another major by returning NULL with UH_ERR_ABI_MISMATCH. UH_ABI_MINOR
 *     grows when something is appended; both sides accept any minor of their major.
 *  2. Sizes. Every table and argument struct begins with `uint32_t size`, set by whoever fills it
 *     to sizeof() as it knows it. A reader only reads the fields that lie within `size`; fields
 *     past it count as absent (zero or NULL). Structs and tables only grow at the end; nothing is
 *     reordered, renumbered or removed within a major version.
 *  3. NULL means unsupported. A NULL entry in uh_plugin_api is an unsupported operation: the host
 *     reports HalError::Unsupported naming it (and the suite skips or fails it by the device's
 *     capabilities, as for any backend). The entries marked REQUIRED must be present. The host
 *     checks every handle, pointer, length and count a plugin returns (docs/PLUGIN_ABI.md,
 *     "What the host checks") and refuses the call, the device or the plugin that breaks them.
 *  4. Errors. Every fallible call returns uh_status (UH_OK = 0) and, on failure, fills the
 *     uh_error the host passes (never NULL): a code, typed details and a message. Strings are
 *     NUL-terminated UTF-8, truncated to their arrays.
 *  5. Ownership. Every object a plugin returns (uh_device, uh_mem, ...) is owned by the host until
 *     it calls the matching *_release; the plugin frees it then, or later if queued work still uses
 *     it (queued work keeps what it uses, as in the HAL). Releases never fail and never wait for
 *     queued work. Strings and arrays a plugin returns (uh_plugin_info, uh_device_props,
 *     uh_ccl_caps, test kernels) stay valid until the object they describe is released (for the
 *     plugin: forever; plugins are never unloaded).
 *  6. Threads. Every entry may be called from any host thread at once; a plugin is as thread-safe
 *     as the HAL traits require (docs/ARCHITECTURE.md). Host callbacks (uh_host_fn, the run of
 *     a uh_host_node) run on a thread of the plugin's choice and must not call into the same
 *     stream.
 *  7. Stream order and sticky errors follow the HAL: enqueues return once queued; the first
 *     failure of queued work sticks to its stream and every later call on it returns it.
 *  8. Buffers cross as (uh_mem*, offset, length) inside one plugin allocation. The host checks
 *     ranges, devices, overlaps, freed handles and host-buffer use before calling; a plugin checks
 *     again what it relies on.
 *  9. Names and numbers below (dtypes, op ids, error codes, flags) are stable: never reordered,
 *     never reused; new ones are appended.
 * 10. A plugin whose backend name is one the host has built in is refused unless the user asks
 *     for it (UNIHAL_PLUGIN_REPLACE=<name>).
 *
 * This header is the normative text of the ABI; unihal's Rust declarations (crate
 * unihal-plugin-abi) mirror it and a test checks that both agree on every number and layout.
 */
#ifndef UNIHAL_PLUGIN_H
#define UNIHAL_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UH_ABI_MAJOR 1
#define UH_ABI_MINOR 2
#define UH_PLUGIN_ENTRY_SYMBOL "unihal_plugin_entry"

/* ---- status codes (HalError variants) -------------------------------------------------- */
typedef int32_t uh_status;
#define UH_OK 0
#define UH_ERR_UNAVAILABLE 1      /* str[0] what, message reason */
#define UH_ERR_UNSUPPORTED 2      /* message what */
#define UH_ERR_INVALID_ARGUMENT 3 /* arg, invalid, details below */
#define UH_ERR_OUT_OF_MEMORY 4    /* num[0] requested, num[1] free */
#define UH_ERR_TIMEOUT 5          /* num[0] milliseconds, message what */
#define UH_ERR_ABORTED 6          /* message what */
#define UH_ERR_DEVICE_LOST 7      /* message what */
#define UH_ERR_ABI_MISMATCH 8     /* message what */
#define UH_ERR_VENDOR 9           /* str[0] library, str[1] call, arg code name, vendor_code, message */
#define UH_ERR_INTERNAL 10        /* message */

/* ---- kinds of UH_ERR_INVALID_ARGUMENT (HAL's Invalid) ----------------------------------- */
#define UH_INVALID_OTHER 0          /* message */
#define UH_INVALID_OUT_OF_RANGE 1   /* num[0] offset, num[1] len, num[2] size */
#define UH_INVALID_WRONG_DEVICE 2   /* str[0]/num[0] expected backend/ordinal, str[1]/num[1] found */
#define UH_INVALID_FREE_ENQUEUED 3  /* num[0] address, num[1] len */
#define UH_INVALID_FOREIGN_HANDLE 4 /* str[0] expected, str[1] found */
#define UH_INVALID_OVERLAP 5        /* num[0] src, num[1] dst, num[2] len */
#define UH_INVALID_BUSY 6           /* message */
#define UH_INVALID_VALUE 7          /* str[0] value, str[1] accepted */

typedef struct uh_error {
  uint32_t size;      /* sizeof(uh_error) as the host knows it */
  int32_t code;       /* UH_ERR_* */
  int32_t invalid;    /* UH_INVALID_* when code is UH_ERR_INVALID_ARGUMENT */
  uint32_t reserved;
  uint64_t num[3];
  int64_t vendor_code;
  char arg[64];
  char str[2][256];
  char message[1024];
} uh_error;

/* ---- dtypes (HAL's DType) ---------------------------------------------------------------- */
#define UH_DTYPE_F64 0
#define UH_DTYPE_F32 1
#define UH_DTYPE_F16 2
#define UH_DTYPE_BF16 3
#define UH_DTYPE_I8 4
#define UH_DTYPE_U8 5
#define UH_DTYPE_I16 6
#define UH_DTYPE_I32 7
#define UH_DTYPE_I64 8
#define UH_DTYPE_U32 9
#define UH_DTYPE_U64 10
#define UH_DTYPE_BOOL 11
#define UH_DTYPE_COUNT 12

/* ---- library op ids (HAL's OpId; operands as documented there) ---------------------------- */
#define UH_OP_FILL 0
#define UH_OP_COPY 1
#define UH_OP_CAST 2
#define UH_OP_NEG 3
#define UH_OP_ABS 4
#define UH_OP_EXP 5
#define UH_OP_LOG 6
#define UH_OP_SQRT 7
#define UH_OP_RSQRT 8
#define UH_OP_TANH 9
#define UH_OP_SIGMOID 10
#define UH_OP_RELU 11
#define UH_OP_GELU_TANH 12
#define UH_OP_GELU_ERF 13
#define UH_OP_SILU 14
#define UH_OP_RELU_BACKWARD 15
#define UH_OP_GELU_TANH_BACKWARD 16
#define UH_OP_GELU_ERF_BACKWARD 17
#define UH_OP_SILU_BACKWARD 18
#define UH_OP_ADD 19
#define UH_OP_SUB 20
#define UH_OP_MUL 21
#define UH_OP_DIV 22
#define UH_OP_MAXIMUM 23
#define UH_OP_MINIMUM 24
#define UH_OP_POW 25
#define UH_OP_ADD_SCALAR 26
#define UH_OP_SUB_SCALAR 27
#define UH_OP_MUL_SCALAR 28
#define UH_OP_DIV_SCALAR 29
#define UH_OP_MAXIMUM_SCALAR 30
#define UH_OP_MINIMUM_SCALAR 31
#define UH_OP_POW_SCALAR 32
#define UH_OP_AXPY 33
#define UH_OP_WHERE 34
#define UH_OP_RANDOM_UNIFORM 35
#define UH_OP_RANDOM_NORMAL 36
#define UH_OP_DROPOUT_FORWARD 37
#define UH_OP_DROPOUT_BACKWARD 38
#define UH_OP_REDUCE_SUM 39
#define UH_OP_REDUCE_MEAN 40
#define UH_OP_REDUCE_MAX 41
#define UH_OP_REDUCE_MIN 42
#define UH_OP_ARGMAX 43
#define UH_OP_ARGMIN 44
#define UH_OP_SOFTMAX 45
#define UH_OP_LOG_SOFTMAX 46
#define UH_OP_SOFTMAX_MASKED 47
#define UH_OP_LOG_SOFTMAX_MASKED 48
#define UH_OP_SOFTMAX_BACKWARD 49
#define UH_OP_LOG_SOFTMAX_BACKWARD 50
#define UH_OP_CROSS_ENTROPY 51
#define UH_OP_CROSS_ENTROPY_BACKWARD 52
#define UH_OP_LAYER_NORM 53
#define UH_OP_LAYER_NORM_BACKWARD 54
#define UH_OP_RMS_NORM 55
#define UH_OP_RMS_NORM_BACKWARD 56
#define UH_OP_MATMUL 57
#define UH_OP_INDEX_SELECT 58
#define UH_OP_INDEX_ADD 59
#define UH_OP_SGD_MOMENTUM 60
#define UH_OP_ADAMW 61
#define UH_OP_AMP_UNSCALE 62
#define UH_OP_AMP_UPDATE_SCALE 63
#define UH_OP_CLIP_GRAD_NORM 64
/* ABI 1.1: the transformer-block ops. */
#define UH_OP_ATTENTION 65
#define UH_OP_ATTENTION_BACKWARD 66
#define UH_OP_ROPE 67
#define UH_OP_ROPE_BACKWARD 68
#define UH_OP_ADD_LAYER_NORM 69
#define UH_OP_ADD_RMS_NORM 70
#define UH_OP_COUNT 71

/* ---- collectives ------------------------------------------------------------------------- */
#define UH_COLL_ALL_REDUCE 0
#define UH_COLL_BROADCAST 1
#define UH_COLL_REDUCE 2
#define UH_COLL_ALL_GATHER 3
#define UH_COLL_REDUCE_SCATTER 4
#define UH_COLL_SENDRECV 5
#define UH_COLL_ALL_TO_ALL 6
#define UH_COLL_COUNT 7

#define UH_RED_SUM 0
#define UH_RED_PROD 1
#define UH_RED_MIN 2
#define UH_RED_MAX 3
#define UH_RED_AVG 4
#define UH_RED_COUNT 5

/* ---- module formats (bits of uh_device_props.module_formats) ----------------------------- */
#define UH_MODULE_HOST_SYMBOLS 0
#define UH_MODULE_PTX 1
#define UH_MODULE_CUBIN 2
#define UH_MODULE_HIP_CODE_OBJECT 3
#define UH_MODULE_ASCEND_BINARY 4

/* ---- optional capability flags (bits of uh_device_props.flags) --------------------------- */
#define UH_CAP_EVENT_TIMING (1u << 0)
#define UH_CAP_PINNED_HOST_MEMORY (1u << 1)
#define UH_CAP_WIDE_FILL (1u << 2)
#define UH_CAP_HOST_CALLBACKS (1u << 3)
#define UH_CAP_STREAM_ORDERED_ALLOC (1u << 4)
#define UH_CAP_FAULT_POISONS_DEVICE (1u << 5)
#define UH_CAP_BITWISE_RNG (1u << 6)
#define UH_CAP_NEGATIVE_STRIDES_COPIED (1u << 7)

/* ---- native handles ---------------------------------------------------------------------- */
#define UH_NATIVE_NONE 0
#define UH_NATIVE_PTR 1
#define UH_NATIVE_INT 2
typedef struct uh_native {
  int32_t kind; /* UH_NATIVE_* */
  int32_t reserved;
  void *ptr;
  int64_t value;
} uh_native;

/* ---- log levels (uh_host_api.log) -------------------------------------------------------- */
#define UH_LOG_ERROR 1
#define UH_LOG_WARN 2
#define UH_LOG_INFO 3
#define UH_LOG_DEBUG 4
#define UH_LOG_TRACE 5

/* ---- opaque objects ---------------------------------------------------------------------- */
typedef struct uh_device uh_device;     /* an opened device */
typedef struct uh_mem uh_mem;           /* one device allocation */
typedef struct uh_host_mem uh_host_mem; /* one host allocation (pinned where the device can) */
typedef struct uh_stream uh_stream;     /* an in-order queue */
typedef struct uh_event uh_event;       /* an event */
typedef struct uh_module uh_module;     /* a loaded module */
typedef struct uh_function uh_function; /* a kernel of a module */
typedef struct uh_comm uh_comm;         /* a communicator (one rank) */

/* ---- what the host gives the plugin ------------------------------------------------------ */
typedef struct uh_host_api {
  uint32_t size;
  uint32_t abi_major; /* the host's UH_ABI_MAJOR */
  uint32_t abi_minor;
  uint32_t reserved;
  /* The host's log sink (UNIHAL_LOG filters it). Any thread; target and message are copied. */
  void (*log)(int32_t level, const char *target, const char *message);
} uh_host_api;

/* A host function queued on a stream. Called exactly once for every host_callback call,
 * whatever that call returns: with status UH_OK when the work before it has completed (it runs
 * then), or with another status when it never will (the enqueue failed, the stream failed or
 * was released first), so that the host frees `user` in this function and nowhere else. */
typedef void (*uh_host_fn)(void *user, uh_status status);

/* ABI 1.2: a host callback in a node the host owns and recycles, so that an enqueue allocates
 * nothing on the host's side and frees nothing across threads. The host embeds the node at the
 * start of its own (larger) node and passes it to host_callback_node; the plugin calls
 * `node->run(node, status)` exactly once for every host_callback_node call, whatever that call
 * returns, with the statuses of uh_host_fn (UH_OK when the work before it has completed, another
 * status when it never will: refused enqueue, failed or released stream). From the enqueue until
 * it calls `run`, `plugin` is the plugin's (a queue link, a pointer to its own record: the host
 * neither reads nor writes it); from the call to `run` on, the node is the host's again and the
 * plugin must not touch it (the host reuses it at once). `run` may be called from any thread
 * and never calls into the plugin's stream. */
typedef struct uh_host_node uh_host_node;
typedef void (*uh_node_fn)(uh_host_node *node, uh_status status);
struct uh_host_node {
  uint32_t size; /* sizeof(uh_host_node) as the host knows it */
  uint32_t reserved;
  uh_node_fn run; /* never NULL */
  void *plugin[2];
};

/* Called exactly once per mem_import call, whatever it returns: when the plugin no longer uses
 * the imported memory, or at once when the import is refused. The host frees `user` there only. */
typedef void (*uh_release_fn)(void *user);

/* ---- descriptive data -------------------------------------------------------------------- */
typedef struct uh_library_info {
  uint32_t size;
  uint32_t reserved;
  const char *role;    /* "driver", "collectives", ... */
  const char *name;    /* "CUDA driver", ... */
  const char *path;    /* NULL when not found */
  const char *version; /* NULL when unknown */
  const char *error;   /* why it is not usable; NULL when found */
} uh_library_info;

typedef struct uh_plugin_info {
  uint32_t size;
  uint32_t reserved;
  const char *name;    /* backend name: [a-z0-9_-]+, unique among backends */
  const char *version; /* the plugin's version */
  uint32_t simulated;  /* runs on a simulated vendor runtime */
  uint32_t concurrent; /* device work runs while the host goes on */
  uint32_t n_libraries;
  uint32_t reserved2;
  const uh_library_info *libraries; /* every vendor library used, found or not */
  /* The conformance manifest: lines "<unsupported|xfail> <case id or prefix.*> <reason>"
   * (docs/PORTING.md); "" when every case must pass. */
  const char *manifest;
} uh_plugin_info;

typedef struct uh_op_support {
  uint32_t op;         /* UH_OP_* */
  uint32_t dtype_mask; /* bit UH_DTYPE_x set: runs in that dtype */
} uh_op_support;

typedef struct uh_device_props {
  uint32_t size;
  uint32_t reserved;
  const char *name;   /* "unihal virtual CPU device 0" */
  const char *vendor; /* "host", "NVIDIA", ... */
  /* mandatory capabilities */
  uint64_t memory_bytes;
  uint64_t alloc_alignment;
  uint32_t compute_units;
  uint32_t warp_size;
  uint32_t max_grid[3];
  uint32_t max_block[3];
  uint32_t max_threads_per_block;
  uint32_t max_shared_mem_per_block;
  uint32_t module_formats; /* bits (1 << UH_MODULE_*) */
  /* optional capabilities */
  uint32_t flags;          /* UH_CAP_* */
  const char *arch;        /* NULL when none */
  uint64_t timer_resolution_ns; /* 0: none */
  uint32_t n_peers;
  uint32_t n_ops;
  const uint32_t *peers;   /* ordinals of peer devices */
  const uh_op_support *ops;
} uh_device_props;

typedef struct uh_accumulation {
  uint32_t dtype;         /* UH_DTYPE_* reduced */
  uint32_t accumulate_in; /* UH_DTYPE_* of the accumulator */
  uint32_t emulated_mask; /* bits (1 << UH_RED_*) emulated rather than native */
  uint32_t reserved;
} uh_accumulation;

#define UH_CCL_GROUPS (1u << 0)
#define UH_CCL_SPLIT (1u << 1)
#define UH_CCL_SURVIVES_DEAD_RANK (1u << 2)
#define UH_CCL_NAMES_MISSING_RANKS (1u << 3)
#define UH_CCL_TIMEOUT_ABORTS_PEERS (1u << 4)
#define UH_CCL_CROSSES_PROCESSES (1u << 5)

typedef struct uh_ccl_caps {
  uint32_t size;
  uint32_t flags;     /* UH_CCL_* */
  const char *engine; /* "unihal in-process (threads)", "NCCL 2.27.3", ... */
  uint32_t op_dtypes[UH_COLL_COUNT];    /* per UH_COLL_*: bits (1 << UH_DTYPE_*) */
  uint32_t reductions[UH_DTYPE_COUNT];  /* per dtype: bits (1 << UH_RED_*) */
  uint32_t n_accumulation;
  uint32_t reserved;
  const uh_accumulation *accumulation;
} uh_ccl_caps;

/* ---- argument structs -------------------------------------------------------------------- */
typedef struct uh_launch_config {
  uint32_t size;
  uint32_t shared_mem_bytes;
  uint32_t grid[3];
  uint32_t block[3];
} uh_launch_config;

/* A host kernel (UH_MODULE_HOST_SYMBOLS): the HAL's host-kernel ABI (HostLaunchCtx). */
typedef struct uh_host_launch_ctx {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t block_idx[3];
  uint32_t reserved;
  uint8_t *shared;
  uint64_t shared_bytes;
} uh_host_launch_ctx;
typedef int32_t (*uh_host_kernel_fn)(const uh_host_launch_ctx *ctx, void *const *params);

typedef struct uh_host_symbol {
  const char *name;
  uh_host_kernel_fn func;
  uint64_t n_params;
  const uint64_t *param_sizes;
} uh_host_symbol;

typedef struct uh_module_source {
  uint32_t size;
  uint32_t format; /* UH_MODULE_* */
  const uint8_t *bytes; /* image or PTX text (not NUL-terminated) */
  uint64_t len;
  uint64_t n_symbols;   /* UH_MODULE_HOST_SYMBOLS */
  const uh_host_symbol *symbols;
} uh_module_source;

#define UH_MAX_DIMS 8
typedef struct uh_tensor {
  uh_mem *mem;
  uint64_t mem_offset; /* the viewed buffer's range within the allocation */
  uint64_t mem_len;
  uint64_t offset;     /* byte offset of element [0,...] within that range */
  uint32_t dtype;      /* UH_DTYPE_* */
  uint32_t ndim;
  uint64_t shape[UH_MAX_DIMS];
  int64_t strides[UH_MAX_DIMS]; /* in elements */
} uh_tensor;

#define UH_SCALAR_F64 0
#define UH_SCALAR_I64 1
typedef struct uh_scalar {
  uint32_t kind; /* UH_SCALAR_* */
  uint32_t reserved;
  union {
    double f64;
    int64_t i64;
  } value;
} uh_scalar;

typedef struct uh_op_call {
  uint32_t size;
  uint32_t op; /* UH_OP_* */
  uint32_t n_tensors;
  uint32_t n_scalars;
  const uh_tensor *tensors; /* inputs then outputs, as the HAL documents per op */
  const uh_scalar *scalars;
  uint32_t has_rng;
  uint32_t reserved;
  uint64_t rng_seed;
  uint64_t rng_offset;
} uh_op_call;

typedef struct uh_collective {
  uint32_t size;
  uint32_t op;     /* UH_COLL_* except SENDRECV */
  uh_mem *send;
  uint64_t send_offset, send_len;
  uh_mem *recv;
  uint64_t recv_offset, recv_len;
  uint64_t count;  /* elements, as in NCCL */
  uint32_t dtype;  /* UH_DTYPE_* */
  uint32_t red;    /* UH_RED_* when the op reduces */
  uint32_t root;   /* broadcast, reduce */
  uint32_t reserved;
} uh_collective;

typedef struct uh_p2p {
  uint32_t recv; /* 0 send, 1 receive */
  uint32_t dtype;
  uh_mem *mem;
  uint64_t offset, len;
  uint64_t count;
  uint64_t peer;
} uh_p2p;

/* ---- the function table ------------------------------------------------------------------ */
typedef struct uh_plugin_api {
  uint32_t size;      /* frozen across majors */
  uint32_t abi_major; /* frozen across majors: the plugin's UH_ABI_MAJOR */
  uint32_t abi_minor; /* frozen across majors */
  uint32_t reserved;

  /* Backend. REQUIRED: info, probe, device_open, device_release, device_props,
   * device_memory_info, device_synchronize. */
  const uh_plugin_info *(*info)(void);
  uh_status (*probe)(uint32_t *count, uh_error *err);
  uh_status (*device_open)(uint32_t ordinal, uh_device **out, uh_error *err);
  void (*device_release)(uh_device *dev);
  uh_status (*device_props)(uh_device *dev, uh_device_props *out, uh_error *err);
  uh_status (*device_memory_info)(uh_device *dev, uint64_t *total, uint64_t *free_bytes, uh_error *err);
  uh_status (*device_synchronize)(uh_device *dev, uh_error *err);
  uh_status (*device_native)(uh_device *dev, uh_native *out);

  /* Memory. REQUIRED: mem_alloc, mem_release, host_alloc, host_release. Device memory may hold
   * anything; host memory must be zeroed. */
  uh_status (*mem_alloc)(uh_device *dev, uint64_t len, uh_mem **out, uint64_t *addr, uh_error *err);
  void (*mem_release)(uh_mem *mem);
  uh_status (*host_alloc)(uh_device *dev, uint64_t len, uh_host_mem **out, void **ptr, uh_error *err);
  void (*host_release)(uh_host_mem *mem);
  /* Wraps foreign device memory; `release(user)` exactly once, also when refused (uh_release_fn). */
  uh_status (*mem_import)(uh_device *dev, uint64_t addr, uint64_t len, uh_release_fn release,
                          void *user, uh_mem **out, uh_error *err);

  /* Streams. REQUIRED: stream_create, stream_release, copy_h2d, copy_d2h, copy_d2d, fill,
   * stream_synchronize, stream_query, stream_async_error; copy_peer of a device whose props list
   * peers, run_op of one that lists ops, host_callback of one that claims
   * UH_CAP_HOST_CALLBACKS. */
  uh_status (*stream_create)(uh_device *dev, uh_stream **out, uh_error *err);
  void (*stream_release)(uh_stream *s);
  uh_status (*copy_h2d)(uh_stream *s, uh_host_mem *src, uint64_t src_offset, uh_mem *dst,
                        uint64_t dst_offset, uint64_t len, uh_error *err);
  uh_status (*copy_d2h)(uh_stream *s, uh_mem *src, uint64_t src_offset, uh_host_mem *dst,
                        uint64_t dst_offset, uint64_t len, uh_error *err);
  uh_status (*copy_d2d)(uh_stream *s, uh_mem *src, uint64_t src_offset, uh_mem *dst,
                        uint64_t dst_offset, uint64_t len, uh_error *err);
  uh_status (*copy_peer)(uh_stream *s, uh_mem *src, uint64_t src_offset, uh_mem *dst,
                         uint64_t dst_offset, uint64_t len, uh_error *err);
  /* width 1, 2 or 4 bytes; value holds the pattern in its low bits. */
  uh_status (*fill)(uh_stream *s, uh_mem *dst, uint64_t offset, uint64_t len, uint32_t width,
                    uint32_t value, uh_error *err);
  /* args: one pointer per argument (CUDA kernelParams); sizes: each argument's size. */
  uh_status (*launch)(uh_stream *s, uh_function *f, const uh_launch_config *config, uint64_t n_args,
                      void *const *args, const uint64_t *sizes, uh_error *err);
  uh_status (*run_op)(uh_stream *s, const uh_op_call *call, uh_error *err);
  uh_status (*host_callback)(uh_stream *s, uh_host_fn fn, void *user, uh_error *err);
  uh_status (*stream_synchronize)(uh_stream *s, uh_error *err);
  uh_status (*stream_query)(uh_stream *s, uint32_t *done, uh_error *err);
  /* UH_OK when the stream has no sticky error, else the error. */
  uh_status (*stream_async_error)(uh_stream *s, uh_error *err);
  uh_status (*stream_native)(uh_stream *s, uh_native *out);

  /* Events. REQUIRED: all but event_elapsed and event_native (event_elapsed is REQUIRED of a
   * device whose props claim UH_CAP_EVENT_TIMING). flags bit 0: disable timing. */
  uh_status (*event_create)(uh_device *dev, uint32_t flags, uh_event **out, uh_error *err);
  void (*event_release)(uh_event *e);
  uh_status (*event_record)(uh_stream *s, uh_event *e, uh_error *err);
  uh_status (*stream_wait_event)(uh_stream *s, uh_event *e, uh_error *err);
  uh_status (*event_query)(uh_event *e, uint32_t *done, uh_error *err);
  uh_status (*event_synchronize)(uh_event *e, uh_error *err);
  uh_status (*event_elapsed)(uh_event *start, uh_event *end, float *ms, uh_error *err);
  uh_status (*event_native)(uh_event *e, uh_native *out);

  /* Modules. REQUIRED of a device whose props list module formats: module_load, module_release,
   * module_function, function_release (and launch). */
  uh_status (*module_load)(uh_device *dev, const uh_module_source *src, uh_module **out, uh_error *err);
  void (*module_release)(uh_module *m);
  /* *has_sizes = 1 and n_params/param_sizes (valid while the function lives) when known. */
  uh_status (*module_function)(uh_module *m, const char *name, uh_function **out, uint32_t *has_sizes,
                               uint64_t *n_params, const uint64_t **param_sizes, uh_error *err);
  void (*function_release)(uh_function *f);
  /* The conformance suite's test kernels for `dev` (unihal's kernels/src/testing), valid forever;
   * UH_ERR_UNSUPPORTED when the plugin has none. */
  uh_status (*test_kernels)(uh_device *dev, uh_module_source *out, uh_error *err);

  /* Collectives: NULL ccl_caps means no collective engine. With one, REQUIRED: ccl_unique_id,
   * ccl_init_rank, ccl_init_all, comm_release, comm_rank_size, comm_collective, comm_abort,
   * comm_async_error; comm_group with UH_CCL_GROUPS, comm_split with UH_CCL_SPLIT. */
  const uh_ccl_caps *(*ccl_caps)(void);
  /* Writes up to `cap` bytes; *len the id's length (NCCL: 128, HCCL: 4108). */
  uh_status (*ccl_unique_id)(uint8_t *buf, uint64_t cap, uint64_t *len, uh_error *err);
  /* timeout_ms 0: the engine's default (UNIHAL_CCL_TIMEOUT). */
  uh_status (*ccl_init_rank)(const uint8_t *id, uint64_t id_len, uint32_t nranks, uint32_t rank,
                             uh_device *dev, uint64_t timeout_ms, uh_comm **out, uh_error *err);
  uh_status (*ccl_init_all)(uh_device *const *devs, uint32_t n, uint64_t timeout_ms, uh_comm **out,
                            uh_error *err);
  void (*comm_release)(uh_comm *c);
  void (*comm_rank_size)(uh_comm *c, uint32_t *rank, uint32_t *size);
  uh_status (*comm_collective)(uh_comm *c, const uh_collective *call, uh_stream *s, uh_error *err);
  uh_status (*comm_group)(uh_comm *c, const uh_p2p *calls, uint64_t n, uh_stream *s, uh_error *err);
  /* color < 0: not a member (*out stays NULL). */
  uh_status (*comm_split)(uh_comm *c, int64_t color, int32_t key, uint64_t timeout_ms, uh_comm **out,
                          uh_error *err);
  void (*comm_abort)(uh_comm *c);
  uh_status (*comm_async_error)(uh_comm *c, uh_error *err);
  /* ABI 1.0 and 1.1 end here; later minors append. */

  /* ABI 1.2. host_callback with a host-owned node (uh_host_node): `node->run(node, status)`
   * exactly once, whatever this returns. Optional even with UH_CAP_HOST_CALLBACKS: when NULL (or
   * the plugin's minor is below 2) the host uses host_callback. */
  uh_status (*host_callback_node)(uh_stream *s, uh_host_node *node, uh_error *err);
} uh_plugin_api;

/* The one exported symbol. Returns the table (valid forever), or NULL with *err filled (for a
 * host of another major: UH_ERR_ABI_MISMATCH). */
typedef const uh_plugin_api *(*uh_plugin_entry_fn)(const uh_host_api *host, uh_error *err);

#ifdef __cplusplus
}
#endif
#endif /* UNIHAL_PLUGIN_H */
