/* kilnrt.h - Kiln's runtime library: tensors, half-precision conversions,
 * tensor files (.npy, .safetensors), devices, compiled models and the
 * training input pipeline.  One public header for the runtime/ folder;
 * compiled programs and the driver include only this.  It declares
 * krt_ and KRT_ names only (tests/unit/check_public_names.py checks): it is
 * included into users' code.  ONNX .pb tensor files are libkilnrt_pb's,
 * runtime/pb/kilnrt_pb.h, so that only programs reading them link
 * protobuf-c. */
#ifndef KRT_KILNRT_H
#define KRT_KILNRT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* FILE, for krt_trace_summary */

/* Tensor data is raw little-endian bytes and the file formats are
 * little-endian, so the readers and writers copy bytes without swapping.
 * That only works on a little-endian host; fail the build anywhere else. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "libkilnrt assumes a little-endian host");
#endif

/* ---- tensors --------------------------------------------------------- */
/* Same order as the IR's kl_dtype, so the two convert by a plain cast. */
typedef enum {
  KRT_F32, KRT_F16, KRT_BF16, KRT_F64, KRT_I8, KRT_I32, KRT_I64, KRT_BOOL,
  KRT_U8, KRT_I16, KRT_U16, KRT_U32, KRT_U64,
  /* one byte per element, also the sub-byte ones (ONNX packs u4 i4 f4e2m1
   * two to a byte and u2 i2 four; only .pb files do here): i4/i2 as a
   * sign-extended int8, u4/u2 as a uint8, the floats as their code */
  KRT_F8E4M3FN, KRT_F8E4M3FNUZ, KRT_F8E5M2, KRT_F8E5M2FNUZ, KRT_U4, KRT_I4,
  KRT_F4E2M1, KRT_F8E8M0, KRT_U2, KRT_I2,
  KRT_DTYPE_COUNT
} krt_dtype;

#define KRT_MAX_RANK 8
/* Largest element count accepted for one tensor (2^31 - 1), the same limit
 * as the IR's KL_MAX_NUMEL: keeps byte counts far from overflow and turns
 * absurd dims in a hostile file into a clean error. */
#define KRT_MAX_NUMEL ((int64_t)0x7fffffff)

typedef struct {
  krt_dtype dtype;
  int rank;                    /* 0..KRT_MAX_RANK; rank 0 holds 1 element */
  int64_t dims[KRT_MAX_RANK];
  void *data;                  /* malloc'd, raw little-endian C-order;
                                  bool is one byte, 0 or 1 */
} krt_tensor;

size_t krt_dtype_size(krt_dtype t);        /* 0 for an invalid dtype */
const char *krt_dtype_name(krt_dtype t);   /* "f32","f16","bf16","f64","i8",
                                              "i32","i64","bool"; "?" if bad */
/* Element count, or -1 when rank or a dim is out of range or the count
 * exceeds KRT_MAX_NUMEL. */
int64_t krt_tensor_numel(const krt_tensor *t);
void krt_tensor_free(krt_tensor *t);       /* frees data, not the struct;
                                              NULL-safe */

/* Seeded numbers (random.c): splitmix64, uniform [0, 1), normal (0, 1);
 * the state advances.  krt_tensor_random fills a new tensor as `kiln run`
 * fills an input not given: normal floats, integers 0..3, coin-flip bools;
 * -1 for a bad dtype or out of memory. */
uint64_t krt_rng_next(uint64_t *state);
double krt_rng_uniform(uint64_t *state);
double krt_rng_normal(uint64_t *state);
int krt_tensor_random(krt_dtype dtype, int rank, const int64_t *dims, uint64_t seed, krt_tensor *out);

/* ---- half types ------------------------------------------------------ */
/* IEEE binary16 and bfloat16 bit patterns.  float -> half rounds to nearest,
 * ties to even; overflow gives Inf, NaN stays NaN (made quiet), subnormals
 * are exact.  half -> float is exact. */
uint16_t krt_f32_to_f16(float f);
float krt_f16_to_f32(uint16_t h);
uint16_t krt_f32_to_bf16(float f);
float krt_bf16_to_f32(uint16_t h);

