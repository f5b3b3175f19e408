/*
 * zeroshard.h — the public C API of ZeroShard: ZeRO / FSDP-style sharded
 * data-parallel training for existing C (and CUDA) model code.
 *
 * One umbrella header, C99, usable from C++. MPI types stay out of it:
 * zs_mpi.h adds the entry point that takes a caller's MPI communicator.
 *
 * The model in one paragraph (docs/design.md has the long form): the user
 * registers UNITS (the sharding granularity, like an FSDP wrap unit: a layer
 * or a block), each a list of named TENSORS. After zs_model_finalize the
 * runtime owns their storage: each unit is one FLAT BUFFER padded to a
 * multiple of the world size and split into equal SHARDS, one per rank. Per
 * step the user gathers a unit (all-gather at stage 3), runs its forward,
 * releases it, acquires its gradient buffers in backward, releases them (the
 * reduce-scatter starts after the last release of the step), and calls
 * zs_step (optimizer on the local shard; all-gather of updated parameters
 * where the stage keeps full parameters).
 *
 * Stages follow the ZeRO paper (Rajbhandari et al., "ZeRO: Memory
 * Optimizations Toward Training Trillion Parameter Models", arXiv:1910.02054,
 * section 5): 0 replicates everything, 1 shards optimizer states, 2 also
 * shards gradients, 3 also shards parameters.
 *
 * Collectives never hang silently: one that the other ranks do not join
 * fails with ZS_ERR_TIMEOUT after zs_config.collective_timeout_s (warnings
 * every minute before that), naming the collective and the unit; the
 * context is unusable afterwards. A rank that fails on its own where the
 * ranks go on without an agreement (out of memory, a device, disk or MPI
 * error in zs_unit_gather, zs_unit_prefetch, zs_unit_grad_acquire,
 * zs_unit_grad_release, zs_step's work or zs_model_init's store of a unit)
 * tells the others at once (with
 * more than one rank): its context becomes unusable, and the others fail
 * in their next wait with ZS_ERR_REMOTE naming that rank and its error
 * instead of waiting for the timeout. A rank that times out tells them the
 * same way. A rank that stops or dies outside any call is found by
 * heartbeats: ZS_ERR_REMOTE naming it after zs_config.heartbeat_timeout_s
 * (docs/running.md).
 *
 * Conventions used by every comment below:
 *  - "elements" and "bytes" are always said explicitly.
 *  - Every fallible call returns zs_status; on failure zs_last_error() holds
 *    a message naming what failed (unit, tensor, rank, file) and what to do.
 *  - "Collective" means every rank of the context must make the same call in
 *    the same order (as with MPI); a collective call returns the same status
 *    on every rank unless the comment says otherwise. A rank whose calls
 *    diverged (it gathered a unit the others did not) can make the call
 *    where it happens end differently on each rank (one completes while
 *    another's collective is truncated); the context then fails every
 *    later call on every rank, naming the first failure.
 *  - Calls are blocking and synchronous on the host unless marked otherwise.
 *    With ZS_DEVICE_CUDA, "synchronous" is stream order: GPU work a call
 *    queued on device memory (the optimizer's kernels, a gradient buffer's
 *    zeroing, a one-rank gather's copy) may still run when it returns, and
 *    is ordered before everything queued afterwards on the legacy default
 *    stream (stream 0). Launch model kernels there, or make your stream
 *    wait for an event recorded on stream 0 after the call; data the call
 *    returns in host memory is complete (docs/cuda.md).
 *  - The library never calls exit() or abort().
 *  - Entries: a summary line, then short lists; the rationale is in docs/.
 *
 * Two parts: what has run where it targets is promised; what has not is
 * marked [experimental], or declared only with ZS_EXPERIMENTAL (the end of
 * this file). Structs are versioned ("Configuration" below; docs/api.md,
 * "Versions and compatibility"): a program built against an older header
 * of this major version runs against this library.
 */
#ifndef ZEROSHARD_H_
#define ZEROSHARD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is compiled with -fvisibility=hidden: what this header
 * declares is its exported API (docs/install.md, "The ABI promise"). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ==== Version ============================================================ */

#define ZS_VERSION_MAJOR 0
#define ZS_VERSION_MINOR 4
#define ZS_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, e.g. 200 for 0.2.0. */
#define ZS_VERSION_CODE \
  (ZS_VERSION_MAJOR * 10000 + ZS_VERSION_MINOR * 100 + ZS_VERSION_PATCH)

/* Version of the library actually linked (compare with ZS_VERSION_CODE). */
int zs_version(void);
/* The same as "MAJOR.MINOR.PATCH". Static storage; never NULL. */
const char* zs_version_string(void);

/* ==== Status codes ======================================================= */

/* One list generates the enum and the strings. Values are explicit and are
 * never renumbered. */
#define ZS_STATUS_LIST(X)                                                      \
  X(ZS_OK, 0, "success")                                                       \
  X(ZS_ERR_INVALID_ARGUMENT, 1, "invalid argument")                            \
  X(ZS_ERR_OUT_OF_MEMORY, 2, "out of memory")                                  \
  X(ZS_ERR_INVALID_STATE, 3, "invalid state (API misuse)")                     \
  X(ZS_ERR_MISMATCH, 4, "mismatch (ranks disagree, or another model)")        \
  X(ZS_ERR_COMM, 5, "communication backend error")                             \
  X(ZS_ERR_DEVICE, 6, "device backend error")                                  \
  X(ZS_ERR_IO, 7, "I/O error")                                                 \
  X(ZS_ERR_UNSUPPORTED, 8, "unsupported")                                      \
  X(ZS_ERR_INTERNAL, 9, "internal error")                                      \
  X(ZS_ERR_REMOTE, 10, "another rank failed")                                  \
  X(ZS_ERR_TIMEOUT, 11, "timed out")                                           \
  X(ZS_ERR_DIVERGED, 12, "training diverged")                                  \
  X(ZS_ERR_CORRUPT, 13, "corrupt or inconsistent data")

#define ZS__STATUS_ENUM(name, value, text) name = value,
typedef enum zs_status { ZS_STATUS_LIST(ZS__STATUS_ENUM) } zs_status;
#undef ZS__STATUS_ENUM

/* Short fixed name of a status ("invalid argument"). Static storage; an
 * unknown value gives "unknown status". */
const char* zs_status_string(zs_status status);

/* Detailed message of the last failed call on the calling thread (empty
 * string when none). Thread-local storage, valid until the next failing
 * call on this thread; never NULL. */
const char* zs_last_error(void);

/* ==== Data types and memory categories =================================== */

/* Element types. Tensors may be FLOAT32, BFLOAT16 or FLOAT16; the others
 * exist for metadata collectives and reports. */
typedef enum zs_dtype {
  ZS_FLOAT32 = 0,
  ZS_BFLOAT16 = 1,
  ZS_FLOAT16 = 2,
  ZS_UINT8 = 3,
  ZS_INT64 = 4,
  ZS_UINT64 = 5,
  ZS_FLOAT64 = 6,
  ZS_DTYPE_COUNT = 7,
  ZS_DTYPE_AUTO = -1 /* config and estimator: the parameters' own dtype */
} zs_dtype;

/* Size of one element in bytes; 0 for an invalid value. */
size_t zs_dtype_size(zs_dtype dtype);
/* "fp32", "bf16", "fp16", "u8", "i64", "u64", "f64"; "invalid" otherwise. */
const char* zs_dtype_name(zs_dtype dtype);

/* Every byte the runtime allocates is counted under one category, per rank.
 * model_state_bytes = PARAMS + GRADS + MASTER_WEIGHTS + OPTIMIZER_STATES. */
typedef enum zs_mem_category {
  ZS_MEM_PARAMS = 0,           /* persistent parameters: full (stages 0-2) or shard (3) */
  ZS_MEM_PARAMS_GATHERED = 1,  /* transient full units at stage 3 */
  ZS_MEM_GRADS = 2,            /* persistent gradients: full (0-1) or shard (2-3) */
  ZS_MEM_MASTER_WEIGHTS = 3,   /* fp32 master copy of low-precision parameters */
  ZS_MEM_OPTIMIZER_STATES = 4, /* Adam moments, SGD momentum */
  ZS_MEM_COMM_BUFFERS = 5,     /* reduction buffers, staging for collectives */
  ZS_MEM_ACTIVATIONS = 6,      /* buffers the user registers */
  ZS_MEM_OFFLOAD_HOST = 7,     /* host memory of CPU offload */
  ZS_MEM_NVME_STAGING = 8,     /* pinned staging pool of NVMe offload */
  ZS_MEM_OTHER = 9,            /* anything else (temporaries, metadata) */
  ZS_MEM_STACKED_VIEWS = 10,   /* resident pages of stacked kinds' views
                                  (zs_model_add_stacked) */
  ZS_MEM_COMM_SEGMENT = 11,    /* this rank's part of the shared-memory
                                  segment of host collectives (0.3) */
  ZS_MEM_CATEGORY_COUNT = 12
} zs_mem_category;

/* Room the output structs' per-category, per-phase and per-op arrays keep
 * (entries past the COUNT are zero), so that a new category or op does
 * not move the fields after them. */
#define ZS_MEM_CATEGORY_CAP 16
#define ZS_PHASE_CAP 4
#define ZS_COLL_OP_CAP 8

/* "params", "params_gathered", "grads", "master_weights",
 * "optimizer_states", "comm_buffers", "activations", "offload_host",
 * "nvme_staging", "other"; "invalid" otherwise. Static storage. */
const char* zs_mem_category_name(zs_mem_category category);

/* ==== Configuration ====================================================== */
/* Versioned structs (docs/api.md, "Versions and compatibility"):
 *  1. zs_config and the output structs start with struct_size (and
 *     zs_config with version); fields are only ever appended at the end.
 *  2. A caller built against an older header passes a smaller struct_size:
 *     it is accepted, and the fields it lacks take their defaults. A newer
 *     one (larger struct_size or version) is refused, naming both.
 *  3. Embedded structs (zs_optimizer_config, ...) are frozen: their layout
 *     never changes (the library checks it with static assertions).
 *  4. Fields left at their UNSET value take the library's default when
 *     used (as ncclConfig_t's NCCL_CONFIG_UNDEF_*). */

#define ZS_UNSET_INT (-2147483647 - 1) /* INT_MIN: an int field's default */
#define ZS_UNSET_SIZE ((size_t)-1)     /* a size_t field's default */
#define ZS_UNSET_DOUBLE (-1.0e300)     /* a double field's default */

typedef enum zs_device_kind {
  ZS_DEVICE_UNSET = ZS_UNSET_INT, /* default: HOST */
  ZS_DEVICE_HOST = 0,   /* buffers in host memory, collectives over MPI */
  ZS_DEVICE_CUDA = 1    /* buffers in GPU memory, collectives over NCCL;
                           [experimental] at world size > 1 (NCCL across
                           GPUs has run only on the CPU stand-in) */
} zs_device_kind;

/* How gradients are summed across ranks (zs_config.reduce_order). */
typedef enum zs_reduce_order {
  ZS_REDUCE_UNSET = ZS_UNSET_INT, /* default: FIXED */
  ZS_REDUCE_FIXED = 0,   /* each element summed in rank order: bitwise
                            independent of bucket sizes and MPI's algorithm */
  ZS_REDUCE_BACKEND = 1  /* the backend's reduce-scatter: results depend on
                            bucket sizes, within float rounding */
} zs_reduce_order;

/* How collectives on host memory travel between the ranks of one host
 * (zs_config.host_collectives; docs/running.md, "Host collectives"). The
 * environment variable ZS_HOST_COLLECTIVES=auto|shm|mpi overrides it. */
typedef enum zs_host_collectives {
  ZS_HOST_COLLECTIVES_UNSET = ZS_UNSET_INT, /* default: AUTO */
  ZS_HOST_COLLECTIVES_AUTO = 0, /* SHM when every rank is on this host (and
                                   more than one), else MPI */
  ZS_HOST_COLLECTIVES_SHM = 1,  /* a shared-memory segment (in /dev/shm, or
                                   $ZS_SHM_DIR) and a worker thread per
                                   rank; sums in rank order, the bits of
                                   MPI's fixed order; every rank must be on
                                   one host */
  ZS_HOST_COLLECTIVES_MPI = 2   /* MPI's collectives */
} zs_host_collectives;

