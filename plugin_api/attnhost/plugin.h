/*
 * attnhost plugin ABI.
 *
 * The only thing a plugin and the attnhost host share. C only, no includes beyond
 * <stdint.h> and <stddef.h>, so that a plugin can be written in any language that can
 * export a C function.
 *
 * Rules (each one is load-bearing for binary compatibility; see docs/PLUGINS.md for a walk-through):
 *  1. A plugin exports one symbol, ATTNHOST_PLUGIN_ENTRY_NAME, of type attnhost_plugin_entry_fn.
 *     It returns a static table of function pointers (attnhost_plugin_api).
 *  2. Versions: the host passes its ABI version to the entry point; the plugin returns its table
 *     (which carries the plugin's own ABI version) or NULL to refuse. The host rejects a table whose
 *     major version differs from its own. Within one major, minor versions only append.
 *  3. Every struct that crosses starts with `uint32_t struct_size`. Fields are only ever appended.
 *     A reader accepts a struct larger than it knows and reads only the fields it knows; a field
 *     that lies beyond a smaller struct_size is treated as absent (zero / NULL). Three cases:
 *     a. A struct embedded by value in another cannot grow without moving its host's later fields,
 *        so these are frozen at ABI 1.0: attnhost_capabilities (in attnhost_plugin_info) and
 *        attnhost_tensor (in attnhost_forward_args and attnhost_backward_args). A new field goes at
 *        the end of the struct that embeds them.
 *     b. An array of structs (attnhost_param_spec in the plugin info, attnhost_param_value in the
 *        problem) is walked with the stride of its elements' struct_size, which all elements of
 *        one array share: ATTNHOST_ELEMENT(type, array, i). A writer built against a later minor
 *        may have larger elements.
 *     c. Elements without struct_size are frozen at ABI 1.0: attnhost_token_range, attnhost_span.
 *  4. Only C types cross. Enumerations are stored as int32_t. No C++ exception crosses: every entry
 *     returns NULL on success or an attnhost_error* created by the plugin, which the host reads with
 *     error_message/error_code and frees with error_destroy.
 *  5. Tensors are described by attnhost_tensor (DLPack-like). The host owns every tensor it passes;
 *     a plugin's workspace comes from attnhost_host_api.alloc so the host can account for it.
 *  6. Pointers returned by a plugin (describe, layout, enumerate_*) are owned by the plugin and stay
 *     valid as stated at each function.
 *  7. Threads. The entry point, describe and validate may be called from any thread, also at once
 *     from several, and while instances run. One instance's calls (layout, forward, backward,
 *     count_pairs, enumerate_*, destroy) come one at a time from one thread; the instances of one
 *     problem's ranks run at the same time, on threads of one process or in separate processes.
 *     A plugin calls its attnhost_host_api only from inside a call on that instance, on the thread
 *     that made it. error_message, error_code and error_destroy may be called from any thread.
 */
#ifndef ATTNHOST_PLUGIN_H
#define ATTNHOST_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */
#define ATTNHOST_ABI_MAJOR 1
#define ATTNHOST_ABI_MINOR 8

/* Size of a struct up to and including its last known field (PJRT's STRUCT_SIZE). Use it to fill
 * struct_size so that a struct compiled against an older header reports its older, smaller size. */
#define ATTNHOST_STRUCT_SIZE(type, last_field) \
  ((uint32_t)(offsetof(type, last_field) + sizeof(((type*)0)->last_field)))

/* True when a struct of (reported) size `size` contains `field`. */
#define ATTNHOST_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= ATTNHOST_STRUCT_SIZE(type, field))

/* Element i of an array of structs, at the stride of the elements' struct_size (rule 3b). */
#define ATTNHOST_ELEMENT(type, array, i) \
  ((const type*)((const char*)(array) + (size_t)(i) * (array)[0].struct_size))

#define ATTNHOST_PLUGIN_ENTRY_NAME "attnhost_plugin_entry"

/* ---------------------------------------------------------------------------------------------
 * Enumerations (stored as int32_t wherever they cross)
 * ------------------------------------------------------------------------------------------- */