/* ---- one-byte floats ------------------------------------------------- */
/* fp8 (KRT_F8*), fp4 (KRT_F4E2M1) and KRT_F8E8M0 codes, the same functions
 * the kernels use (runtime/emu/kiln_prelude.h).  code -> float is exact
 * (0 for a dtype that is none of these).  float -> code rounds to nearest
 * even as ONNX's Cast; saturate clamps overflow and Inf to the largest
 * finite value, otherwise overflow gives Inf (E5M2) or NaN; E8M0 uses
 * round_mode (KRT_ROUND_UP, _DOWN, _NEAREST, Cast's round_mode). */
enum { KRT_ROUND_UP, KRT_ROUND_DOWN, KRT_ROUND_NEAREST };
int krt_dtype_is_small_float(krt_dtype t);
float krt_small_float_to_f32(krt_dtype t, uint8_t code);
uint8_t krt_f32_to_small_float(krt_dtype t, float f, int saturate, int round_mode);
/* Bits per element where ONNX packs the type (4 or 2), else 8 * size. */
int krt_dtype_bits(krt_dtype t);

/* ---- tensor files ---------------------------------------------------- */
/* All fallible calls return 0 on success and -1 on failure, with a message
 * naming the file and the problem in errbuf (errlen bytes; errbuf may be
 * NULL).  On failure the output is left empty (nothing to free) and a
 * writer removes its partial file. */

/* .npy: reads versions 1.0, 2.0 and 3.0 with descr <f4 <f2 <f8 |i1 <i4 <i8
 * |b1 |u1 <i2 <u2 <u4 <u8; writes version 1.0.  NumPy has no bfloat16, so a bf16 tensor is
 * written as <f4 (exact) and reads back as KRT_F32. */
int krt_npy_read(const char *path, krt_tensor *out, char *errbuf,
                 size_t errlen);
int krt_npy_write(const char *path, const krt_tensor *t, char *errbuf,
                  size_t errlen);

/* .safetensors: a named list of tensors.  Reading keeps the header's order
 * and ignores "__metadata__"; writing stores tensors in the given order. */
typedef struct {
  char *name;                  /* malloc'd */
  krt_tensor tensor;
} krt_named_tensor;

typedef struct {
  krt_named_tensor *items;     /* malloc'd */
  int count;
} krt_tensor_set;

int krt_safetensors_read(const char *path, krt_tensor_set *out, char *errbuf,
                         size_t errlen);
/* The header alone: the same set with every data NULL, and (*offsets)[i]
 * (malloc'd) where item i's bytes start in the file, for a reader that maps
 * the file rather than copy the weights (bool bytes are then as stored:
 * any nonzero byte is true). */
int krt_safetensors_index(const char *path, krt_tensor_set *out, int64_t **offsets,
                          char *errbuf, size_t errlen);
int krt_safetensors_write(const char *path, const krt_tensor_set *set,
                          char *errbuf, size_t errlen);
/* NULL when absent. */
const krt_tensor *krt_tensor_set_find(const krt_tensor_set *set,
                                      const char *name);
/* Frees names, data and items, not the struct; NULL-safe. */
void krt_tensor_set_free(krt_tensor_set *set);

/* ---- devices ----------------------------------------------------------
 * Compiled models run on a device: `cuda` (a GPU through the driver API,
 * libcuda loaded at run time so a program starts without a driver) or
 * `host` (the same CUDA C kernels compiled by the host compiler against
 * runtime/emu, contractions through a CPU BLAS).  Every fallible call
 * returns 0, or -1 with a message naming the call, the kernel or the
 * sizes in err (errlen bytes; err may be NULL). */
typedef enum { KRT_DEVICE_AUTO, KRT_DEVICE_HOST, KRT_DEVICE_CUDA } krt_device_kind;
typedef struct krt_device krt_device;
typedef struct krt_comm krt_comm; /* the ranks of a data-parallel run (collectives, below) */