typedef enum zs_optimizer_kind {
  ZS_OPTIM_UNSET = ZS_UNSET_INT, /* default: ADAMW */
  ZS_OPTIM_ADAMW = 0,  /* Loshchilov & Hutter, decoupled weight decay */
  ZS_OPTIM_ADAM = 1,   /* Kingma & Ba; weight decay added to the gradient */
  ZS_OPTIM_SGD = 2     /* momentum, dampening, nesterov as in PyTorch */
} zs_optimizer_kind;

/* zs_config.log_level; the environment variable ZS_LOG_LEVEL overrides. */
typedef enum zs_log_level {
  ZS_LOG_UNSET = ZS_UNSET_INT, /* default: WARN */
  ZS_LOG_ERROR = 0,
  ZS_LOG_WARN = 1,
  ZS_LOG_INFO = 2,
  ZS_LOG_DEBUG = 3
} zs_log_level;

/* Loss scaling for fp16 (Micikevicius et al., arXiv:1710.03740; the
 * dynamic rule of torch.cuda.amp.GradScaler with DeepSpeed's hysteresis).
 * The caller multiplies its loss by zs_model_loss_scale(); zs_step divides
 * it out. */
typedef enum zs_loss_scaling {
  ZS_LOSS_SCALE_UNSET = ZS_UNSET_INT, /* default: NONE */
  ZS_LOSS_SCALE_NONE = 0,    /* bf16 and fp32 need none */
  ZS_LOSS_SCALE_STATIC = 1,  /* a fixed scale; an overflowing step is skipped */
  ZS_LOSS_SCALE_DYNAMIC = 2  /* grows after growth_interval clean steps,
                                backs off on overflow */
} zs_loss_scaling;

/* Where offloaded state lives (docs/offload.md). */
typedef enum zs_offload_device {
  ZS_OFFLOAD_UNSET = ZS_UNSET_INT, /* default: NONE */
  ZS_OFFLOAD_NONE = 0,   /* on the device */
  ZS_OFFLOAD_CPU = 1,    /* NUMA-placed host memory (ZeRO-Offload) */
  ZS_OFFLOAD_NVME = 2    /* swap files under zs_config.nvme.path
                            (ZeRO-Infinity) */
} zs_offload_device;

/* NVMe offload's I/O engine (zs_config.nvme.aio). */
typedef enum zs_aio_backend {
  ZS_AIO_UNSET = ZS_UNSET_INT, /* default: AUTO */
  ZS_AIO_AUTO = 0,     /* io_uring, else the thread pool */
  ZS_AIO_IO_URING = 1,
  ZS_AIO_THREADS = 2   /* pread/pwrite on worker threads */
} zs_aio_backend;

/* weight_decay's "this optimizer's PyTorch default" (0.01 for AdamW, 0 for
 * Adam and SGD); ZS_UNSET_DOUBLE means the same. */
#define ZS_WEIGHT_DECAY_DEFAULT (-1.0)

/* Optimizer hyperparameters (frozen layout). Doubles: PyTorch computes the
 * scalar coefficients in double before the fp32 element math. */
typedef struct zs_optimizer_config {
  zs_optimizer_kind kind;
  double lr;           /* param group 0's learning rate; default 1e-3 */
  double beta1;        /* Adam/AdamW; default 0.9 */
  double beta2;        /* Adam/AdamW; default 0.999 */
  double eps;          /* Adam/AdamW; default 1e-8 */
  double weight_decay; /* param group 0's, >= 0 */
  double momentum;     /* SGD; default 0 */
  double dampening;    /* SGD; default 0 */
  int nesterov;        /* SGD: 0 (default) or 1; momentum > 0, dampening 0 */
} zs_optimizer_config;

/* The loss scaler (frozen layout; docs/precision.md). */
typedef struct zs_loss_scaler_config {
  zs_loss_scaling mode;
  double init_scale;     /* the (initial) scale in fp32's normal range,
                            >= min_scale; default 65536 */
  double growth_factor;  /* > 1; default 2 */
  double backoff_factor; /* in (0, 1); default 0.5 */
  int growth_interval;   /* clean steps before growing, >= 1; default 2000 */
  double min_scale;      /* fp32 normal range; default 1; an overflow at it
                            is ZS_ERR_DIVERGED */
  int hysteresis;        /* overflows tolerated before backing off, >= 1;
                            default 1 */
} zs_loss_scaler_config;

#define ZS_OFFLOAD_NUMA_AUTO (-1)       /* the GPU's node, else the cores' */
#define ZS_OFFLOAD_NUMA_INTERLEAVE (-2) /* pages interleaved over all nodes */

/* CPU offload of the optimizer (frozen layout; ZeRO-Offload,
 * arXiv:2101.06840). */
typedef struct zs_offload_config {
  zs_offload_device device; /* CPU: master weights and optimizer states in
                               host memory, the step on worker threads;
                               NVME: in swap files (nvme below) */
  int pin_memory; /* 1 (default): page-locked; a refused lock is a warning */
  int numa;       /* ZS_OFFLOAD_NUMA_AUTO (default), _INTERLEAVE or a node */
  int threads;    /* worker threads; 0 (default): the node's cores */
} zs_offload_config;

/* NVMe offload (frozen layout; ZeRO-Infinity, SC'21 sec. 6): swap files
 * under path/zs-<run>-rank-<R>/, streamed through pinned buffers. */
typedef struct zs_nvme_config {
  const char* path;      /* an existing directory, <= 4000 bytes; read at
                            zs_context_create, not retained */
  size_t buffer_count;   /* pinned buffers, >= 3 x fields per element;
                            default 9 */
  size_t buffer_size;    /* bytes per buffer, a multiple of 4096; default
                            16 MiB */
  size_t sub_group_size; /* elements per sub-group; 0 (default): a buffer's */
  int queue_depth;       /* I/O requests in flight, 1..4096; default 16 */
  zs_aio_backend aio;
  size_t block_size;     /* bytes per I/O transfer, a multiple of 4096;
                            default 1 MiB */
  size_t param_buffer_count;    /* stage-3 parameter shards on NVMe: pinned
                                   buffers, 1..4096; default 5 */
  size_t param_buffer_elements; /* ELEMENTS per buffer, >= the largest
                                   shard; 0 (default): the largest shard */
} zs_nvme_config;

/* zs_config.shard_group_size: one shard group per host (the ranks
 * MPI_COMM_TYPE_SHARED puts together; every host must have as many, and
 * they must be consecutive ranks). */
#define ZS_SHARD_GROUP_NODE (-1)

/* The runtime configuration (versioned: see the rules above). Start from
 * ZS_CONFIG_INIT or zs_config_init(), then set fields; ranges are checked
 * by zs_context_create and zs_config_validate, and errors name the field.
 * Every field's meaning and default: docs/config.md. */
typedef struct zs_config {
  size_t struct_size;    /* sizeof(zs_config) of the caller's header */
  unsigned int version;  /* ZS_VERSION_CODE of the caller's header */
  int stage;             /* ZeRO stage 0..3; default 0 */
  zs_device_kind device;
  zs_optimizer_config optimizer;
  zs_log_level log_level;
  double collective_timeout_s; /* a collective's wait before ZS_ERR_TIMEOUT;
                                  0: forever; default 1800 */
  size_t bucket_elements;   /* elements per reduce-scatter bucket, 1..2^31-1;
                               default 2^22 */
  int prefetch_depth;       /* stage 3: units all-gathered ahead, 0..64;
                               default 2 */
  size_t max_live_elements; /* stage 3: gathered elements prefetch never
                               pushes the gathered parameters over (room
                               kept for units gathered on use; unused
                               prefetches freed if one would pass it:
                               docs/overlap.md); 0 (default): no limit */
  int reshard_after_forward; /* stage 3: 1 (default) frees a unit at its
                                forward release, 0 keeps it for backward */
  zs_reduce_order reduce_order;
  int progress_thread;      /* 1 (default): a thread drives MPI progress */
  zs_dtype reduce_dtype;    /* gradients' dtype: ZS_DTYPE_AUTO (default,
                               each unit's own) or ZS_FLOAT32 */
  int grad_accum_steps;     /* micro-batches per optimizer step, >= 1;
                               default 1 */
  int grad_accum_local;     /* 1: reduce once at the K-th micro-batch
                               (FSDP's no_sync); default 0 */
  int clip_grad_norm;       /* 1: clip the global L2 norm; default 0 */
  double max_grad_norm;     /* > 0 when clipping; default 1 */
  zs_loss_scaler_config loss_scaler;
  const char* profile_dir;  /* Chrome traces here (ZS_PROFILE overrides);
                               NULL (default): off; not retained */
  zs_offload_config offload_optimizer;
  zs_offload_device offload_param; /* stage 3 with offload_optimizer: the
                                      parameter shards too */
  zs_nvme_config nvme;      /* with ZS_OFFLOAD_NVME */
  /* 0.3 */
  size_t param_persistence_threshold; /* units of at most this many
                               elements are replicated in every model of
                               the context (zs_model_set_persistence_
                               threshold overrides); 0 (default): none */
  double heartbeat_timeout_s; /* a rank silent this long (stopped, hung
                               outside the library, or gone) fails the
                               others' waits with ZS_ERR_REMOTE naming it;
                               0: off; default 30 (docs/running.md) */
  zs_host_collectives host_collectives; /* host-memory collectives among
                               the ranks of one host; default AUTO;
                               zs_context_config gives what AUTO picked
                               (SHM or MPI) */
  int reserved_0_3;         /* 0; ends 0.3's struct on 8 bytes, so that a
                               later release's appended field never lands
                               in padding (struct_size tells releases
                               apart) */
  /* 0.4 */
  int shard_group_size;     /* hybrid sharding: ranks each unit's shards
                               are spread over (G, dividing the world W);
                               the W / G groups hold replicas, and
                               gradients are all-reduced across them;
                               ZS_SHARD_GROUP_NODE: the ranks of one host;
                               default (UNSET or 0): all ranks (flat
                               sharding). docs/running.md, "Shard groups" */
  int reserved_0_4;         /* 0; ends 0.4's struct on 8 bytes */
  /* Appended fields go here, newest last (rule 1). */
} zs_config;

/* Every field UNSET: the library's defaults apply. C and C++. */
#define ZS_CONFIG_INIT                                                      \
  {                                                                         \
    sizeof(zs_config), ZS_VERSION_CODE, ZS_UNSET_INT, ZS_DEVICE_UNSET,      \
        {ZS_OPTIM_UNSET, ZS_UNSET_DOUBLE, ZS_UNSET_DOUBLE, ZS_UNSET_DOUBLE, \
         ZS_UNSET_DOUBLE, ZS_UNSET_DOUBLE, ZS_UNSET_DOUBLE,                 \
         ZS_UNSET_DOUBLE, ZS_UNSET_INT},                                    \
        ZS_LOG_UNSET, ZS_UNSET_DOUBLE, ZS_UNSET_SIZE, ZS_UNSET_INT,         \
        ZS_UNSET_SIZE, ZS_UNSET_INT, ZS_REDUCE_UNSET, ZS_UNSET_INT,         \
        ZS_DTYPE_AUTO, ZS_UNSET_INT, ZS_UNSET_INT, ZS_UNSET_INT,            \
        ZS_UNSET_DOUBLE,                                                    \
        {ZS_LOSS_SCALE_UNSET, ZS_UNSET_DOUBLE, ZS_UNSET_DOUBLE,             \
         ZS_UNSET_DOUBLE, ZS_UNSET_INT, ZS_UNSET_DOUBLE, ZS_UNSET_INT},     \
        NULL, {ZS_OFFLOAD_UNSET, ZS_UNSET_INT, ZS_UNSET_INT, ZS_UNSET_INT}, \
        ZS_OFFLOAD_UNSET,                                                   \
        {NULL, ZS_UNSET_SIZE, ZS_UNSET_SIZE, ZS_UNSET_SIZE, ZS_UNSET_INT,   \
         ZS_AIO_UNSET, ZS_UNSET_SIZE, ZS_UNSET_SIZE, ZS_UNSET_SIZE},        \
        ZS_UNSET_SIZE, ZS_UNSET_DOUBLE, ZS_HOST_COLLECTIVES_UNSET, 0,       \
        ZS_UNSET_INT, 0                                                     \
  }