typedef enum attnhost_dtype {
  ATTNHOST_DTYPE_INVALID = 0,
  ATTNHOST_DTYPE_BF16 = 1,
  ATTNHOST_DTYPE_FP16 = 2,
  ATTNHOST_DTYPE_FP32 = 3,
  ATTNHOST_DTYPE_FP64 = 4,
  ATTNHOST_DTYPE_INT32 = 5,
  ATTNHOST_DTYPE_INT64 = 6,
  ATTNHOST_DTYPE_UINT8 = 7,
  /* ABI 1.4: 8-bit floats (OCP FP8). e4m3: 4 exponent bits, 3 mantissa bits, largest 448, no
   * infinity (S.1111.111 is NaN); e5m2: 5 and 2, largest 57344, IEEE-like infinities and NaNs. A
   * problem of an FP8 dtype has its Q, K, V and dO in it, scaled per tensor (attnhost_fp8_scaling),
   * and its outputs in bf16. */
  ATTNHOST_DTYPE_FP8_E4M3 = 8,
  ATTNHOST_DTYPE_FP8_E5M2 = 9
} attnhost_dtype;

typedef enum attnhost_device_type {
  ATTNHOST_DEVICE_CPU = 1,
  ATTNHOST_DEVICE_CUDA = 2
} attnhost_device_type;

/* Error codes carried by attnhost_error. */
typedef enum attnhost_status {
  ATTNHOST_OK = 0,
  ATTNHOST_ERR_INVALID_ARGUMENT = 1, /* the problem or a parameter is malformed */
  ATTNHOST_ERR_UNSUPPORTED = 2,      /* well-formed, but this plugin does not do it */
  ATTNHOST_ERR_OUT_OF_MEMORY = 3,    /* an allocation failed (host allocator or device) */
  ATTNHOST_ERR_COMMUNICATION = 4,    /* a collective or point-to-point operation failed */
  ATTNHOST_ERR_DEVICE = 5,           /* a CUDA (or other device) call failed */
  ATTNHOST_ERR_INTERNAL = 6          /* anything else, including a caught exception */
} attnhost_status;

/* Bits of attnhost_capabilities.devices */
#define ATTNHOST_CAP_DEVICE_CPU (1u << 0)
#define ATTNHOST_CAP_DEVICE_CUDA (1u << 1)

/* Bits of attnhost_capabilities.dtypes: bit (1 << attnhost_dtype) */
#define ATTNHOST_CAP_DTYPE(d) (1u << (d))

/* Bits of attnhost_capabilities.features */
#define ATTNHOST_FEATURE_CAUSAL (1u << 0)      /* causal masking by global position */
#define ATTNHOST_FEATURE_NONCAUSAL (1u << 1)   /* full (unmasked) attention */
#define ATTNHOST_FEATURE_WINDOW (1u << 2)      /* sliding window (left, right) */
#define ATTNHOST_FEATURE_GQA (1u << 3)         /* heads_kv < heads_q */
#define ATTNHOST_FEATURE_VARLEN (1u << 4)      /* packed [T, H, D] with sequence lengths */
#define ATTNHOST_FEATURE_BACKWARD (1u << 5)    /* backward() is implemented */
#define ATTNHOST_FEATURE_DETERMINISTIC (1u << 6) /* bitwise reproducible gradients available */
#define ATTNHOST_FEATURE_CROSS (1u << 7)       /* seqlen_q != seqlen_kv */
/* ABI 1.6: dO in fp8_e5m2 beside fp8_e4m3 Q, K and V (attnhost_problem.grad_dtype) */
#define ATTNHOST_FEATURE_FP8_HYBRID (1u << 8)

/* Plugin parameter types */
typedef enum attnhost_param_type {
  ATTNHOST_PARAM_INT = 1,
  ATTNHOST_PARAM_FLOAT = 2,
  ATTNHOST_PARAM_BOOL = 3,
  ATTNHOST_PARAM_STRING = 4,
  ATTNHOST_PARAM_INT_LIST = 5,
  /* Appended in ABI 1.2. A string that names a file. The host passes it absolute: a relative value
   * is taken from the folder of the file that wrote it (a suite, presets.toml), or from the working
   * directory when it came from the command line. A 1.1 host does not know this type: a plugin
   * that must run there declares STRING when the entry point is given a minor version below 2. */
  ATTNHOST_PARAM_PATH = 6
} attnhost_param_type;