/* AUTO takes the GPU when one works, else the host; the environment
 * variable KILN_DEVICE=host|cuda|auto overrides AUTO. */
int krt_device_open(krt_device_kind kind, krt_device **out, char *err, size_t errlen);
void krt_device_close(krt_device *d);                 /* NULL-safe */
krt_device_kind krt_device_kind_of(const krt_device *d);
const char *krt_device_name(const krt_device *d);     /* "host (2 threads)", "cuda: NVIDIA H200" */
int krt_device_sm(const krt_device *d);               /* a GPU's compute capability x 10; host: 0 */
/* "host" | "cuda" | "auto" -> kind; -1 for anything else. */
int krt_device_kind_parse(const char *s, krt_device_kind *out);

/* Device memory.  Out of memory names the bytes asked for and, on a GPU,
 * the free and total memory. */
int krt_malloc(krt_device *d, size_t bytes, void **ptr, char *err, size_t errlen);
void krt_free(krt_device *d, void *ptr);              /* NULL-safe */
int krt_upload(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
               size_t errlen);
int krt_download(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                 size_t errlen);
int krt_memset_zero(krt_device *d, void *dst, size_t bytes, char *err, size_t errlen);
/* Wait for all queued work; reports an asynchronous failure. */
int krt_synchronize(krt_device *d, char *err, size_t errlen);

/* CUDA Graphs.  A compiled model's run() enqueues the same work every time
 * (kernels, GEMMs, zeroing) on buffers fixed at create: krt_graph_run calls
 * compute(self), which only enqueues work on d, and on a cuda device with
 * graphs on, the first call runs it plainly (a warm-up: libraries and
 * handles are made then, which a capture may not do), the second captures
 * what it enqueues into a CUDA graph and every later call replays it in
 * one launch.  Elsewhere (the host
 * device, graphs off, the profiler on, capturable 0: a run that must talk
 * to the host mid-way, like a data-parallel step) it just calls compute.  A capture
 * the driver refuses is said once on stderr, and the model runs with plain
 * launches from then on.  Graphs are on unless krt_device_set_graphs(d, 0)
 * or KILN_NO_GRAPH=1 (in the environment when the device is opened). */
typedef struct krt_graph krt_graph;
typedef int (*krt_compute_fn)(void *self, char *err, size_t errlen);
int krt_graph_run(krt_device *d, krt_graph **graph, int capturable, krt_compute_fn compute,
                  void *self, char *err, size_t errlen);
void krt_graph_free(krt_device *d, krt_graph *graph); /* NULL-safe */
void krt_device_set_graphs(krt_device *d, int on);
/* 1 when runs on d are captured and replayed (a cuda device, graphs on) */
int krt_device_graphs(const krt_device *d);
/* graphs captured and replays launched on d since it was opened */
void krt_device_graph_counts(const krt_device *d, long *captures, long *replays);

/* CUDA's dim3: a launch's grid and block sizes. */
typedef struct krt_dim3 {
  unsigned int x, y, z;
} krt_dim3;

/* A kernel built for the host device: its name (for messages) and a
 * function that unpacks `args` - the array cuLaunchKernel takes, args[i]
 * pointing at the i-th argument's value - and runs the kernel.  The
 * emulator's KL_EMU_ENTRY defines one per kernel as `NAME__emu`
 * (runtime/emu/emu.h calls this type kl_emu_kernel). */
typedef struct krt_host_kernel {
  const char *name;
  void (*fn)(void **args);
} krt_host_kernel;

/* The kernels of one compiled model: for the host, each kernel's emulator
 * entry; for the GPU, cubin images per architecture and a PTX fallback,
 * compiled from the same kernels.cu by NVRTC at `kiln compile` time. */
typedef struct {
  const char *name;
  const krt_host_kernel *host; /* NULL in a GPU-only build */
} krt_kernel_desc;

typedef struct {
  int sm;                      /* 80, 90, ... */
  const unsigned char *data;
  size_t size;
} krt_cubin;

typedef struct {
  const krt_kernel_desc *kernels;
  int nkernels;
  const krt_cubin *cubins;
  int ncubins;
  const char *ptx;             /* NULL when none */
} krt_module_desc;