/* Fills *config with the library's defaults (readable), struct_size and
 * version from the caller's header.
 * @return ZS_OK, or INVALID_ARGUMENT (NULL, or a struct_size this library
 *         does not know). Use the macro; the function takes the size. */
zs_status zs_config_init_sized(zs_config* config, size_t struct_size);
#define zs_config_init(config) zs_config_init_sized((config), sizeof(zs_config))

/* Copies `in` into `out` with every UNSET field replaced by its default:
 * what zs_context_create will use. in and out may be the same.
 *  - out: initialized (ZS_CONFIG_INIT, zs_config_init) or `in` itself:
 *    its struct_size and version say which fields it has; only those are
 *    written.
 * @return ZS_OK, or INVALID_ARGUMENT (NULL, a newer or unknown version or
 *         struct_size, naming both versions). Pure. */
zs_status zs_config_resolve(const zs_config* in, zs_config* out);

/* Checks every field's range (after resolving).
 * @return ZS_OK, or INVALID_ARGUMENT naming the field, its value and the
 *         allowed range. Pure. */
zs_status zs_config_validate(const zs_config* config);

/* Reads a DeepSpeed-style JSON configuration on top of *config (keys:
 * docs/config.md; parsed with cJSON).
 *  - text: NUL-terminated, not retained. Unknown or repeated keys are
 *    errors (a typo must not be ignored).
 *  - A string read (nvme_path) is kept by the library for the process's
 *    life, once per distinct value.
 *  - Fields the caller's struct_size lacks cannot be set: an error.
 * @return ZS_OK, or INVALID_ARGUMENT naming the key or the parse position;
 *         *config is unchanged on error. */
zs_status zs_config_from_json(const char* text, zs_config* config);

/* zs_config_from_json on the contents of the file at path.
 * @return as zs_config_from_json, or IO naming the file. */
zs_status zs_config_from_json_file(const char* path, zs_config* config);

/* ==== Context ============================================================ */

/* One per process and data-parallel group: rank, world size, device,
 * communicator, configuration, memory accounting. */
typedef struct zs_context zs_context;

/* Creates a context over MPI_COMM_WORLD (zs_mpi.h takes any communicator).
 * If MPI is not initialized yet, calls MPI_Init_thread (requesting
 * MPI_THREAD_MULTIPLE); MPI_Finalize then happens when the last context
 * created this way is destroyed (or at process exit if none was created
 * successfully, so a failed create can be retried). A program run without
 * mpirun is a world of size 1.
 * Collective: also checks that every rank passed the same configuration
 * (one all-gather of a hash); a difference is ZS_ERR_MISMATCH on every rank
 * naming the first differing field and rank.
 * config: copied, not retained. *out: owned by the caller, free with
 * zs_context_destroy. Errors: ZS_ERR_INVALID_ARGUMENT (a config field),
 * ZS_ERR_MISMATCH, ZS_ERR_COMM, ZS_ERR_UNSUPPORTED (a device not built in). */
zs_status zs_context_create(const zs_config* config, zs_context** out);

/* Creates a context of this process alone, without MPI (world size 1):
 * collectives are copies, nothing is initialized or required from MPI (a
 * program need not run under mpirun, and may use MPI for other things). On
 * the CUDA device no NCCL is needed either. For single-process training,
 * CPU offload on one node's single process, tools and tests. config:
 * copied. *out: free with zs_context_destroy. Not collective. Errors: as
 * zs_context_create (no COMM). */
zs_status zs_context_create_local(const zs_config* config, zs_context** out);

/* Destroys the context (NULL is accepted). Destroy its models first: a
 * model still alive is detached (its storage freed, a warning logged; later
 * calls on it return ZS_ERR_INVALID_STATE and zs_model_destroy frees the
 * rest). Outstanding allocations are reported as leaks. Collective (it frees
 * the duplicated MPI communicator, and may finalize MPI). */
void zs_context_destroy(zs_context* ctx);

/* For a program about to end abnormally (before MPI_Abort, exit after an
 * error, or in a SIGTERM/SIGINT handler): removes the names of what this
 * rank's context keeps on disk, its NVMe swap files and swap directory
 * (docs/offload.md), which zs_context_destroy would remove but an abort
 * skips. The files stay open, so their data remains reachable by this
 * process until it ends or destroys the context (POSIX unlink): the
 * context and its models keep working, and a later destroy is still
 * correct. Files the runtime did not make are left alone. Local (no
 * communication, no waiting for I/O), async-signal-safe (unlink and rmdir
 * only), never fails; NULL, or a context without NVMe offload: nothing.
 * The analogue of ncclCommAbort for what a context has on disk. */
void zs_context_remove_files(zs_context* ctx);

/* This process's rank in the context's communicator (0 for NULL). */
int zs_context_rank(const zs_context* ctx);
/* Number of ranks in the context's communicator (0 for NULL). */
int zs_context_world_size(const zs_context* ctx);
/* The configuration the context uses: resolved (no UNSET field), in this
 * library's layout, its version and struct_size those of the caller's
 * release (an older caller reads its own fields; a copy of it makes a
 * context of that release). Owned by the context. NULL for NULL. */
const zs_config* zs_context_config(const zs_context* ctx);

/* ==== Memory accounting ================================================== */

/* Phases of a training step, for per-phase peaks: forward from the step's
 * start to its first gradient acquire, backward from there to zs_step,
 * step inside zs_step. */
typedef enum zs_phase {
  ZS_PHASE_FORWARD = 0,
  ZS_PHASE_BACKWARD = 1,
  ZS_PHASE_STEP = 2,
  ZS_PHASE_COUNT = 3
} zs_phase;

/* Name of a phase ("forward", "backward", "step"); "unknown" otherwise. */
const char* zs_phase_name(zs_phase phase);

/* Output structs (zs_memory_stats, zs_comm_counters, zs_offload_info,
 * zs_comm_record, zs_step_info, zs_memory_estimate) start with struct_size,
 * which the caller sets to sizeof (or leaves 0: the size in the release its
 * config names); the library fills only the fields that fit. */

/* Per-rank byte counts. total_peak is the peak of the sum over categories
 * (not the sum of per-category peaks). */
typedef struct zs_memory_stats {
  size_t struct_size;
  size_t current[ZS_MEM_CATEGORY_CAP]; /* bytes now */
  size_t peak[ZS_MEM_CATEGORY_CAP];    /* bytes, max since reset */
  size_t total_current;                  /* bytes now, all categories */
  size_t total_peak;                     /* bytes, max of the sum */
  size_t model_state_bytes; /* current params+grads+master+optimizer states */
  size_t allocations;       /* live allocations (user registrations too) */
  /* Peaks per phase of the last completed step (of the steps of every
   * model of the context; before the first zs_step: so far), each phase
   * starting from what was allocated when it began. */
  size_t phase_peak[ZS_PHASE_CAP][ZS_MEM_CATEGORY_CAP];
  size_t phase_peak_total[ZS_PHASE_CAP];
  /* Inside comm_buffers: the reduce-scatter bucket temporaries (the rest
   * are gradient accumulation buffers and saved sums of re-opened units) */
  size_t comm_bucket_current;
  size_t comm_bucket_peak;
  size_t resident_bytes; /* the process's resident set now (RSS, from
                            /proc/self/statm; 0 if unknown): what the
                            categories miss shows as the difference */
} zs_memory_stats;

/* Copies this rank's counters. Not collective. Errors: INVALID_ARGUMENT. */
zs_status zs_memory_stats_get(const zs_context* ctx, zs_memory_stats* out);

/* Sets every peak (per category and total) to its current value, e.g. to
 * measure the peak of one phase. Not collective. NULL is ignored. */
void zs_memory_reset_peak(zs_context* ctx);

/* Gives the device back the memory this context's caching allocator keeps
 * for reuse: with CUDA, the blocks of buffers the runtime freed (gathered
 * parameters, reduction buffers, ...), which it otherwise keeps and hands
 * out again without cudaMalloc, releasing them itself only when one of its
 * own allocations fails. Call it when the model code's own cudaMalloc, or
 * cuBLAS's, fails or is about to need room (PyTorch's
 * torch.cuda.empty_cache()). *released_bytes (may be NULL): the bytes
 * given back. Waits for the device (cudaFree synchronizes it); the host
 * backend keeps nothing: 0. Not collective. Errors: INVALID_ARGUMENT
 * (NULL ctx). */
zs_status zs_memory_release_cached(zs_context* ctx, size_t* released_bytes);

/* Counts a buffer the user allocated (e.g. activations) under category.
 * ptr: a key only, never dereferenced or freed by ZeroShard; must be
 * unique among live registrations. bytes: its size in bytes.
 * Errors: INVALID_ARGUMENT (NULL ptr, category out of range, ptr already
 * registered). Not collective. */
zs_status zs_memory_register(zs_context* ctx, zs_mem_category category,
                             const void* ptr, size_t bytes);

/* Stops counting a buffer registered with zs_memory_register. User
 * registrations and the runtime's own allocations are kept apart: runtime
 * memory cannot be unregistered, and a stale registration never blocks a
 * runtime allocation. Errors: INVALID_ARGUMENT if ptr is not a user
 * registration. */
zs_status zs_memory_unregister(zs_context* ctx, const void* ptr);

/* ==== Communication counters ============================================= */

typedef enum zs_coll_op {
  ZS_COLL_ALL_GATHER = 0,
  ZS_COLL_REDUCE_SCATTER = 1,
  ZS_COLL_ALL_REDUCE = 2,
  ZS_COLL_BROADCAST = 3,
  ZS_COLL_GATHER = 4,  /* every rank's block to some ranks only: the
                          stage-3 gather of a unit some ranks do not use
                          (zs_unit_mark_unused); a rank outside only sends */
  ZS_COLL_OP_COUNT = 5
} zs_coll_op;

/* "all_gather", "reduce_scatter", "all_reduce", "broadcast", "gather". */
const char* zs_coll_op_name(zs_coll_op op);

/* Counters of every collective this rank issued on the context since
 * creation. bytes counts the full (gathered) size per rank, as nccl-tests
 * does: count_per_rank * world_size * element size for all-gather and
 * reduce-scatter, count * element size for all-reduce and broadcast. */
typedef struct zs_comm_counters {
  size_t struct_size;
  uint64_t calls[ZS_COLL_OP_CAP];
  uint64_t bytes[ZS_COLL_OP_CAP];
  double seconds[ZS_COLL_OP_CAP];      /* from issue to completion */
  double wait_seconds[ZS_COLL_OP_CAP]; /* of which the caller was blocked
                                            waiting; the rest overlapped
                                            with its compute */
} zs_comm_counters;

/* Copies this rank's counters. Not collective. Errors: INVALID_ARGUMENT. */
zs_status zs_comm_counters_get(const zs_context* ctx, zs_comm_counters* out);

/* What CPU offload is doing on this rank. */
typedef struct zs_offload_info {
  size_t struct_size;
  int enabled;       /* config.offload_optimizer.device is 1 or 2 */
  int numa_node;     /* the chosen node; -1: interleaved */
  int workers;       /* optimizer worker threads (bound to its cores) */
  int pinned;        /* host memory page-locked */
  uint64_t steps_on_workers; /* optimizer runs executed by the workers */
  int nvme;          /* NVMe offload is on: config.offload_optimizer.device
                        or config.offload_param is 2 */
  uint64_t nvme_file_bytes; /* bytes of this rank's swap files on disk (all
                               its live models: optimizer states and
                               parameter shards) */
  const char* nvme_aio; /* "io_uring" or "threads"; NULL without NVMe.
                           Static storage. */
  uint64_t nvme_param_reads;       /* offload_param = nvme: parameter shards
                                      read from the swap file (a shard found
                                      in a buffer is not read) */
  uint64_t nvme_param_reads_ahead; /* ... of which started ahead of their
                                      use (along the prefetch trace, or the
                                      step's next unit) */
} zs_offload_info;