/* Which tensors a layout describes */
typedef enum attnhost_layout_kind {
  ATTNHOST_LAYOUT_Q = 1, /* Q, O, dO, dQ, LSE */
  ATTNHOST_LAYOUT_KV = 2 /* K, V, dK, dV */
} attnhost_layout_kind;

/* Kinds of trace range */
typedef enum attnhost_range_kind {
  ATTNHOST_RANGE_COMPUTE = 1,
  ATTNHOST_RANGE_COMMUNICATION = 2,
  ATTNHOST_RANGE_OTHER = 3
} attnhost_range_kind;

typedef enum attnhost_log_level {
  ATTNHOST_LOG_DEBUG = 0,
  ATTNHOST_LOG_INFO = 1,
  ATTNHOST_LOG_WARNING = 2,
  ATTNHOST_LOG_ERROR = 3
} attnhost_log_level;

typedef enum attnhost_reduce_op {
  ATTNHOST_REDUCE_SUM = 1,
  ATTNHOST_REDUCE_MAX = 2,
  ATTNHOST_REDUCE_MIN = 3
} attnhost_reduce_op;

/* ---------------------------------------------------------------------------------------------
 * Tensors: DLPack-like descriptors. Owned by whoever allocated `data`; a descriptor passed to a
 * plugin is valid only for the duration of the call that receives it.
 * ------------------------------------------------------------------------------------------- */
#define ATTNHOST_MAX_DIMS 8

typedef struct attnhost_tensor {
  uint32_t struct_size;
  void* data;                          /* first element; NULL for an empty tensor */
  int32_t device_type;                 /* attnhost_device_type */
  int32_t device_id;                   /* CUDA ordinal; 0 on the CPU */
  int32_t dtype;                       /* attnhost_dtype */
  int32_t ndim;                        /* number of valid entries in shape and strides */
  int64_t shape[ATTNHOST_MAX_DIMS];    /* extents */
  int64_t strides[ATTNHOST_MAX_DIMS];  /* in elements, not bytes */
} attnhost_tensor;

/* ---------------------------------------------------------------------------------------------
 * Plugin parameters: typed values and the schema that declares them
 * ------------------------------------------------------------------------------------------- */
typedef struct attnhost_param_value {
  uint32_t struct_size;
  const char* name;
  int32_t type;              /* attnhost_param_type */
  int64_t int_value;         /* INT, BOOL (0/1) */
  double float_value;        /* FLOAT */
  const char* string_value;  /* STRING, PATH */
  const int64_t* list_value; /* INT_LIST */
  int64_t list_length;       /* INT_LIST */
} attnhost_param_value;

typedef struct attnhost_param_spec {
  uint32_t struct_size;
  const char* name;          /* lower_snake_case, unique within the plugin */
  int32_t type;              /* attnhost_param_type */
  const char* default_value; /* the default written as a TOML value, e.g. "128", "true", "[1, 2]" */
  const char* help;          /* one line */
  const char* choices;       /* STRING only: allowed values separated by '|', or NULL for any */
} attnhost_param_spec;

/* ---------------------------------------------------------------------------------------------
 * The problem one instance solves. Sizes are global (the whole sequence), not per rank.
 * Owned by the host; valid for the duration of the call that receives it (copy what you keep).
 * ------------------------------------------------------------------------------------------- */