typedef struct krt_module krt_module;
int krt_module_load(krt_device *d, const krt_module_desc *desc, krt_module **out, char *err,
                    size_t errlen);
void krt_module_unload(krt_module *m);                /* NULL-safe */
/* Launch kernel `index` of the module; args as cuLaunchKernel takes them. */
int krt_launch(krt_module *m, int index, krt_dim3 grid, krt_dim3 block, size_t dyn_shared,
               void **args, char *err, size_t errlen);

/* Row-major (batched) GEMM on device pointers: for each batch item b,
 *   C_b = alpha * op(A_b) @ op(B_b) + beta * C_b,
 * op(X) = X or X^T, A_b = a + b * stride_a elements (stride 0 broadcasts).
 * batch2 > 1 adds an outer batch: item (o, b) is at o * stride_x2 +
 * b * stride_x (a transposed or split operand read in place).  The C
 * matrices of all items must be disjoint; they may interleave (ldc wider
 * than n).  f32/f64 compute in their type; f16/bf16 accumulate in f32. */
typedef struct {
  krt_dtype dtype;
  int trans_a, trans_b;
  int64_t m, n, k, batch;
  const void *a; int64_t lda, stride_a;
  const void *b; int64_t ldb, stride_b;
  void *c;       int64_t ldc, stride_c;
  double alpha, beta;
  int64_t batch2, stride_a2, stride_b2, stride_c2; /* 0 or 1: no outer batch */
  /* The epilogue, in the GEMM call (cuBLASLt's on a GPU):
   *   C = act(alpha * op(A) @ op(B) + beta * C_in + bias)
   * C_in: c_in laid out like C (NULL: C itself); bias: NULL, or n values
   * of the dtype added to every row; act: relu when relu is set. */
  const void *c_in;
  const void *bias;
  int relu;
} krt_gemm_desc;
int krt_gemm(krt_device *d, const krt_gemm_desc *g, char *err, size_t errlen);

/* ---- weights beside the program (kiln compile --weights-file) ----------
 * A model's weights in a file of their own: krt_weights_map looks for
 * `name` in $KILN_WEIGHTS_DIR, beside the program or library holding
 * `anchor` (any address in it), then in compiled_dir, and maps it
 * read-only after checking its size and CRC-32 against the compiled ones. */
typedef struct {
  void *data;
  size_t bytes;
} krt_weights;
int krt_weights_map(krt_weights *w, const char *name, const char *compiled_dir, size_t bytes,
                    uint32_t crc, const void *anchor, char *err, size_t errlen);
void krt_weights_unmap(krt_weights *w); /* NULL-safe, and safe twice */
uint32_t krt_crc32(const void *data, size_t bytes); /* zlib's */

/* ---- compiled models ---------------------------------------------------
 * Each generated model.c exports one krt_model_api (as kiln_model() and as
 * kiln_model_<name>()): what it takes and gives, and how to run it.  The
 * kiln command loads it from a shared object; a user links it directly. */
typedef struct {
  const char *name;
  krt_dtype dtype;
  int rank;
  int64_t dims[KRT_MAX_RANK];
} krt_io_desc;

typedef struct {
  const char *name;  /* "fused: a .. b", "gemm matmul_1", ... */
  int launches;      /* kernels and GEMM calls */
  size_t bytes;      /* estimated DRAM bytes read and written */
} krt_step_info;

/* A training step (kiln compile --train): what the training program
 * (krt_train_main) feeds and reads, and the hyper-parameters it computes
 * the step's scalars from on the host (docs/DSL.md has the formulas). */