/* Copies this rank's offload state (all zero when offload is off). Not
 * collective. Errors: INVALID_ARGUMENT. */
zs_status zs_offload_info_get(const zs_context* ctx, zs_offload_info* out);

/* nccl-tests' bus-bandwidth factor (busbw = algbw * factor): (n-1)/n for
 * all-gather and reduce-scatter, 2(n-1)/n for all-reduce, 1 for
 * broadcast; 0 for a bad op or ranks < 1. */
double zs_busbw_factor(zs_coll_op op, int ranks);

/* One collective of this rank's communication log. */
typedef struct zs_comm_record {
  size_t struct_size; /* out[0]'s gives the array's stride */
  uint64_t seq;        /* position in this rank's collective sequence */
  zs_coll_op op;
  const char* purpose; /* "param gather", "grad reduce", ... (static) */
  int unit;            /* the unit it was for, or -1 */
  uint64_t bytes;      /* the full (gathered) size per rank, as nccl-tests */
  double issue_s;      /* seconds since the context was created */
  double done_s;       /* when this rank saw it complete; 0 in flight */
  double algbw_GBps;   /* bytes / (done - issue) / 1e9; 0 in flight */
  double busbw_GBps;   /* algbw * zs_busbw_factor(op, ranks) */
  /* 0.4 */
  const char* group;   /* the ranks it ran among: "world" (every rank; all
                          collectives without hybrid sharding), "shard"
                          (hybrid sharding's shard group) or "replica"
                          (its replica group). Static. */
  int ranks;           /* how many they are */
} zs_comm_record;

/* Copies the most recent min(cap, logged) collectives (the log keeps the
 * last 8192), oldest first, into out[0..); returns how many it wrote (with
 * out NULL: how many it holds). Times are issue to completion, so an
 * overlapped collective shows a lower bandwidth than the link has. Not
 * collective; call it from the thread that drives the model. */
size_t zs_comm_log_get(const zs_context* ctx, zs_comm_record* out, size_t cap);

/* ==== Model registration ================================================= */

typedef struct zs_model zs_model;

#define ZS_MAX_DIMS 8
#define ZS_NAME_MAX 128 /* bytes, including the terminating NUL */

/* Tensor flags for zs_model_add_tensor. */
#define ZS_TENSOR_FROZEN 1u /* not trained: gathered, never updated, no
                               optimizer state, gradient ignored */

/* Creates an empty model on ctx. Not collective. *out: owned by the
 * caller, free with zs_model_destroy before destroying ctx.
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
zs_status zs_model_create(zs_context* ctx, zs_model** out);

/* Frees the model and all its storage (NULL accepted), and removes its NVMe
 * swap files. Not collective, and blocking: nothing is freed under a
 * collective still writing into it, so it first waits for the model's
 * collectives in flight on this rank (all-gathers, reduce-scatters; none
 * after a completed zs_step) and, with CUDA, for the compute stream. A
 * collective the other ranks never issue (this rank gathered a unit they
 * did not) is waited for up to config.collective_timeout_s; then the
 * context fails (the others are told) and, as after any failure, memory a
 * collective may still write is kept, not freed. On a context that already
 * failed nothing is waited for. Call it before zs_context_destroy and
 * before MPI_Finalize. */
void zs_model_destroy(zs_model* model);

/* Adds a unit (the sharding granularity: one flat buffer) and returns its
 * id in *unit (0, 1, 2, ... in registration order). name: unique, 1 to
 * ZS_NAME_MAX-1 bytes, copied. Before finalize only.
 * Errors: INVALID_ARGUMENT (empty, too long or duplicate name), INVALID_STATE
 * (after finalize). A registration error also poisons the model: finalize
 * then fails on every rank, naming this rank, instead of hanging. */
zs_status zs_model_add_unit(zs_model* model, const char* name, int* unit);

/* Adds `count` units named "<prefix>.0" .. "<prefix>.<count-1>", one per
 * layer (as FSDP wraps each transformer layer), and writes their ids
 * (consecutive) to units[0..count-1]. prefix: 1 to ZS_NAME_MAX-13 bytes.
 * Errors: INVALID_ARGUMENT (count < 0, NULL units, a name as
 * zs_model_add_unit's), INVALID_STATE. Poisons the model on error. */
zs_status zs_model_add_units(zs_model* model, const char* prefix, int count,
                             int* units);

/* Adds a tensor to a unit and returns its model-wide id in *tensor (0, 1,
 * ... in registration order). name: unique in the model, copied. shape:
 * ndim (0..ZS_MAX_DIMS) extents >= 0, copied; 0-d is a scalar, a zero
 * extent gives an empty tensor. dtype: ZS_FLOAT32, ZS_BFLOAT16 or
 * ZS_FLOAT16 (a 16-bit unit keeps fp32 master weights in the optimizer
 * shard, docs/precision.md); all tensors of a unit share one dtype. flags:
 * 0 or ZS_TENSOR_FROZEN.
 * Errors: INVALID_ARGUMENT naming the tensor, UNSUPPORTED, INVALID_STATE.
 * Poisons the model on error (see zs_model_add_unit). */
zs_status zs_model_add_tensor(zs_model* model, int unit, const char* name,
                              int ndim, const int64_t* shape, zs_dtype dtype,
                              unsigned int flags, int* tensor);

/* Adds to `unit` a tensor tied to `owner` (e.g. an output projection
 * sharing the token embedding's weight): it has the owner's shape and dtype,
 * occupies no storage, and its views are the owner's. Gathering `unit` also
 * gathers the owner's unit; acquiring its gradients acquires the owner
 * unit's gradients, so both uses accumulate into one buffer that is reduced
 * once. owner: any untied tensor. *tensor receives the id (not NULL).
 * Errors: INVALID_ARGUMENT naming the tensor, INVALID_STATE (after
 * finalize); poisons the model on error. */
zs_status zs_model_add_tied_tensor(zs_model* model, int unit, const char* name,
                                   int owner, int* tensor);

/* ---- Stacked kinds: tensors stacked across layers (host only) ----------
 * A trainer that keeps one tensor per kind stacked over its L layers (llm.c:
 * qkvw is (L, 3C, C) and layer l's slice is at qkvw + l*3*C*C) registers
 * the kind once. Each layer's slice becomes a tensor of the unit owning
 * that layer, named "<kind>.<layer>", sharded, reduced, stepped and
 * checkpointed like any other; and the kind gets two views that stay at
 * one address for the model's life (zs_kind_data, zs_kind_grad), so the
 * trainer points its views there once and keeps its `base + l*stride`
 * arithmetic:
 *   - while unit u is gathered (zs_unit_gather .. zs_unit_release, also
 *     through a tie), the slices u owns hold its parameters in the
 *     parameter view (copied in when the gather completes);
 *   - while u's gradients are acquired, its slices in the gradient view
 *     are its accumulation buffer (copied in at the acquire: zeros at the
 *     step's first; copied back at the release, before the reduction);
 *   - elsewhere the views' contents are undefined: each view is a memfd
 *     mapping whose pages lying under no held slice are given back to the
 *     system (fallocate PUNCH_HOLE) at the release. Do not touch them: a
 *     read or write there (a leftover memset of all gradients) makes pages
 *     resident that the accounting does not count until a release nearby.
 * Every layer of a kind needs a slice (finalize checks). Each kind holds
 * two file descriptors (the memfds) for the model's life.
 * Memory: the pages under held slices are resident, counted under
 * ZS_MEM_STACKED_VIEWS; a slice that does not start or end on a page
 * boundary keeps up to one page (sysconf(_SC_PAGESIZE)) on each side
 * resident, shared with its neighbours. Cost: one copy of the unit's slices
 * per gather, two per gradient acquire/release. docs/wrapping.md, "Stacked
 * tensors". CPU contexts only (a CUDA context: UNSUPPORTED). */

/* Declares a stacked kind: `name` (1 to ZS_NAME_MAX-13 bytes, unique among
 * kinds), shape[0] layers of shape[1..ndim-1] each (ndim 1..ZS_MAX_DIMS,
 * extents >= 0; ndim 1 gives scalar slices), dtype as zs_model_add_tensor's.
 * Its views span the whole shape: prod(shape) elements. Slices are added
 * with zs_model_add_slice, or use zs_model_add_stacked for the common case.
 * *kind receives its id (0, 1, ... in order). Before finalize only; not
 * collective. Errors: INVALID_ARGUMENT naming the kind, UNSUPPORTED (a CUDA context),
 * INVALID_STATE. Poisons the model on error (see zs_model_add_unit). */
zs_status zs_model_add_kind(zs_model* model, const char* name, int ndim,
                            const int64_t* shape, zs_dtype dtype, int* kind);

/* Adds layer `layer`'s slice of a kind to `unit` as a tensor named
 * "<kind>.<layer>" of shape shape[1..] (the kind's), stored in the kind's
 * views at element `offset` (elements, not bytes: layer*prod(shape[1..])
 * for a plain stack; another offset for a permuted layout — the slices
 * tile the kind). flags: 0 or ZS_TENSOR_FROZEN. *tensor receives the
 * tensor id (may be NULL). The unit's tensors share one dtype (the kind's).
 * Before finalize only; not collective.
 * Errors: INVALID_ARGUMENT naming the kind and layer: unknown kind, layer
 * outside 0..shape[0]-1, a layer that already has a slice (owned twice),
 * a slice outside its kind (offset + numel > the kind's elements), a slice
 * overlapping another slice of the kind; INVALID_STATE. Poisons the model
 * on error. */
zs_status zs_model_add_slice(zs_model* model, int unit, int kind, int layer,
                             int64_t offset, unsigned int flags, int* tensor);

/* zs_model_add_kind, then zs_model_add_slice for every layer l at offset
 * l*layer_stride, owned by units[l] (shape[0] entries). layer_stride: the
 * elements between consecutive layers in the caller's arithmetic (qkvw:
 * 3*C*C); it must equal prod(shape[1..]) (else INVALID_ARGUMENT: the stride
 * does not match the shape; irregular layouts use zs_model_add_slice).
 * flags apply to every slice. Errors: as those calls'. */
zs_status zs_model_add_stacked(zs_model* model, const char* name, int ndim,
                               const int64_t* shape, int64_t layer_stride,
                               zs_dtype dtype, unsigned int flags,
                               const int* units, int* kind);

/* The kind's parameter view (prod(shape) elements of its dtype) / gradient
 * view (prod(shape) elements of zs_tensor_field_dtype(slice, ZS_FIELD_GRAD))
 * after finalize: the same address until zs_model_destroy, owned by the
 * model (do not free or unmap). Only held units' slices are meaningful
 * (see above); read and accumulate only there. Not collective.
 * Errors: INVALID_ARGUMENT (unknown kind, NULL out; zs_kind_grad: every
 * slice frozen), INVALID_STATE (before finalize). */
zs_status zs_kind_data(zs_model* model, int kind, void** data);
zs_status zs_kind_grad(zs_model* model, int kind, void** grad);

/* Kinds registered so far (0 for NULL), and one kind's id by name
 * (INVALID_ARGUMENT when none has it). */
int zs_model_kind_count(const zs_model* model);
zs_status zs_model_find_kind(const zs_model* model, const char* name,
                             int* kind);

/* Adds an optimizer parameter group (PyTorch's param_groups): a learning
 * rate and weight decay for the tensors assigned to it. Group 0 exists from
 * the start with the config's lr and weight_decay. *group receives the id.
 * Errors: INVALID_ARGUMENT (negative or non-finite values), INVALID_STATE. */
zs_status zs_model_add_param_group(zs_model* model, double lr,
                                   double weight_decay, int* group);