typedef struct attnhost_problem {
  uint32_t struct_size;
  int64_t batch;            /* B; 1 when packed (num_seqs > 0) */
  int64_t seqlen_q;         /* global query tokens per batch entry (packed: total tokens) */
  int64_t seqlen_kv;        /* global key/value tokens per batch entry (packed: total tokens) */
  int32_t heads_q;          /* query heads */
  int32_t heads_kv;         /* key/value heads; heads_q % heads_kv == 0 (GQA/MQA when smaller) */
  int32_t head_dim;         /* D */
  int32_t dtype;            /* attnhost_dtype of Q, K, V, O, dO, dQ, dK, dV */
  int32_t causal;           /* 1: query i attends keys j <= i (global, bottom-right aligned when
                               seqlen_kv > seqlen_q: j <= i + seqlen_kv - seqlen_q) */
  int32_t deterministic;    /* 1: backward must be bitwise reproducible */
  int64_t window_left;      /* sliding window: query i attends j in [i - left, i + right]; */
  int64_t window_right;     /*   -1 means unbounded on that side */
  double softmax_scale;     /* scale of q.k; the host sets 1/sqrt(head_dim) unless configured */
  int32_t num_seqs;         /* > 0: packed variable-length input [T, H, D] with batch = 1 */
  const int64_t* cu_seqlens_q;  /* num_seqs + 1 prefix sums of query lengths (global), or NULL */
  const int64_t* cu_seqlens_kv; /* num_seqs + 1 prefix sums of key lengths (global), or NULL */
  int32_t world_size;       /* ranks cooperating on this problem */
  int32_t rank;             /* this rank, 0 <= rank < world_size (validate: rank is 0) */
  int32_t device_type;      /* attnhost_device_type the instance runs on */
  int32_t num_params;       /* plugin parameters, already checked against the plugin's schema and */
  const attnhost_param_value* params; /* completed with defaults: every schema entry is present */
  /* Appended in ABI 1.1. The ranks of this problem that share this rank's machine (node): this
   * rank is the local_rank-th of local_size of them, counted in rank order. Ranks of one node are
   * where a plugin puts its heaviest traffic (usp keeps its all-to-alls inside a node). Absent
   * (a 1.0 host): read local_size as world_size and local_rank as rank. */
  int32_t local_rank;
  int32_t local_size;
  /* Appended in ABI 1.6. The attnhost_dtype of dO where it is not `dtype`, else 0: fp8_e5m2 in an
   * fp8_e4m3 problem, the hybrid FP8 recipe (gradients in the format of wider range, with their
   * own descale_do). Only a plugin with ATTNHOST_FEATURE_FP8_HYBRID is given such a problem. */
  int32_t grad_dtype;
} attnhost_problem;

/* ---------------------------------------------------------------------------------------------
 * What a plugin says about itself (returned by describe; static, valid while the library is loaded)
 * ------------------------------------------------------------------------------------------- */
typedef struct attnhost_capabilities {
  uint32_t struct_size;
  uint32_t devices;        /* ATTNHOST_CAP_DEVICE_* bits */
  uint32_t dtypes;         /* ATTNHOST_CAP_DTYPE(d) bits */
  uint32_t features;       /* ATTNHOST_FEATURE_* bits */
  int32_t min_world_size;  /* >= 1 */
  int32_t max_world_size;  /* 0: no limit */
  int32_t num_head_dims;   /* 0: any multiple of 8 */
  const int32_t* head_dims;/* supported head dims when num_head_dims > 0 */
} attnhost_capabilities;

typedef struct attnhost_plugin_info {
  uint32_t struct_size;
  const char* name;        /* unique, lower_snake_case: how suites and the CLI name the plugin */
  const char* version;     /* the plugin's own version, e.g. "1.2.0" */
  const char* description; /* one line */
  attnhost_capabilities capabilities;
  int32_t num_params;
  const attnhost_param_spec* params;
} attnhost_plugin_info;

/* ---------------------------------------------------------------------------------------------
 * Data layout: which global tokens this rank holds, in local order.
 * Local tensors are [B, local_tokens, H, D] (packed: [local_tokens, H, D]) and LSE [B, H, local_tokens]
 * (packed: [H, local_tokens]), contiguous. A local token covered by no range is padding: the host
 * fills it with zeros, never checks it, and the plugin must leave its result out of every real row.
 * ------------------------------------------------------------------------------------------- */
typedef struct attnhost_token_range {
  int64_t global_begin;    /* first global token (per batch entry; packed: index into the packing) */
  int64_t local_begin;     /* where it starts in the local tensor */
  int64_t length;          /* number of consecutive tokens */
} attnhost_token_range;