typedef struct {
  const char *optimizer;         /* "sgd", "adam", "adamw" */
  double lr, beta1, beta2;
  const char *schedule;          /* "constant", "step", "cosine" */
  double warmup, step_size, gamma, total, min_lr;
  double clip;                   /* 0: none (compiled into the step) */
  int loss_scaling;              /* 1: dynamic loss scaling (fp16 compute) */
  /* input indices: samples and labels (-1: none), then the f32 scalars
   * the step reads: scheduled learning rate, 1 / (1 - beta1^t),
   * 1 / (1 - beta2^t), loss scale, apply (0: evaluate only) */
  int in_x, in_labels;
  int in_lr, in_bias1, in_bias2, in_scale, in_apply;
  /* output indices: the loss, ok (1: the update was taken), the
   * gradients' global norm, the logits (-1: none) */
  int out_loss, out_ok, out_norm, out_logits;
  /* the state the step updates in place: params trained, then the
   * optimizer's (read_state / write_state by index) */
  int nstates, nparams;
  const krt_io_desc *states;
  /* data-parallel (kiln compile --data-parallel): the input of the rank
   * count the update divides the summed gradients by, and the gradient
   * buckets exchanged each step; -1 and 0 otherwise */
  int in_world, nbuckets;
} krt_train_info;

typedef struct {
  const char *model_name;
  int ninputs, noutputs;
  const krt_io_desc *inputs, *outputs;
  size_t arena_bytes, param_bytes;
  int nkernels;
  /* create: allocate on `dev` and upload the weights; run: inputs and
   * outputs are host buffers in the described dtypes and shapes. */
  int (*create)(krt_device *dev, void **model, char *err, size_t errlen);
  int (*run)(void *model, const void *const *inputs, void *const *outputs, char *err,
             size_t errlen);
  void (*destroy)(void *model);
  /* The steps run() marks for the profiler: what each is and the DRAM
   * bytes it is estimated to move. */
  int nsteps;
  const krt_step_info *steps;
  /* Training (NULL when compiled for inference): the step's description,
   * and its state copied whole between device and host. */
  const krt_train_info *train;
  int (*read_state)(void *model, int i, void *host, char *err, size_t errlen);
  int (*write_state)(void *model, int i, const void *host, char *err, size_t errlen);
} krt_model_api;

/* ---- the training input pipeline ---------------------------------------
 * A training set is two .npy files, inputs x and targets y, with the same
 * first dim N (samples).  The loader maps both files (any size that fits
 * the disk), and worker threads assemble batches of `batch` samples into
 * buffers ahead of the caller: while it computes on batch i, they fill
 * batch i + 1 (and more, with more threads).  Epoch e's order is a
 * permutation drawn from (seed, e) alone, so a resumed run (krt_loader_seek)
 * gets exactly the batches an uninterrupted one would have.  Every fallible
 * call returns 0, or -1 with a message naming the file (and the row, for a
 * value that does not convert) in err. */
typedef struct {
  const char *x_path, *y_path;
  int batch;                   /* samples per batch, >= 1 */
  uint64_t seed;
  int shuffle;                 /* 0: file order (evaluation) */
  int drop_last;               /* 1: an epoch is floor(N / batch) batches;
                                  0: its last batch is short */
  int threads;                 /* workers; 0: 2 */
  /* Data parallelism: of each global batch of batch * ranks samples (the
   * batch one rank would take with that size), this loader takes the
   * rank-th share of `batch`; an epoch is floor(N / (batch * ranks))
   * batches (drop_last).  0, 0: one rank. */
  int rank, ranks;
  /* What the model takes; the files' values are converted:
   *   the file's own dtype: copied;
   *   f16/f32/f64 -> f16, bf16, f32, f64: rounded to nearest even;
   *   integers of up to 32 bits and bool -> those floats: likewise (u8
   *     pixels -> f32);
   *   any integer, bool, or a float holding an integer -> i32, i64:
   *     checked; a non-integral or out-of-range value fails, naming the
   *     file and row. */
  krt_dtype x_dtype, y_dtype;
} krt_loader_config;
typedef struct krt_loader krt_loader;

/* Maps the files, checks shapes and conversions, and starts the workers
 * (which begin filling the first batches at once). */
int krt_loader_open(const krt_loader_config *cfg, krt_loader **out, char *err,
                    size_t errlen);