/* Assigns an owner tensor to a param group (default 0), e.g. biases and
 * norm weights to a group without weight decay. Before finalize only.
 * Errors: INVALID_ARGUMENT (unknown tensor or group, a tied tensor). */
zs_status zs_model_set_tensor_group(zs_model* model, int tensor, int group);

/* Declares how many times a unit's gradients are acquired and released per
 * step (a unit used twice, e.g. shared weights: 2). The reduce-scatter then
 * starts at the uses-th release. Without it the runtime records the count in
 * the first step (reducing that step's gradients in zs_step) and keeps the
 * largest count seen. A step with fewer uses reduces the unit in zs_step; a
 * step with more re-opens the reduced unit (exact, one extra collective) and
 * raises the count. uses: >= 1, or 0 to go back to recording. A tied tensor
 * counts as a use of its owner's unit. Before finalize only (the counts are
 * compared across ranks there). Recording costs memory in the first step
 * (every unit's gradients are held until zs_step), so give the counts when
 * the model is large. Errors: INVALID_ARGUMENT, INVALID_STATE. */
zs_status zs_unit_set_grad_uses(zs_model* model, int unit, int uses);

/* How a unit is sharded (zs_unit_set_strategy). */
typedef enum zs_unit_strategy {
  ZS_UNIT_DEFAULT = 0,   /* as the stage says, unless the model's
                            persistence threshold replicates it */
  ZS_UNIT_SHARDED = 1,   /* as the stage says, whatever its size */
  ZS_UNIT_REPLICATED = 2 /* never sharded (FSDP's NO_SHARD): parameters,
                            gradients and optimizer states whole on every
                            rank, as at stage 0; no all-gather before use */
} zs_unit_strategy;

/* Sets a unit's strategy (default ZS_UNIT_DEFAULT). Before finalize; every
 * rank the same (finalize compares). Errors: INVALID_ARGUMENT, INVALID_STATE;
 * poisons the model on error. */
zs_status zs_unit_set_strategy(zs_model* model, int unit,
                               zs_unit_strategy strategy);

/* Replicates every ZS_UNIT_DEFAULT unit of at most `elements` elements (its
 * tensors' sum) at finalize, as DeepSpeed's
 * stage3_param_persistence_threshold keeps small parameters gathered:
 * gathering a LayerNorm's few hundred elements costs more latency than the
 * memory it saves. Default: zs_config.param_persistence_threshold (0:
 * none). Before finalize; every rank the same. Errors: INVALID_STATE. */
zs_status zs_model_set_persistence_threshold(zs_model* model, size_t elements);

/* 1 when the unit is replicated (after finalize), 0 when sharded, -1 for a
 * NULL model, an unknown unit or before finalize. */
int zs_unit_replicated(const zs_model* model, int unit);

/* Declares that some ranks may skip `unit` in some micro-batches (an expert
 * of a mixture of experts), as DDP's find_unused_parameters; each rank then
 * reaches it, where the order of gathers has it, by zs_unit_gather or by
 * zs_unit_mark_unused (docs/api.md, "Units a rank does not use").
 * - gradients: reduced in zs_step, in unit order; a rank that skipped it
 *   adds zeros (the combined batch's gradient);
 * - stage 3: each gather agrees on the users (an all-reduce of W flags),
 *   then sends them the shards (ZS_COLL_GATHER; an all-gather when all use
 *   it; nothing when none does); a user keeps the parameters from the
 *   forward to its gradient release; never prefetched.
 * Before finalize, all ranks alike. Errors: INVALID_ARGUMENT (no such unit;
 * finalize: tied tensors), INVALID_STATE; UNSUPPORTED (stage 3, > 64 ranks). */
zs_status zs_unit_allow_unused(zs_model* model, int unit);

/* This rank does not use `unit` (zs_unit_allow_unused) in this micro-batch:
 * call it where it would gather the unit, before any use, at most once. The
 * rank neither gathers the parameters nor opens the gradients (gather and
 * grad acquire of it are INVALID_STATE until zs_step); its share of the
 * reduction in zs_step is zeros. Collective at stage 3 (the agreement
 * blocks; the send of this rank's shard completes by zs_step at the
 * latest), bookkeeping at stages 0-2; in eval mode too.
 * Errors: INVALID_ARGUMENT, INVALID_STATE (not declared, marked already,
 * used in this micro-batch), OUT_OF_MEMORY, COMM, IO, REMOTE, TIMEOUT. */
zs_status zs_unit_mark_unused(zs_model* model, int unit);

/* Freezes the layout and allocates storage (parameters zeroed). Collective.
 * Checks that every rank registered the same units, tensors (names, shapes,
 * dtypes, flags, ties, groups) and configuration, with one all-gather of a
 * hash; on a difference every rank returns ZS_ERR_MISMATCH naming the first
 * differing tensor and the rank, before any data collective. A model
 * poisoned by a failed registration call fails on every rank naming that
 * call's error: INVALID_ARGUMENT when the same call failed on every rank
 * (always so with one rank), MISMATCH when only some ranks' failed (their
 * registrations differ). Errors: MISMATCH, INVALID_ARGUMENT (a poisoned
 * model), OUT_OF_MEMORY, COMM, INVALID_STATE (twice). */
zs_status zs_model_finalize(zs_model* model);

/* ==== Model queries (any time after registration) ======================= */

typedef struct zs_tensor_desc {
  const char* name; /* owned by the model */
  int unit;         /* the unit it was registered in */
  int ndim;
  int64_t shape[ZS_MAX_DIMS];
  size_t numel; /* elements */
  zs_dtype dtype;
  unsigned int flags;
  int tied_to; /* owner tensor id, or -1 */
  int group;   /* param group (the owner's for a tied tensor) */
} zs_tensor_desc;

int zs_model_unit_count(const zs_model* model);   /* 0 for NULL */
int zs_model_tensor_count(const zs_model* model); /* 0 for NULL */

/* Describes a tensor. Errors: INVALID_ARGUMENT (unknown id). */
zs_status zs_model_tensor_desc(const zs_model* model, int tensor,
                               zs_tensor_desc* out);

/* Looks a tensor up by name. Errors: INVALID_ARGUMENT (not found). */
zs_status zs_model_find_tensor(const zs_model* model, const char* name,
                               int* tensor);

/* Name of a unit (owned by the model), or NULL for an unknown id. */
const char* zs_model_unit_name(const zs_model* model, int unit);

/* How many times a unit's gradients are acquired and released per step (per
 * micro-batch): the count given by zs_unit_set_grad_uses (or the driver,
 * which declares it from its layers) or, when larger, the count recorded in
 * the steps so far; 0 while neither is known. Not collective; any time.
 * Returns -1 for a NULL model or an unknown unit. The memory estimator's
 * model description takes it as a unit's "grad_uses". */
int zs_unit_grad_uses(const zs_model* model, int unit);

/* Layout of a unit after finalize, in elements: used (tensor data plus
 * alignment gaps), padded (a multiple of world size), shard (padded / world
 * size). Errors: INVALID_ARGUMENT, INVALID_STATE (before finalize). */
zs_status zs_unit_layout(const zs_model* model, int unit, size_t* used,
                         size_t* padded, size_t* shard);

/* ==== Initialization and export (after finalize; collective) ============= */

/* Fills one tensor on rank 0 before it is broadcast. data: the full tensor
 * (numel elements of the tensor's dtype, row-major, zeroed), owned by the
 * runtime, valid during the call. Return ZS_OK, or an error that
 * zs_model_init reports on every rank. */
typedef zs_status (*zs_init_fn)(void* user, int tensor,
                                const zs_tensor_desc* desc, void* data);

/* Initializes every untied tensor: `fn` runs on rank 0 only, for each tensor
 * in registration order, and the result is broadcast unit by unit, so every
 * rank starts identical whatever its random state. Optimizer state is not
 * touched. Collective. Errors: the callback's status (ZS_ERR_REMOTE on the
 * other ranks), COMM, OUT_OF_MEMORY, INVALID_STATE (a unit gathered). */
zs_status zs_model_init(zs_model* model, zs_init_fn fn, void* user);

/* Sets one tensor from a full array on rank 0 (data: numel elements of its
 * dtype; ignored, may be NULL, on other ranks; not retained). Collective.
 * Errors: INVALID_ARGUMENT (NULL data on rank 0: every rank fails), COMM. */
zs_status zs_tensor_set(zs_model* model, int tensor, const void* data);

/* What zs_tensor_get reads. */
typedef enum zs_field {
  ZS_FIELD_PARAM = 0,      /* parameters (the updated values after a step) */
  ZS_FIELD_GRAD = 1,       /* the last reduced gradient (mean over ranks
                              and micro-batches) as reduced: still
                              multiplied by the loss scale, before
                              clipping, and after an overflow skip with
                              its inf/NaN; valid from zs_step until the
                              next step's first gradient acquire */
  ZS_FIELD_EXP_AVG = 2,    /* Adam/AdamW first moment */
  ZS_FIELD_EXP_AVG_SQ = 3, /* Adam/AdamW second moment */
  ZS_FIELD_MOMENTUM = 4,   /* SGD momentum buffer */
  ZS_FIELD_MASTER = 5,     /* fp32 master weights of a 16-bit tensor */
  ZS_FIELD_STATE_0 = 6,    /* optimizer state buffer k = field - 6 of any */
  ZS_FIELD_STATE_1 = 7,    /* optimizer (0..nstates-1): Adam's exp_avg, */
  ZS_FIELD_STATE_2 = 8,    /* exp_avg_sq; SGD's momentum; a callback's */
  ZS_FIELD_STATE_3 = 9     /* buffers (zs_model_set_optimizer) */
} zs_field;

/* The dtype of a field of a tensor: the parameter dtype for PARAM, the
 * gradient dtype (config.reduce_dtype) for GRAD, ZS_FLOAT32 for the
 * optimizer states and MASTER; ZS_DTYPE_COUNT for a bad tensor id or field
 * or before finalize. */
zs_dtype zs_tensor_field_dtype(const zs_model* model, int tensor,
                               zs_field field);

/* Copies the full tensor's field into out (numel elements; every rank
 * receives it). A tied tensor reads its owner. Collective (one all-gather of
 * the owning unit's shards). Errors: INVALID_ARGUMENT (unknown tensor, a
 * field the optimizer does not have, a frozen tensor's optimizer field;
 * on one rank only: ZS_ERR_REMOTE on the others), INVALID_STATE (before
 * finalize), COMM, TIMEOUT. */
zs_status zs_tensor_get(zs_model* model, int tensor, zs_field field,
                        void* out);

/* Sets every slice of a kind from one full array on rank 0, laid out as
 * the kind (prod(shape) elements of its dtype, slice l at its offset), as
 * zs_tensor_set of each slice in layer order: the way to initialize or
 * import a stacked kind. data is ignored (may be NULL) on other ranks; not
 * retained. Collective. Errors: INVALID_ARGUMENT (unknown kind, a layer
 * without a slice, NULL data on rank 0), INVALID_STATE (before finalize),
 * COMM. */
zs_status zs_kind_set(zs_model* model, int kind, const void* data);
/* Copies a field of every slice of a kind into out on every rank, laid out
 * as the kind (prod(shape) elements of zs_tensor_field_dtype(slice,
 * field)): zs_tensor_get
 * of each slice in layer order, so the export of a stacked kind. Collective.
 * Errors: those of zs_tensor_get; INVALID_ARGUMENT (unknown kind, a layer
 * without a slice). */
zs_status zs_kind_get(zs_model* model, int kind, zs_field field, void* out);

/* ==== The per-step API (after finalize) ================================== */

/* Makes the unit's full parameters available (stage 3: all-gather of the
 * shards into a transient buffer, or waiting for the prefetch that already
 * started it; stages 0-2: they are resident). Also gathers the units owning
 * its tied tensors. At stage 3 it follows the order of gathers recorded in
 * the first step and starts the all-gathers of the next units
 * (zs_config.prefetch_depth, max_live_elements); a gather out of that order
 * stops prefetching for the step and the order is recorded again.
 * Collective at stage 3, blocking.
 * Errors: INVALID_STATE if the unit is already gathered by the user (name
 * given), OUT_OF_MEMORY, COMM (both, with more than one rank, make the
 * context unusable and fail the other ranks at once: see the top of this
 * file), REMOTE (another rank failed), TIMEOUT. */