typedef struct attnhost_layout {
  uint32_t struct_size;
  int64_t local_tokens;               /* extent of the token dimension of local tensors */
  int32_t num_ranges;
  const attnhost_token_range* ranges; /* owned by the instance; valid until destroy */
} attnhost_layout;

/* ---------------------------------------------------------------------------------------------
 * What attends what, for the host's float64 reference check (see docs/VARIANTS.md):
 *   LSE = log sum_k m_k exp(s_k),  O = sum_k m_k exp(s_k - LSE) v_k.
 * A span is the arithmetic progression begin, begin + step, ... (< end) of global tokens,
 * each with multiplicity m. In a row (keys of one query) `head` is -1; in a column (queries
 * that attend one key) `head` is the query head of the span.
 * ------------------------------------------------------------------------------------------- */
typedef struct attnhost_span {
  int64_t begin;
  int64_t end;             /* exclusive */
  int64_t step;            /* >= 1 */
  int32_t head;            /* query head (columns), -1 (rows) */
  int32_t multiplicity;    /* >= 1 */
} attnhost_span;

typedef struct attnhost_span_list {
  uint32_t struct_size;
  int64_t num_spans;
  const attnhost_span* spans; /* owned by the instance; valid until the next enumerate_* call on
                                 the same instance, or destroy */
} attnhost_span_list;

/* ---------------------------------------------------------------------------------------------
 * Host services: what the host lends a plugin instance. Valid from create until destroy.
 * Every function takes the `context` of this struct. Functions returning int32_t return an
 * attnhost_status (0 = success); on failure the host has already logged the detail.
 *
 * Streams: on CUDA a stream is a cudaStream_t passed as void*; on the CPU it is NULL and every
 * operation completes before it returns. Communication calls are enqueued on the stream given.
 * Buffers given to communication calls live on the instance's device.
 * ------------------------------------------------------------------------------------------- */
/* ABI 1.7: a strided block of bytes for send_block and recv_block: `slices` slices of `rows` rows
 * of `width` bytes; row r of slice s starts at data + s * slice_pitch + r * pitch. Rows and slices
 * do not overlap: pitch >= width where rows > 1, slice_pitch >= (rows - 1) * pitch + width where
 * slices > 1. A contiguous message of n bytes is {n, 1, n, 1, n}. */
typedef struct attnhost_block {
  uint32_t struct_size;
  void* data;
  size_t width, rows, pitch;
  size_t slices, slice_pitch;
} attnhost_block;

typedef struct attnhost_host_api {
  uint32_t struct_size;
  void* context;

  /* -- streams -- */
  /* Stream `index` of this rank: 0 is the stream the host times (forward/backward must enqueue
   * their work on it or join other streams back into it before returning); 1 and 2 are
   * auxiliary streams (e.g. for communication) created by the host at the device's greatest
   * priority, so that their work is scheduled ahead of stream 0's waiting blocks. ABI 1.8: 3 is
   * an auxiliary stream at stream 0's priority, for work that should take the SMs stream 0's
   * kernels leave free (a kernel's last wave) rather than cut ahead of them; NULL from an older
   * host. NULL on the CPU. */
  void* (*stream)(void* context, int32_t index);

  /* -- memory: device memory of this rank, accounted by the host -- */
  int32_t (*alloc)(void* context, size_t bytes, void** out);
  void (*free)(void* context, void* ptr);

  /* -- communicator over the problem's world_size ranks -- */
  int32_t (*send)(void* context, const void* buf, size_t count, int32_t dtype, int32_t peer, void* stream);
  int32_t (*recv)(void* context, void* buf, size_t count, int32_t dtype, int32_t peer, void* stream);
  int32_t (*group_start)(void* context);  /* sends/recvs until group_end progress together */
  int32_t (*group_end)(void* context);
  int32_t (*all_gather)(void* context, const void* send, void* recv, size_t count_per_rank,
                        int32_t dtype, void* stream);
  int32_t (*all_reduce)(void* context, const void* send, void* recv, size_t count, int32_t dtype,
                        int32_t op, void* stream);
  int32_t (*reduce_scatter)(void* context, const void* send, void* recv, size_t count_per_rank,
                            int32_t dtype, int32_t op, void* stream);
  int32_t (*barrier)(void* context);
  void* (*native_comm)(void* context); /* ncclComm_t on CUDA, NULL on the CPU and where ranks share
                                          GPUs (--ranks-per-gpu: no NCCL there) */

  /* -- trace: named ranges shown in the timeline (the host ignores them outside traced runs) -- */
  int32_t (*range_begin)(void* context, const char* name, int32_t kind, void* stream);
  void (*range_end)(void* context, int32_t range, void* stream); /* range: range_begin's result */

  /* -- log: one line, no trailing newline needed -- */
  void (*log)(void* context, int32_t level, const char* message);

  /* -- ABI 1.7: point-to-point of strided blocks, neither end packed --
   * A block sent meets the peer's block received with the same width, rows and slices (each end
   * has its own pitches). Blocks and plain sends/recvs to and from one peer are matched in the
   * order they are made, as send and recv are, and take part in the same groups. Where the GPUs
   * reach one another's memory a block is one peer copy by the copy engines, so no SM packs or
   * moves it. NULL where the transport cannot move a strided block as it lies (NCCL's kernels and
   * MPI take contiguous buffers): pack the block into a contiguous message and send that. */
  int32_t (*send_block)(void* context, const attnhost_block* block, int32_t peer, void* stream);
  int32_t (*recv_block)(void* context, const attnhost_block* block, int32_t peer, void* stream);
} attnhost_host_api;