int64_t krt_loader_samples(const krt_loader *l);            /* N */
int64_t krt_loader_batches_per_epoch(const krt_loader *l);
/* One sample of x and of y: the files' dims after the first, in the
 * configured dtypes; name is the file's path (valid while the loader is
 * open).  A batch is [batch, dims..]. */
void krt_loader_sample_desc(const krt_loader *l, krt_io_desc *x, krt_io_desc *y);
/* The next batch: host buffers of `batch` samples in x_dtype and y_dtype,
 * valid until the next call to krt_loader_next or krt_loader_seek; *count
 * samples are filled (fewer than batch only for an epoch's last batch
 * without drop_last; the rest is zero).  *wait_ms (may be NULL) is how long
 * this call waited for the workers.  Crosses epochs by itself.  A worker's
 * error (a value that does not convert) comes back here, and again on each
 * call until a seek. */
int krt_loader_next(krt_loader *l, const void **x, const void **y, int *count,
                    double *wait_ms, char *err, size_t errlen);
/* Where the next batch starts: its epoch and its index in that epoch. */
void krt_loader_position(const krt_loader *l, int64_t *epoch, int64_t *batch_index);
/* Makes (epoch, batch_index) the next batch, e.g. to resume from a
 * checkpoint: what follows is exactly what an uninterrupted run got there. */
int krt_loader_seek(krt_loader *l, int64_t epoch, int64_t batch_index, char *err,
                    size_t errlen);
void krt_loader_close(krt_loader *l);  /* NULL-safe; joins the workers, unmaps */

/* ---- training ------------------------------------------------------------
 * Dynamic loss scaling (fp16 training): the loss is multiplied by the scale
 * before the backward pass and every gradient divided by it in the update,
 * so small gradients do not flush to zero in half precision.  Starts at
 * 2^16; a step whose gradients are not all finite is skipped and halves
 * the scale (never below 1); 2000 finite steps in a row double it. */
typedef struct {
  double scale;
  int64_t good_steps;       /* finite steps since the scale last changed */
  int64_t growth_interval;  /* 2000 */
  int enabled;              /* 0: scale stays 1 (fp32, bf16) */
} krt_loss_scaler;
void krt_loss_scaler_init(krt_loss_scaler *s, int enabled);
/* After a step: finite says whether its gradients were; returns 1 when the
 * scale changed. */
int krt_loss_scaler_update(krt_loss_scaler *s, int finite);

/* The learning rate at step `step` (0-based) of a run of `total_steps`
 * under t's schedule (docs/DSL.md, Training, has the formulas), and
 * Adam's bias corrections 1 / (1 - beta^(step + 1)). */
double krt_schedule_lr(const krt_train_info *t, int64_t step, int64_t total_steps);
double krt_bias_correction(double beta, int64_t step);

/* A compiled training step driven from C (kiln compile --train --emit=lib:
 * kiln_model_NAME() is the step; see docs/DSL.md, Training).  The trainer
 * owns the model on `dev`, computes each step's learning rate, Adam's bias
 * corrections and the loss scale on the host, and counts the steps.
 * total_steps: the run's length, for a cosine schedule without `total`
 * (0: none).  Every fallible call returns 0, or -1 with a message. */
typedef struct krt_trainer krt_trainer;
int krt_trainer_create(const krt_model_api *api, krt_device *dev, int64_t total_steps,
                       krt_trainer **out, char *err, size_t errlen);
void krt_trainer_destroy(krt_trainer *t);                 /* NULL-safe */
/* One step on a batch (host buffers in the step's input dtypes and shapes:
 * api->inputs[train->in_x], [train->in_labels]): *loss is the batch's loss
 * before the update, *applied 0 when the update was skipped (fp16: a
 * gradient was not finite; the loss scale then halved).  Either may be
 * NULL.  inject_inf: a test hook, the step's loss scale made infinite. */
int krt_trainer_step(krt_trainer *t, const void *x, const void *labels, int inject_inf,
                     float *loss, int *applied, char *err, size_t errlen);
/* The loss and the logits (when the step has them: float
 * api->outputs[train->out_logits]) of a batch, nothing updated. */