zs_status zs_unit_gather(zs_model* model, int unit);

/* A hint that `unit` will be gathered soon: at stage 3 its all-gather
 * starts now (if it is not gathered and the live-elements limit and
 * prefetch_depth allow: a hint counts against the depth like a prefetch
 * along the recorded order, so depth 0 makes hints no-ops) and
 * the later zs_unit_gather only waits for it; the prefetch is dropped at
 * zs_step if unused. A no-op at stages 0-2. Collective at stage 3 (every
 * rank must give the same hints). Prefetch along the recorded order needs
 * no hints (zs_config.prefetch_depth). Errors: INVALID_ARGUMENT,
 * OUT_OF_MEMORY, COMM (as zs_unit_gather's), REMOTE, TIMEOUT. */
zs_status zs_unit_prefetch(zs_model* model, int unit);

/* Ends the use of a gathered unit: at stage 3 its transient buffer is freed
 * (unless a tie or a prefetch still holds it, or, with
 * reshard_after_forward off, this is its forward: then it stays until its
 * gradients are released); pointers from zs_tensor_data become invalid at
 * every stage. Not collective.
 * Errors: INVALID_STATE if the unit is not gathered. */
zs_status zs_unit_release(zs_model* model, int unit);

/* Pointer to a tensor's full parameters (numel elements of its dtype,
 * row-major), valid from zs_unit_gather of its unit until the matching
 * zs_unit_release. The memory is the runtime's: read it; do not free it.
 * Writing changes the parameters (stages 0-2) or only this gathered copy
 * (stage 3): don't. Errors: INVALID_ARGUMENT, INVALID_STATE (its unit is not
 * gathered). */
zs_status zs_tensor_data(zs_model* model, int tensor, void** data);

/* Opens the unit's gradient buffers for the backward pass. The first
 * acquire of a step returns zeroed buffers; later acquires in the same step
 * return the same buffers to accumulate into. Also acquires the units owning
 * its tied tensors. Not collective. Errors: INVALID_STATE (already acquired
 * and not released), OUT_OF_MEMORY (with more than one rank, the context
 * becomes unusable and the other ranks fail at once: the top of this
 * file). */
zs_status zs_unit_grad_acquire(zs_model* model, int unit);

/* Pointer to a tensor's gradient buffer (numel elements of its dtype),
 * valid while its unit's gradients are acquired. Accumulate into it (+=):
 * a tied tensor's gradient and its owner's are the same memory.
 * Errors: INVALID_ARGUMENT, INVALID_STATE (not acquired). */
zs_status zs_tensor_grad(zs_model* model, int tensor, void** grad);

/* Closes the unit's gradient buffers. When this is the unit's last use in
 * the step (zs_unit_set_grad_uses, or the count recorded in the first
 * step), its reduce-scatter starts now, in buckets of
 * zs_config.bucket_elements, and runs while the caller goes on (completed
 * by later calls, at the latest in zs_step): collective, and every rank
 * must release in the same order. Otherwise not collective.
 * Errors: INVALID_STATE (not acquired), COMM, OUT_OF_MEMORY (both as
 * zs_unit_grad_acquire's), REMOTE, TIMEOUT. */
zs_status zs_unit_grad_release(zs_model* model, int unit);

/* Eval mode (1) for forward-only passes between steps (validation,
 * sampling): gathers and releases work as in training, but they are not
 * part of the step's recorded order (so prefetch keeps its trace for the
 * training steps), nothing is prefetched, reshard_after_forward is ignored
 * (a release frees), and gradient acquire and zs_step are INVALID_STATE.
 * Enter between steps (after zs_step, before the next forward) with no
 * unit held; leaving (0) needs no unit held. Not collective, but every rank
 * must switch at the same point (as with gathers). Errors: INVALID_ARGUMENT,
 * INVALID_STATE naming the unit or the step in progress. */
zs_status zs_model_set_eval(zs_model* model, int eval);

/* Learning rate of a param group for the next steps (ZS_ALL_GROUPS: every
 * group). Errors: INVALID_ARGUMENT (unknown group, negative or non-finite
 * lr). Not collective, but every rank should set the same value. */
#define ZS_ALL_GROUPS (-1)
zs_status zs_model_set_lr(zs_model* model, int group, double lr);

/* A param group's learning rate now (what zs_model_set_lr set, or a loaded
 * checkpoint's), and its optimizer step count: the updates applied to its
 * tensors so far (0 before the first; restored by zs_checkpoint_load, so
 * right after a load it is the saved run's). Not collective; any time after
 * finalize. Return -1 (step count) or a negative lr for a NULL model, an
 * unknown group, or before finalize. */
double zs_model_lr(const zs_model* model, int group);
int64_t zs_model_step_count(const zs_model* model, int group);

/* ==== Your own optimizer ================================================= */

#define ZS_OPTIM_MAX_STATES 4 /* fp32 state buffers per element, at most */

/* One span of the optimizer's work, as zs_optimizer_fn receives it: n
 * consecutive elements of one tensor, inside this rank's optimizer shard
 * (at stage 0 every rank updates whole tensors). All pointers are host memory
 * (the library's), valid during the call only. */
typedef struct zs_optim_span {
  size_t struct_size;   /* sizeof(zs_optim_span) of the library */
  float* param;         /* n fp32 values to update in place: the fp32
                           master weights of a 16-bit tensor (the library
                           rounds them into the parameters after), else
                           the parameters */
  const float* grad;    /* n fp32 gradient values: the mean over ranks and
                           micro-batches, the loss scale divided out,
                           clipped (zs_config.max_grad_norm) */
  float* state[ZS_OPTIM_MAX_STATES]; /* nstates buffers of n fp32 values,
                           zero before the first update; NULL past nstates */
  int nstates;
  size_t n;             /* elements */
  int tensor;           /* the tensor these elements belong to */
  size_t offset;        /* element `offset` of that tensor is param[0] */
  int group;            /* its param group */
  int64_t step;         /* the update being applied to them: 1, 2, ... */
  double lr, weight_decay; /* the group's (zs_model_add_param_group) */
  double beta1, beta2, eps; /* zs_config.optimizer's, for the rule's use */
  char* error;          /* error_cap bytes where a failing callback may
                           write why (NUL-terminated): in the message */
  size_t error_cap;
} zs_optim_span;

/* An elementwise optimizer update. Return ZS_OK, or an error code with a
 * reason in span->error: the library adds the rank, tensor and step.
 * Called for every span of every trainable tensor at each optimizer step,
 * possibly from several threads at once on disjoint spans (CPU offload's
 * workers); it must not call ZeroShard. */
typedef zs_status (*zs_optimizer_fn)(void* user, const zs_optim_span* span);

/* Replaces the built-in optimizer (zs_config.optimizer.kind) with fn.
 *  - name: 1-63 bytes, no quotes, backslashes or newlines, not a
 *    built-in's; saved in checkpoints (another optimizer's: weights-only).
 *  - nstates: 1..ZS_OPTIM_MAX_STATES fp32 buffers per element, accounted,
 *    sharded, offloaded, saved and resharded as Adam's moments are.
 *  - Spans: at most 65536 elements; with NVMe offload within a sub-group.
 *  - Runs on the host: with a CUDA context the optimizer must be offloaded
 *    (zs_config.offload_optimizer), else finalize is UNSUPPORTED.
 *  - Before finalize (again: replaces); not collective. Errors, poisoning
 *    the model: INVALID_ARGUMENT (NULL fn, nstates or name), INVALID_STATE.
 *  - fn failing on one rank fails zs_step on every rank naming it; steps
 *    are then refused until a full zs_checkpoint_load (not weights-only). */
zs_status zs_model_set_optimizer(zs_model* model, const char* name,
                                 int nstates, zs_optimizer_fn fn, void* user);

typedef struct zs_step_info {
  size_t struct_size;
  int applied;        /* 1 if the optimizer ran, 0 if not (a micro-batch
                         before the K-th, an overflow, zs_step_discard) */
  int64_t step;       /* optimizer steps applied so far */
  double grad_norm;   /* the global L2 norm of the averaged (unscaled)
                         gradient before clipping, when clipping or loss
                         scaling is on and the step reached the optimizer
                         boundary (inf/NaN on overflow); -1 otherwise */
  double loss_scale;  /* the scale for the next micro-batch (1 without
                         loss scaling) */
  int overflow;       /* 1: inf/NaN in the gradients; the step was skipped */
  int micro_batch;    /* micro-batches accumulated toward the next optimizer
                         step (0 after the K-th) */
} zs_step_info;

/* Ends the micro-batch: reduces what is left and, at the K-th of
 * config.grad_accum_steps, runs the optimizer on this rank's part (ZeRO,
 * arXiv:1910.02054, sec. 5); stages 1-2 then all-gather the parameters.
 *  - Collective, blocking. info: NULL, or left as is if refused at entry.
 *  - First checks on every rank: nothing still held, the same step,
 *    collectives, use counts and learning rates (docs/api.md, "A training
 *    step"). Misuse: INVALID_STATE here, REMOTE elsewhere, nothing changed.
 *    A difference: MISMATCH, then zs_step_discard on every rank.
 *  - A unit not used this step contributes zero gradients.
 * @return ZS_OK; INVALID_STATE, MISMATCH, REMOTE, COMM, TIMEOUT, DIVERGED
 *         (inf/NaN without a scaler, docs/precision.md), OUT_OF_MEMORY,
 *         DEVICE, IO (NVMe: docs/offload.md). */
zs_status zs_step(zs_model* model, zs_step_info* info);

/* Drops the micro-batch on every rank, whatever each rank did in it
 * (docs/api.md, "Dropping a micro-batch").
 *  - Collective: a rank whose pass failed calls it at once; a rank waiting
 *    in a collective it never issued gets REMOTE naming it, then calls it.
 *  - Collectives some rank issued and others did not get empty partners.
 *  - Restores parameters, optimizer and scaler state, step counts, use
 *    counts and the prefetch trace; lets go of held gathers and acquires.
 *  - Every model of the context whose collectives were so completed must
 *    be discarded too (its calls say so).
 * @return ZS_OK; TIMEOUT, REMOTE; MISMATCH when the collectives cannot be
 *         lined up (the context cannot go on then). */
zs_status zs_step_discard(zs_model* model, zs_step_info* info);

/* The scale the caller multiplies its loss (or loss gradient) by before
 * backward: the loss scaler's current value, 1 without loss scaling. Not
 * collective; the same on every rank. Returns 0 for a NULL model. */
double zs_model_loss_scale(const zs_model* model);

/* ==== Checkpoints (docs/checkpoint.md) ================================== */
/* Sharded, crash-safe checkpoints that load at any world size and stage.
 * A checkpoint ROOT holds checkpoint directories and a file `latest` naming
 * the newest complete one. A checkpoint directory holds meta.json (the
 * format, world size, stage, optimizer, step counts, loss scaler, units and
 * tensors: names, shapes, dtypes, offsets, padding, ties), its xxHash64 in
 * meta.json.xxh64, one rank-RRRRR.bin per saving rank (its shard of every
 * unit: fp32 master weights, or the parameters when a unit has none, then
 * the optimizer states) and extras.bin (the caller's blob). Every file's
 * size and xxHash64 are in the metadata and checked before a load changes
 * anything. The layout follows DeepSpeed's ZeRO checkpoints (one file per
 * rank's partition plus a model description) and PyTorch DCP's
 * resharding by element ranges. All sizes in bytes. */