/* ---------------------------------------------------------------------------------------------
 * Arguments of forward and backward. Tensors are local (this rank's tokens, see layout), on the
 * instance's device, contiguous, in problem dtype unless stated. Each tensor's dtype field says
 * which: in an FP8 problem the inputs (q, k, v, d_o) are FP8 and the outputs (o, dq, dk, dv) bf16.
 * ------------------------------------------------------------------------------------------- */

/* ABI 1.4: the scaling of an FP8 problem's inputs. A tensor in FP8 holds x * scale, rounded to the
 * format, with one scale per tensor chosen so that its largest |x| fits; the value it stands for is
 * its element times the descale (1 / scale) given here. */
typedef struct attnhost_fp8_scaling {
  uint32_t struct_size;
  float descale_q, descale_k, descale_v, descale_do;
} attnhost_fp8_scaling;

/* ABI 1.5: where a plugin reports the largest |x| of each output it wrote in an FP8 problem, the
 * statistic a training step's delayed scaling keeps to choose the next scales (format maximum /
 * amax). Of this rank's tensor as written (bf16 values, rows it does not own excluded: 0 for
 * none), in the instance's memory (device memory for CUDA instances), so that the plugin writes
 * it from its stream. The host sets the fields to NaN before a checked pass and compares them with
 * the outputs after it; a field left NaN is reported as not given, and is not an error. */
typedef struct attnhost_fp8_amax {
  float o;          /* forward */
  float dq, dk, dv; /* backward */
} attnhost_fp8_amax;

typedef struct attnhost_forward_args {
  uint32_t struct_size;
  attnhost_tensor q;   /* [B, Sq_local, Hq, D]  (packed: [Tq_local, Hq, D]) */
  attnhost_tensor k;   /* [B, Skv_local, Hkv, D] */
  attnhost_tensor v;   /* [B, Skv_local, Hkv, D] */
  attnhost_tensor o;   /* out: [B, Sq_local, Hq, D] */
  attnhost_tensor lse; /* out: [B, Hq, Sq_local] fp32, natural log; -inf for a row with no key */
  const attnhost_fp8_scaling* fp8; /* ABI 1.4: an FP8 problem's scaling; NULL for any other */
  attnhost_fp8_amax* amax;         /* ABI 1.5: out, amax->o; NULL where the host wants none */
} attnhost_forward_args;