int krt_trainer_eval(krt_trainer *t, const void *x, const void *labels, float *loss,
                     void *logits, char *err, size_t errlen);
int64_t krt_trainer_step_count(const krt_trainer *t);     /* steps taken */
/* Data parallelism (a step compiled with --data-parallel): the ranks its
 * summed gradients are divided by (default 1); and every state tensor
 * made rank root's over comm. */
int krt_trainer_set_ranks(krt_trainer *t, int ranks, char *err, size_t errlen);
int krt_trainer_broadcast(krt_trainer *t, krt_comm *comm, int root, char *err, size_t errlen);
double krt_trainer_loss_scale(const krt_trainer *t);      /* 1 unless fp16 */
/* A param or optimizer state tensor by name (api->train->states), copied
 * whole to or from a host buffer of its dtype and shape. */
int krt_trainer_read(krt_trainer *t, const char *name, void *host, char *err, size_t errlen);
int krt_trainer_write(krt_trainer *t, const char *name, const void *host, char *err,
                      size_t errlen);
/* Checkpoints: one .safetensors with every state tensor, the step, the
 * loss scale and the data order's position (epoch, batch) and seed, which
 * load gives back for the caller's data loader. */
int krt_trainer_save(krt_trainer *t, const char *path, int64_t data_epoch, int64_t data_batch,
                     uint64_t seed, char *err, size_t errlen);
int krt_trainer_load(krt_trainer *t, const char *path, int64_t *data_epoch,
                     int64_t *data_batch, uint64_t *seed, char *err, size_t errlen);

/* The training program (kiln compile --train --emit=exe, kiln train):
 * `--data DIR` with train_x.npy, train_y.npy (and test_x.npy, test_y.npy
 * for accuracy), `--epochs N | --steps N`, `--checkpoint FILE`,
 * `--resume FILE`, `--device`; see --help.  krt_exe_main calls it for a
 * model compiled with --train.  Returns the exit status. */
int krt_train_main(const krt_model_api *api, int argc, char **argv);

/* ---- collectives ---------------------------------------------------------
 * A communicator joins the ranks of a data-parallel run (one process each,
 * started by mpirun).  libkilnrt holds the interface and the one-rank
 * case; libkilnrt_mpi (comm_mpi.c) implements it over MPI on the host
 * device, with NCCL for the cuda device.  Every fallible call returns 0,
 * or -1 with a message naming the call, the rank and the step; one that
 * does not complete within the communicator's timeout ends every rank. */
typedef enum { KRT_REDUCE_SUM, KRT_REDUCE_MAX } krt_reduce_op;
int krt_comm_rank(const krt_comm *c);        /* 0 for NULL: one rank */
int krt_comm_size(const krt_comm *c);        /* 1 for NULL */
/* Blocking, on host memory: f32, f64, i32 or i64 elements. */
int krt_comm_all_reduce(krt_comm *c, void *buf, int64_t count, krt_dtype dtype, krt_reduce_op op,
                        char *err, size_t errlen);
int krt_comm_broadcast(krt_comm *c, void *buf, size_t bytes, int root, char *err, size_t errlen);
int krt_comm_barrier(krt_comm *c, char *err, size_t errlen);
/* The step named in messages, and the time spent in gradient exchanges:
 * busy (from a bucket's start to its completion) and exposed (the compute
 * side blocked in krt_all_reduce_wait); busy - exposed was hidden. */
void krt_comm_set_step(krt_comm *c, int64_t step);
typedef struct {
  double busy_ms, exposed_ms;
  int64_t buckets;
} krt_comm_stats;
void krt_comm_get_stats(const krt_comm *c, krt_comm_stats *out);
void krt_comm_close(krt_comm *c);            /* NULL-safe */
/* Opens the communicator of this process (argc/argv for MPI_Init);
 * timeout_s bounds every collective.  libkilnrt_mpi's
 * krt_comm_mpi_open is one. */
typedef int (*krt_comm_opener)(int *argc, char ***argv, double timeout_s, krt_comm **out,
                               char *err, size_t errlen);