/* Saves the model under root/name, crash-safe (docs/checkpoint.md).
 *  - name NULL: "step-%08lld" of the optimizer steps so far; no '/',
 *    no leading '.', not `latest`, at most 200 bytes.
 *  - extras (extras_bytes, rank 0's; may be NULL with 0): saved alongside.
 *  - Between optimizer steps, nothing held. Collective, blocking.
 *  - A crash at any point leaves the previous checkpoint and `latest`.
 *  - root: created if missing, checked as zs_checkpoint_check_root does,
 *    visible to every rank; one save at a time per root (flock).
 * @return ZS_OK; INVALID_ARGUMENT, INVALID_STATE, IO naming the file and
 *         offset, REMOTE, OUT_OF_MEMORY, COMM. */
zs_status zs_checkpoint_save(zs_model* model, const char* root,
                             const char* name, const void* extras,
                             size_t extras_bytes);

/* Checks what zs_checkpoint_save needs of a root, creating nothing (e.g.
 * a trainer's --save checked before it trains).
 *  - root: need not exist; its nearest existing ancestor must be a
 *    writable directory, not inside a checkpoint, and every path a save
 *    writes below it must fit the 4096-byte limit (root <= 3840 bytes).
 *  - Not collective; no MPI, context or model; synchronous.
 * @return ZS_OK; INVALID_ARGUMENT (NULL, empty, too long), IO naming the
 *         directory. */
zs_status zs_checkpoint_check_root(const char* root);

/* zs_checkpoint_load flags. */
#define ZS_LOAD_WEIGHTS_ONLY 1u /* parameters (and master weights) only:
                                   optimizer states, step counts and the
                                   loss scaler keep their current values */

/* Loads a checkpoint into a finalized model of the same tensors, at any
 * world size and stage (docs/checkpoint.md, "Loading").
 *  - path: a checkpoint, or a root (its `latest`). flags: 0 or
 *    ZS_LOAD_WEIGHTS_ONLY. extras (extras_cap bytes, may be NULL) gets the
 *    saved extras; *extras_bytes (may be NULL) their size.
 *  - Every file is verified on some rank before any rank changes a byte;
 *    optimizer states, step counts and the scaler come back too.
 *  - Between steps, nothing held. Collective, blocking.
 * @return ZS_OK; INVALID_ARGUMENT, IO, CORRUPT (naming the file),
 *         MISMATCH (naming the tensor), UNSUPPORTED (newer format),
 *         REMOTE; nothing loaded on any of those. */
zs_status zs_checkpoint_load(zs_model* model, const char* path, unsigned flags,
                             void* extras, size_t extras_cap,
                             size_t* extras_bytes);

/* Reads a checkpoint's extras (the blob zs_checkpoint_save took from rank
 * 0) without a model, a context or MPI: e.g. a trainer's own state (data
 * position, settings) checked before it starts its ranks, like DeepSpeed's
 * client_state. path: a checkpoint directory, or a root (its `latest` is
 * followed). The metadata and extras.bin are verified (size and xxHash64)
 * first. extras (extras_cap bytes; may be NULL: verify only) receives
 * them; *extras_bytes (may be NULL) their size in bytes, set also when
 * they do not fit (then INVALID_ARGUMENT, nothing copied). Only reads;
 * synchronous; any thread. Errors: INVALID_ARGUMENT (NULL path, extras
 * larger than extras_cap), IO (no checkpoint there, a missing file: naming
 * it), CORRUPT (a checksum or size mismatch, bad metadata: naming the
 * file), UNSUPPORTED (a newer format). */
zs_status zs_checkpoint_read_extras(const char* path, void* extras,
                                    size_t extras_cap, size_t* extras_bytes);

/* Sets this rank's own blob for the next saves (e.g. its data loader's
 * position or RNG state): copied (bytes, up to 1 TiB; NULL with 0 clears
 * it), written by every later zs_checkpoint_save as rank-RRRRR.blob with
 * its size and xxHash64 in the metadata. Not collective: each rank sets
 * its own. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
zs_status zs_checkpoint_set_rank_blob(zs_model* model, const void* data,
                                      size_t bytes);

/* Reads the blob saving rank `rank` set, from any process (no model,
 * context or MPI), verified first (size and xxHash64). Loading at another
 * world size maps nothing: every new rank may read any old rank's blob
 * (*saved_ranks, may be NULL: how many ranks saved; e.g. new rank r of W'
 * continues old ranks r*W/W' .. ). out (cap bytes; may be NULL: size only)
 * receives it, *bytes (may be NULL) its size, also when it does not fit
 * (then INVALID_ARGUMENT). A version 1 checkpoint's blobs are empty.
 * Synchronous; any thread. Errors: INVALID_ARGUMENT (no such rank, too
 * small), IO, CORRUPT (naming the file), UNSUPPORTED (a newer format). */
zs_status zs_checkpoint_read_rank_blob(const char* path, int rank, void* out,
                                       size_t cap, size_t* bytes,
                                       int* saved_ranks);

/* One tensor of a checkpoint, as zs_checkpoint_read_tensors gives it. */
typedef struct zs_checkpoint_tensor {
  char name[ZS_NAME_MAX];
  int ndim;
  int64_t shape[ZS_MAX_DIMS]; /* ndim extents */
  size_t numel;               /* elements */
  zs_dtype dtype;             /* the parameters' dtype when saved */
  int tied_to;                /* index of its owner in this list, or -1 */
  int frozen;                 /* 1: ZS_TENSOR_FROZEN */
} zs_checkpoint_tensor;

/* Lists a checkpoint's tensors (names, shapes, dtypes, ties, in order)
 * without a model, context or MPI, e.g. to check a resume's model first.
 *  - path: a checkpoint, or a root (its `latest`); metadata verified.
 *  - out: cap entries (may be NULL with cap 0); *count: how many there
 *    are, also when they do not fit (then INVALID_ARGUMENT).
 *  - Only reads; synchronous; any thread.
 * @return ZS_OK; INVALID_ARGUMENT, IO, CORRUPT, UNSUPPORTED. */
zs_status zs_checkpoint_read_tensors(const char* path,
                                     zs_checkpoint_tensor* out, int cap,
                                     int* count);

/* Writes a checkpoint's full weights to a safetensors file (the format:
 * huggingface/safetensors' README; docs/checkpoint.md).
 *  - dtype: ZS_FLOAT32 (the master weights, bitwise) or ZS_BFLOAT16.
 *  - duplicate_tied 0: a tied tensor once, under its owner's name (its
 *    alias in __metadata__); 1: a copy under each name.
 *  - Replaces out_file whole or not at all; no MPI or model; synchronous.
 * @return ZS_OK; INVALID_ARGUMENT (a dtype, or an output inside the
 *         checkpoint), IO, CORRUPT (files verified first), OUT_OF_MEMORY. */
zs_status zs_checkpoint_consolidate(const char* path, const char* out_file,
                                    zs_dtype dtype, int duplicate_tied);

/* ==== Sequential driver (docs/overlap.md) =============================== */
/* A higher-level API for models that are a sequence of layers: the driver
 * runs forward and backward across them, gathering, prefetching and
 * releasing each layer's unit, acquiring and releasing its gradients (the
 * reduce-scatter overlaps the backward of the layers before it), and owning
 * the activation buffers (counted as `activations`). A unit may back several
 * layers (shared weights, e.g. an embedding used at the start and as the
 * tied output projection at the end).
 *
 * With activation checkpointing (Chen et al., "Training Deep Nets with
 * Sublinear Memory Cost", arXiv:1604.06174) each layer keeps only its output
 * (the next layer's input) and all layers share one scratch buffer for
 * their internal activations: before a layer's backward the driver runs its
 * forward again to refill the scratch. The last layer's scratch is still
 * valid when its backward starts, so it is not recomputed. Forward must be
 * deterministic (it is then bitwise identical to the first run). */

typedef struct zs_driver zs_driver;

/* What a layer callback receives. Sizes are the layer's declared bytes. */
typedef struct zs_layer_io {
  int layer;           /* index in the order layers were added */
  int unit;            /* the unit whose parameters it uses (gathered) */
  const void* input;   /* the previous layer's output, or the driver's
                          input buffer for layer 0 */
  void* output;        /* this layer's output (kept until its backward) */
  void* scratch;       /* its internal activations: its own buffer, or the
                          shared scratch when checkpointing */
  const void* grad_output; /* backward: d loss / d output (the last
                          layer's is zeros: it computes its own) */
  void* grad_input;    /* backward: d loss / d input, zeroed by the driver,
                          to be accumulated (+=) by the layer */
  int recompute;       /* forward: 1 when re-run before its backward */
} zs_layer_io;

/* A layer callback. Parameters and gradients come from zs_tensor_data /
 * zs_tensor_grad of the layer's unit's tensors (gathered and acquired by the
 * driver). Return ZS_OK or an error, which the driver returns after
 * releasing what it holds, prefixed with the layer and unit: with the
 * message of a ZeroShard call that failed inside the callback, else "layer
 * L (unit 'U') forward returned <status>". */
typedef zs_status (*zs_layer_fn)(void* user, zs_model* model,
                                 const zs_layer_io* io);

/* zs_layer_desc.flags: the layer's backward reads no parameters (e.g. an
 * embedding lookup), so the driver does not gather its unit for it (one
 * all-gather less per step at stage 3). */
#define ZS_LAYER_BACKWARD_NO_PARAMS 1u

typedef struct zs_layer_desc {
  int unit;              /* the unit the layer uses */
  zs_layer_fn forward;   /* writes output and scratch from input */
  zs_layer_fn backward;  /* accumulates parameter gradients, writes
                            grad_input from grad_output, input, scratch */
  void* user;            /* passed to both callbacks */
  size_t output_bytes;   /* bytes of its output (0 allowed) */
  size_t scratch_bytes;  /* bytes of its internal activations */
  unsigned int flags;    /* 0 or ZS_LAYER_BACKWARD_NO_PARAMS */
} zs_layer_desc;

/* zs_driver_create's checkpoint_activations: checkpointing that also checks
 * each recomputed layer output against the first run's, bitwise, and fails
 * the backward (MISMATCH naming the layer and the first differing byte;
 * REMOTE on the other ranks) when they differ: the forward was not
 * deterministic (torch.utils.checkpoint's determinism_check plays this
 * role, comparing shapes). Costs two host buffers of the largest layer
 * output (accounted as "other") and two copies per recomputed layer: a
 * debugging aid. */
#define ZS_CHECKPOINT_VERIFY 2

/* Creates a driver over `model`. input_bytes: the size of the buffer layer
 * 0 reads (zs_driver_input). checkpoint_activations: 0 (keep every layer's
 * activations), 1 (keep each layer's output, recompute the rest before its
 * backward) or ZS_CHECKPOINT_VERIFY (1, checking the recomputes). Layers added
 * before zs_model_finalize also declare their units' gradient use counts
 * (a unit backing k layers is used k times per step); added after, the
 * counts are recorded in the first step. Not collective. *out: owned by the
 * caller (zs_driver_destroy, before the model). Errors: INVALID_ARGUMENT. */
zs_status zs_driver_create(zs_model* model, size_t input_bytes,
                           int checkpoint_activations, zs_driver** out);
/* Frees the driver, its layer table and its activation buffers (NULL
 * accepted). Not collective, no communication, never fails; the model and
 * its units are untouched. Destroy the driver before the model (the
 * buffers are accounted on the model's context); a model destroyed first
 * frees its drivers' buffers and leaves them detached: their calls that
 * need the model (add_layer, input, output, forward, backward) then return
 * INVALID_STATE, and this still frees the rest. */
void zs_driver_destroy(zs_driver* driver);

/* Appends a layer; *layer receives its index (may be NULL). Before the
 * first zs_driver_forward only. Errors: INVALID_ARGUMENT (unknown unit, NULL
 * callbacks), INVALID_STATE. */
zs_status zs_driver_add_layer(zs_driver* driver, const zs_layer_desc* desc,
                              int* layer);

/* The buffer layer 0 reads (input_bytes), valid until the driver is
 * destroyed; fill it before zs_driver_forward. Allocates the activation
 * buffers on first use. Errors: OUT_OF_MEMORY, INVALID_ARGUMENT. */