typedef struct attnhost_backward_args {
  uint32_t struct_size;
  attnhost_tensor q, k, v;
  attnhost_tensor o;   /* the forward's output */
  attnhost_tensor lse; /* the forward's LSE */
  attnhost_tensor d_o; /* gradient of the loss with respect to O */
  attnhost_tensor dq;  /* out */
  attnhost_tensor dk;  /* out */
  attnhost_tensor dv;  /* out */
  const attnhost_fp8_scaling* fp8; /* ABI 1.4: an FP8 problem's scaling; NULL for any other */
  attnhost_fp8_amax* amax;         /* ABI 1.5: out, amax->dq, dk, dv; NULL where the host wants none */
} attnhost_backward_args;

/* ---------------------------------------------------------------------------------------------
 * The plugin table
 * ------------------------------------------------------------------------------------------- */
typedef struct attnhost_error attnhost_error;       /* opaque, created by the plugin */
typedef struct attnhost_instance attnhost_instance; /* opaque, created by the plugin */

typedef struct attnhost_plugin_api {
  uint32_t struct_size;
  uint32_t abi_major; /* the plugin's ATTNHOST_ABI_MAJOR */
  uint32_t abi_minor; /* the plugin's ATTNHOST_ABI_MINOR */

  /* Static description; *out stays valid while the library is loaded. */
  attnhost_error* (*describe)(const attnhost_plugin_info** out);

  /* Does the plugin accept this problem? Called before any allocation, with rank 0, so that the
   * host can reject a case with the plugin's own message (ATTNHOST_ERR_UNSUPPORTED or
   * ATTNHOST_ERR_INVALID_ARGUMENT). Must not touch a device. */
  attnhost_error* (*validate)(const attnhost_problem* problem);

  /* One instance per rank. `host` stays valid until destroy. */
  attnhost_error* (*create)(const attnhost_problem* problem, const attnhost_host_api* host,
                            attnhost_instance** out);

  /* Which global tokens this rank holds (see attnhost_layout). */
  attnhost_error* (*layout)(attnhost_instance* instance, int32_t kind, attnhost_layout* out);

  /* Enqueue the forward pass on host stream 0. */
  attnhost_error* (*forward)(attnhost_instance* instance, const attnhost_forward_args* args);

  /* Enqueue the backward pass on host stream 0; NULL when the plugin has no backward. */
  attnhost_error* (*backward)(attnhost_instance* instance, const attnhost_backward_args* args);

  /* (query, key) pairs computed, with multiplicity: by this rank and by all ranks together.
   * FLOPs follow FlashAttention: forward 4 * head_dim * pairs (summed over heads and batch). */
  attnhost_error* (*count_pairs)(attnhost_instance* instance, int64_t* rank_pairs,
                                 int64_t* total_pairs);

  /* Keys attended by query `query` (global) of query head `head` in batch entry `batch`. */
  attnhost_error* (*enumerate_keys)(attnhost_instance* instance, int64_t batch, int32_t head,
                                    int64_t query, attnhost_span_list* out);

  /* Queries (with their query heads) that attend key `key` of key/value head `kv_head`. */
  attnhost_error* (*enumerate_queries)(attnhost_instance* instance, int64_t batch, int32_t kv_head,
                                       int64_t key, attnhost_span_list* out);

  /* Frees the instance and everything it allocated; waits for its device work first. */
  void (*destroy)(attnhost_instance* instance);

  const char* (*error_message)(const attnhost_error* error); /* valid until error_destroy */
  int32_t (*error_code)(const attnhost_error* error);        /* attnhost_status */
  void (*error_destroy)(attnhost_error* error);

  /* Appended in ABI 1.3. How the plugin's code was compiled, for the results: "optimized" or
   * "unoptimized", after the build configuration when the build system names one ("Release,
   * optimized"). A timing of unoptimized code says little; the host warns about it. May be NULL. */
  const char* build;
} attnhost_plugin_api;

typedef struct attnhost_version {
  uint32_t struct_size;
  uint32_t major;
  uint32_t minor;
} attnhost_version;

/* The one exported symbol. Return the plugin's table, or NULL to refuse the host's version. */
typedef const attnhost_plugin_api* (*attnhost_plugin_entry_fn)(const attnhost_version* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ATTNHOST_PLUGIN_H */