/* A compiled data-parallel step's gradient exchange (generated run()
 * calls these): start summing bucket `bucket`'s count tensors src[i] into
 * dst[i] (numel[i] elements of dtype each, device memory) over the
 * device's communicator, and return; wait for it.  Without a communicator
 * (one rank) the sum is a copy. */
void krt_device_set_comm(krt_device *d, krt_comm *c);
int krt_all_reduce_start(krt_device *d, int bucket, int count, void *const *src, void *const *dst,
                         const int64_t *numel, krt_dtype dtype, char *err, size_t errlen);
int krt_all_reduce_wait(krt_device *d, int bucket, char *err, size_t errlen);

/* krt_train_main, the ranks of a data-parallel run joined by `open` (NULL: one
 * rank): each rank reads its share of every global batch, rank 0 prints
 * and checkpoints.  krt_exe_main_mpi (libkilnrt_mpi) passes
 * krt_comm_mpi_open. */
int krt_train_main_with(const krt_model_api *api, int argc, char **argv, krt_comm_opener open);

/* ---- the profiler ------------------------------------------------------
 * With profiling on, a compiled model's run() marks the start of each of
 * its steps (a kernel, a GEMM with its epilogue) and its end; the time of
 * step i is the time between marks i and i + 1: CUDA events on a GPU, the
 * clock on the host (where every launch returns when it is done).  Off (the
 * default), a mark is one branch. */
int krt_profile_enable(krt_device *d, int nmarks, char *err, size_t errlen); /* 0: off */
int krt_mark(krt_device *d, int i, char *err, size_t errlen);
/* What run() calls at the start of step i (name: the step's, as in the
 * trace) and at its end (i = nsteps, name NULL): krt_mark, and an NVTX
 * range per step for Nsight, ended at the next mark.  A run replayed as a
 * CUDA graph calls it only while it is captured: --no-graph (or
 * KILN_NO_GRAPH=1) gives every run its ranges. */
int krt_step_mark(krt_device *d, int i, const char *name, char *err, size_t errlen);
/* After a run: ms[i] for i < nsteps (nsteps + 1 marks), once its work is done. */
int krt_profile_read(krt_device *d, double *ms, int nsteps, char *err, size_t errlen);
/* A Chrome trace of a model's runs (trace.c): --profile FILE.json of a
 * compiled program, KILN_PROFILE=FILE.json for a library.  add_run takes
 * one run's step times (krt_profile_read) and its wall time; write makes
 * the JSON (Perfetto, chrome://tracing); summary prints the table of
 * steps (calls, total and mean time, share, bytes, GB/s, idle time). */
typedef struct krt_trace krt_trace;
krt_trace *krt_trace_new(const krt_model_api *api, krt_device *dev); /* NULL: out of memory */
int krt_trace_add_run(krt_trace *t, const double *step_ms, double run_ms);
int krt_trace_write(const krt_trace *t, const char *path, char *err, size_t errlen);
void krt_trace_summary(const krt_trace *t, FILE *f);
void krt_trace_free(krt_trace *t);

/* Device-to-device copy bandwidth, GB/s of bytes read plus bytes written:
 * the median of `iters` copies of `bytes`. */
int krt_copy_bandwidth(krt_device *d, size_t bytes, int iters, double *gbps, char *err,
                       size_t errlen);

/* ---- timing ------------------------------------------------------------ */
double krt_now_ms(void);                       /* a monotonic clock, in ms */
double krt_median(double *values, size_t n);   /* sorts values; 0 when n is 0 */

/* The command line of a standalone compiled program (kiln compile
 * --emit=exe): `--input NAME=FILE`, `--inputs-dir`, `--output-dir`,
 * `--device`, `--iters`; see --help.  Returns the exit status: 0, 1 for bad
 * input or a failed run, 2 for a bad command line.  Inputs are .npy files;
 * a .pb input is refused with a message saying how to read it
 * (krt_exe_main_pb of kilnrt_pb.h reads those too). */
int krt_exe_main(const krt_model_api *api, int argc, char **argv);

#endif /* KRT_KILNRT_H */