zs_status zs_driver_input(zs_driver* driver, void** input);
/* The output buffer of a layer (e.g. to read the loss the last layer
 * wrote). Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
zs_status zs_driver_output(zs_driver* driver, int layer, void** output);

/* Bytes of activation buffers the driver allocates (input, layer outputs,
 * scratch, gradient ping-pong) with checkpointing on (1) or off (0), for
 * its layers as added so far: e.g. to report what checkpointing saves.
 * Errors: INVALID_ARGUMENT. */
zs_status zs_driver_activation_bytes(const zs_driver* driver, int checkpoint,
                                     size_t* bytes);

/* Runs every layer's forward in order: gather (at stage 3 an all-gather,
 * with the next units prefetched), forward, release. Collective. In
 * training mode its backward follows (a second forward first replaces it).
 * Errors: the callback's, prefixed with the layer and unit (REMOTE on the
 * other ranks); those of the gathers; INVALID_STATE (before
 * zs_model_finalize, or the model was destroyed). */
zs_status zs_driver_forward(zs_driver* driver);
/* Runs the backward in reverse order: gather, acquire gradients, recompute
 * the forward (checkpointing), backward, release gradients (starting the
 * unit's reduce-scatter after its last use), release. Collective. Once per
 * training-mode zs_driver_forward that succeeded: without one since the
 * last backward (none yet, a second backward, an eval-mode or failed
 * forward) it returns INVALID_STATE at once, running nothing (checked on
 * each rank: every rank running the same control flow gets it alike).
 * Call zs_step afterwards. After a failed training-mode forward or
 * backward, zs_step refuses (INVALID_STATE) until zs_step_discard drops the
 * micro-batch's partial gradients. Errors: as zs_driver_forward,
 * INVALID_STATE. */
zs_status zs_driver_backward(zs_driver* driver);

/* ==== Memory estimator (docs/profiling.md) =============================== */
/* Per-rank memory before running anything, from a zs_config and what it
 * cannot hold. Model states are exact (the engine's own layout); the
 * working set, reduction buffers, staging and activations are estimates
 * of the peak (docs/profiling.md, "The estimator"). */

/* What an estimate needs besides the config (versioned like zs_config). */
typedef struct zs_estimate_input {
  size_t struct_size;   /* sizeof(zs_estimate_input) of the caller's header */
  unsigned int version; /* ZS_VERSION_CODE of the caller's header */
  int ranks;            /* data-parallel world size, >= 1; default 1 */
  int nodes;            /* >= 1, divides ranks; default 1 */
  zs_dtype param_dtype; /* fp32/bf16/fp16; ZS_DTYPE_AUTO (default): a
                           description's own (fp32 for a count) */
  int global_batch;     /* sequences per optimizer step, divisible by ranks
                           x grad_accum_steps, to scale a description's
                           activations to; 0 (default): its own */
  size_t largest_unit_elements; /* with a count: the largest unit's
                           elements (working set, reduction buffers, NVMe
                           and CUDA staging); 0 (default): one unit */
} zs_estimate_input;

#define ZS_ESTIMATE_INPUT_INIT                                        \
  {                                                                   \
    sizeof(zs_estimate_input), ZS_VERSION_CODE, ZS_UNSET_INT,          \
        ZS_UNSET_INT, ZS_DTYPE_AUTO, ZS_UNSET_INT, ZS_UNSET_SIZE      \
  }

typedef struct zs_memory_estimate {
  size_t struct_size;
  size_t bytes[ZS_MEM_CATEGORY_CAP]; /* per rank, the peak per category
                                        (offload_host: host memory) */
  size_t model_state_bytes; /* params + grads + master + optimizer states */
  size_t total;             /* sum over the categories */
  size_t largest_unit_elements; /* a description's largest unit (padded) */
  size_t nvme_bytes;        /* on disk per rank with NVMe offload */
} zs_memory_estimate;

/* Estimates a model of `params` elements (the ZeRO paper's formula,
 * arXiv:1910.02054 sec. 3: no alignment, the shard rounded up).
 *  - config: its stage, device, optimizer, dtypes, accumulation, prefetch
 *    and offload fields count; the rest are ignored.
 * @return ZS_OK, or INVALID_ARGUMENT naming the field. Pure. */
zs_status zs_estimate_from_params(double params, const zs_config* config,
                                  const zs_estimate_input* input,
                                  zs_memory_estimate* out);

/* Estimates a described model (JSON, docs/profiling.md; what
 * train_sharded --describe writes), model states byte for byte as
 * zs_memory_stats reports them after finalize.
 *  - description: not retained; read strictly (unknown keys are errors).
 * @return ZS_OK, INVALID_ARGUMENT naming what is malformed and where,
 *         OUT_OF_MEMORY. Pure. */
zs_status zs_estimate_from_model(const char* description,
                                 const zs_config* config,
                                 const zs_estimate_input* input,
                                 zs_memory_estimate* out);

/* One optimizer step's communication per rank (0.4; docs/scaling.md): the
 * collectives over the units as the communication log counts them
 * (zs_comm_record.bytes: nccl-tests' size, the full buffer of an
 * all-gather or reduce-scatter), by purpose, and what they send on the
 * wire. Assumes each unit is used once per micro-batch's forward and once
 * in its backward (a unit with tensors tied to another unit gathers that
 * owner with it), reshard_after_forward, and K micro-batches per step.
 * Leaves out the control collectives (checks, agreements, the gradient
 * norm: tens of bytes). */
typedef struct zs_comm_estimate {
  size_t struct_size;
  int shard_ranks;    /* G: ranks a unit's shards are spread over */
  int replicas;       /* W / G */
  /* the log's bytes per rank and step ("param gather", "grad reduce",
   * "grad gather (stage 0)", "param update gather", "replica reduce") */
  uint64_t param_gather_bytes;  /* stage 3: forward and backward all-gathers */
  uint64_t grad_reduce_bytes;   /* the gradients' reduce-scatters */
  uint64_t grad_gather_bytes;   /* stage 0: the reduced gradients gathered */
  uint64_t param_update_gather_bytes; /* stages 1-2: updated parameters */
  uint64_t replica_reduce_bytes; /* hybrid sharding: each gradient shard's
                                    reduce-scatter and all-gather across
                                    the replicas */
  /* bytes this rank sends per step: (n - 1) / n of a collective among n
   * ranks, spread evenly over them; a peer on another node (ranks placed
   * by node: input.nodes, consecutive) is inter-node */
  double intra_node_sent_bytes;
  double inter_node_sent_bytes;
} zs_comm_estimate;

/* The communication of a model of `params` elements (one unit, no
 * alignment, as zs_estimate_from_params) or a described one (as
 * zs_estimate_from_model), per rank and optimizer step.
 *  - config: its stage, shard_group_size, dtypes, grad_accum_steps and
 *    grad_accum_local count; input: ranks and nodes.
 *  - out: struct_size sizeof(zs_comm_estimate) or 0.
 * @return ZS_OK, or INVALID_ARGUMENT naming the field (or what is wrong
 *         in the description), OUT_OF_MEMORY. Pure. */
zs_status zs_estimate_comm_from_params(double params, const zs_config* config,
                                       const zs_estimate_input* input,
                                       zs_comm_estimate* out);
zs_status zs_estimate_comm_from_model(const char* description,
                                      const zs_config* config,
                                      const zs_estimate_input* input,
                                      zs_comm_estimate* out);

/* ==== Element conversions (optim/) ======================================= */

/* Converts n elements between fp32, bf16 and fp16 (dst and src may be the
 * same type; then a copy). Rounding to nearest, ties to even, as hardware
 * conversions and torch's .to(): infinities and NaN are kept, fp16
 * overflows to infinity and underflows through its subnormals. Host memory,
 * synchronous. Errors: INVALID_ARGUMENT (another dtype, NULL with n > 0). */
zs_status zs_convert(void* dst, zs_dtype dst_dtype, const void* src,
                     zs_dtype src_dtype, size_t n);

/* ==== Optimizer kernels (optim/) ========================================= */
/* The element-wise updates the runtime runs on a shard, exposed so that a
 * plain (unsharded) trainer can use exactly the same math. Each works on n
 * contiguous fp32 elements in host memory, in place, synchronously on the
 * calling thread. Operation order follows PyTorch 1.13's single-tensor
 * (for-loop) implementations (torch/optim/{adamw,adam,sgd}.py), bias
 * correction included. */

typedef struct zs_adam_hparams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
} zs_adam_hparams;

typedef struct zs_sgd_hparams {
  double lr;
  double momentum;
  double dampening;
  double weight_decay;
  int nesterov;
} zs_sgd_hparams;

/* AdamW (arXiv:1711.05101): param *= 1 - lr*wd; exp_avg, exp_avg_sq updated
 * from grad; param -= lr/bc1 * exp_avg / (sqrt(exp_avg_sq)/sqrt(bc2) + eps).
 * param, exp_avg, exp_avg_sq: n elements, read and written; grad: n
 * elements, read. step: the step number of this update, >= 1 (1 on the
 * first update; the caller increments it). The arrays must not overlap.
 * Errors: INVALID_ARGUMENT (NULL hp, NULL array with n > 0, step < 1, and
 * the ranges torch.optim's constructors enforce: lr, eps, weight_decay >= 0,
 * betas in [0, 1), no NaN); the arrays are unchanged on error. */
zs_status zs_optim_adamw(float* param, const float* grad, float* exp_avg,
                         float* exp_avg_sq, size_t n,
                         const zs_adam_hparams* hp, int64_t step);

/* Adam (arXiv:1412.6980) with L2 weight decay added to the gradient
 * (grad + wd*param), as torch.optim.Adam. Arguments as zs_optim_adamw. */
zs_status zs_optim_adam(float* param, const float* grad, float* exp_avg,
                        float* exp_avg_sq, size_t n, const zs_adam_hparams* hp,
                        int64_t step);

/* SGD with momentum, dampening, nesterov and weight decay, as torch.optim.SGD
 * (Sutskever et al. 2013 for the momentum form). momentum_buffer: n
 * elements, read and written; may be NULL only when hp->momentum == 0. On
 * step 1 the buffer is set to the gradient (no dampening), as PyTorch does.
 * Errors: INVALID_ARGUMENT (NULL hp or arrays, step < 1, lr, momentum or
 * weight_decay < 0 or NaN, nesterov with momentum <= 0 or dampening != 0);
 * the arrays are unchanged on error. */
zs_status zs_optim_sgd(float* param, const float* grad, float* momentum_buffer,
                       size_t n, const zs_sgd_hparams* hp, int64_t step);

/* The fast kernels: the same arguments, checks and bitwise results as
 * zs_optim_adamw / zs_optim_adam / zs_optim_sgd (the same float32
 * operations in the same order, no FMA), vectorized for AVX-512, AVX2 or
 * the baseline (chosen at run time) and split over `threads` OpenMP
 * threads in contiguous blocks of 65536 elements (0: OpenMP's default
 * count; the count never changes a bit). Synchronous. Errors: those of the
 * reference, and INVALID_ARGUMENT for threads < 0. Measured by tools/zs
 * bench optimizer against the memory-bandwidth limit. */
zs_status zs_optim_adamw_fast(float* param, const float* grad, float* exp_avg,
                              float* exp_avg_sq, size_t n,
                              const zs_adam_hparams* hp, int64_t step,
                              int threads);
zs_status zs_optim_adam_fast(float* param, const float* grad, float* exp_avg,
                             float* exp_avg_sq, size_t n,
                             const zs_adam_hparams* hp, int64_t step,
                             int threads);
zs_status zs_optim_sgd_fast(float* param, const float* grad,
                            float* momentum_buffer, size_t n,
                            const zs_sgd_hparams* hp, int64_t step,
                            int threads);

/* ==== Experimental: not yet promised ===================================== */
/* What has not run where it targets may change or go away in a minor
 * release. Declarations of that kind go below, seen only with
 * ZS_EXPERIMENTAL defined before the include (zstd's
 * ZSTD_STATIC_LINKING_ONLY); none now. Values of stable types that are
 * experimental are marked [experimental] where they are declared:
 * `tools/check_header.py --list-experimental` lists them. */
#if defined(ZS_EXPERIMENTAL)
#endif

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZEROSHARD_H_ */
