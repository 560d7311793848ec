/* fake_libcuda.c - a stand-in libcuda.so.1 for testing the cuda device of
 * libkilnrt on a machine without a GPU.  "Device" memory is host memory, so
 * copies are memcpy; modules are text images ("cubin:sm_90", "ptx:..."),
 * recorded so the test can see which one was chosen; of the kernels only
 * `axpy` computes (on the CPU, through the same args array cuLaunchKernel
 * gets), `faults` leaves an asynchronous error for cuCtxSynchronize, and
 * `missing` does not exist.  Environment: FAKE_CUDA_NODEV=1 makes cuInit
 * fail, FAKE_CUDA_SM (default 90) sets the compute capability,
 * FAKE_CUDA_MEM (default 1 GiB) the memory.
 *
 * It mimics the driver's rules that libkilnrt must follow: the context must
 * be current, and more than 48 KiB of dynamic shared memory needs the
 * kernel's opt-in through cuFuncSetAttribute.
 *
 * CUDA Graphs follow the driver's capture rules: the legacy default stream
 * cannot be captured; while a stream captures, work enqueued on it is
 * recorded, not run, and a call that would synchronize or touch the legacy
 * stream (cuCtxSynchronize, the synchronous copies and memset, a launch on
 * stream 0, cuMemAlloc, an event query) fails with CUDA_ERROR_STREAM_CAPTURE_*
 * and invalidates the capture, so cuStreamEndCapture fails too.  The
 * fake cuBLAS libraries record their GEMMs through fake_cuda_defer. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#define EXPORT __attribute__((visibility("default")))

static struct CUctx_st {
  int refs;
} the_ctx;
static CUcontext current;
static size_t used;
static CUresult pending; /* asynchronous error for the next synchronize */
static char last_image[256];

struct CUmod_st {
  int dummy;
};
struct CUfunc_st {
  char name[64];
  int dyn_allowed;
};

/* a recorded piece of work: a kernel (by name, axpy's arguments kept), a
 * memset, or a library call deferred through fake_cuda_defer */
typedef struct {
  char name[64];
  float a;
  CUdeviceptr x, y;
  int n;
  size_t bytes;
  unsigned char value;
  void (*fn)(void *);
  void *data;
} fake_op;

typedef struct {
  fake_op *ops;
  int nops, cap;
} fake_ops;

struct CUstream_st {
  int id;
  int capturing, invalidated;
  fake_ops rec;
};
struct CUgraph_st {
  fake_ops rec;
};
struct CUgraphExec_st {
  fake_ops rec;
};
static struct CUstream_st *in_capture; /* the stream capturing, if any */
static long launches_run;              /* kernels the fake ran (launched or replayed) */

EXPORT long fake_cuda_launches_run(void) { return launches_run; }

void fake_gpu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static size_t mem_total(void) {
  const char *e = getenv("FAKE_CUDA_MEM");
  return e ? (size_t)strtoull(e, NULL, 10) : (size_t)1 << 30;
}

EXPORT const char *fake_cuda_last_image(void) { return last_image; }
EXPORT int fake_cuda_ctx_refs(void) { return the_ctx.refs; }
EXPORT size_t fake_cuda_used(void) { return used; }

EXPORT CUresult cuInit(unsigned flags) {
  (void)flags;
  return getenv("FAKE_CUDA_NODEV") ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

/* FAKE_CUDA_DRIVER: the CUDA version the driver supports (default 13000) */
EXPORT CUresult cuDriverGetVersion(int *v) {
  const char *e = getenv("FAKE_CUDA_DRIVER");
  *v = e ? atoi(e) : 13000;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
  *count = 1;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  (void)d;
  snprintf(name, (size_t)len, "Fake GPU");
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  const char *e = getenv("FAKE_CUDA_SM");
  int sm = e ? atoi(e) : 90;
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *v = sm / 10;
  else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *v = sm % 10;
  else return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  (void)d;
  the_ctx.refs++;
  *c = &the_ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  (void)d;
  if (the_ctx.refs <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  the_ctx.refs--;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  current = c;
  return CUDA_SUCCESS;
}

#define NEED_CTX \
  if (current != &the_ctx || the_ctx.refs <= 0) return CUDA_ERROR_INVALID_CONTEXT

/* A call not allowed while a stream captures: it fails, and so will the
 * capture's end. */
#define NOT_WHILE_CAPTURING(code)         \
  if (in_capture) {                       \
    in_capture->invalidated = 1;          \
    fake_gpu_log("capture invalidated by %s", __func__); \
    return code;                          \
  }

static int record(fake_ops *r, const fake_op *op) {
  if (r->nops == r->cap) {
    int cap = r->cap ? 2 * r->cap : 16;
    fake_op *o = realloc(r->ops, (size_t)cap * sizeof *o);
    if (!o) return -1;
    r->ops = o, r->cap = cap;
  }
  r->ops[r->nops++] = *op;
  return 0;
}

static void ops_free(fake_ops *r) {
  for (int i = 0; i < r->nops; i++) free(r->ops[i].data);
  free(r->ops);
  memset(r, 0, sizeof *r);
}

static void run_op(const fake_op *op);

/* 1 while a stream captures: the fake cuBLAS refuses to make a handle then
 * (a real one allocates its workspace, which a capture forbids). */
EXPORT int fake_cuda_in_capture(void) { return in_capture != NULL; }

/* Run fn(data) now, or record it when s captures (1: recorded). */
EXPORT int fake_cuda_defer(CUstream s, void (*fn)(void *), const void *data, size_t bytes) {
  if (!s || !s->capturing) return 0;
  fake_op op = {.fn = fn, .data = malloc(bytes ? bytes : 1), .bytes = bytes};
  snprintf(op.name, sizeof op.name, "library call");
  if (!op.data) return 0;
  memcpy(op.data, data, bytes);
  if (record(&s->rec, &op)) {
    free(op.data);
    return 0;
  }
  fake_gpu_log("capture stream=%d library call", s->id);
  return 1;
}

EXPORT CUresult cuCtxSynchronize(void) {
  NEED_CTX;
  NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUresult r = pending;
  pending = CUDA_SUCCESS;
  return r;
}

/* ---- streams and events, for the gradient exchange's ordering ------------
 * Work runs at once, so every event is complete when recorded; what the
 * fake keeps is the order of the calls, in the file FAKE_GPU_LOG (which
 * fake_libnccl.c appends to as well), one line per call. */
struct CUevent_st {
  int id, recorded, stream; /* stream 0: the default stream */
};
static int next_stream = 1, next_event = 1;

void fake_gpu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
EXPORT void fake_gpu_log(const char *fmt, ...) {
  const char *path = getenv("FAKE_GPU_LOG");
  FILE *f = path ? fopen(path, "a") : NULL;
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  NEED_CTX;
  if (flags != CU_STREAM_NON_BLOCKING && flags != CU_STREAM_DEFAULT) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *st = calloc(1, sizeof *st);
  if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
  st->id = next_stream++;
  *s = st;
  fake_gpu_log("cuStreamCreate stream=%d%s", st->id, flags == CU_STREAM_NON_BLOCKING ? " non-blocking" : "");
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  NEED_CTX;
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  fake_gpu_log("cuStreamDestroy stream=%d", s->id);
  if (in_capture == s) in_capture = NULL;
  ops_free(&s->rec);
  free(s);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  NEED_CTX;
  if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream */
  if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  if (s->capturing || in_capture) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = 1, s->invalidated = 0;
  in_capture = s;
  fake_gpu_log("cuStreamBeginCapture stream=%d", s->id);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
  NEED_CTX;
  if (!s || !s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = 0;
  in_capture = NULL;
  *graph = NULL;
  if (s->invalidated) {
    ops_free(&s->rec);
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  struct CUgraph_st *g = calloc(1, sizeof *g);
  if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
  g->rec = s->rec; /* the graph takes the recorded work */
  memset(&s->rec, 0, sizeof s->rec);
  fake_gpu_log("cuStreamEndCapture stream=%d ops=%d", s->id, g->rec.nops);
  *graph = g;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
  NEED_CTX;
  if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
  struct CUgraphExec_st *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < g->rec.nops; i++) {
    fake_op op = g->rec.ops[i];
    if (op.data) { /* its own copy: the graph may be destroyed first */
      void *copy = malloc(op.bytes ? op.bytes : 1);
      if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
      op.data = memcpy(copy, op.data, op.bytes);
    }
    if (record(&e->rec, &op)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *exec = e;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
  NEED_CTX;
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  ops_free(&g->rec);
  free(g);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  NEED_CTX;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  ops_free(&e->rec);
  free(e);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  NEED_CTX;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  if (s && s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  fake_gpu_log("cuGraphLaunch stream=%d ops=%d", s ? s->id : 0, e->rec.nops);
  for (int i = 0; i < e->rec.nops; i++) run_op(&e->rec.ops[i]);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
  NEED_CTX;
  (void)flags;
  struct CUevent_st *ev = calloc(1, sizeof *ev);
  if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
  ev->id = next_event++;
  *e = ev;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  NEED_CTX;
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  free(e);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  NEED_CTX;
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  e->recorded = 1, e->stream = s ? s->id : 0;
  fake_gpu_log("cuEventRecord event=%d stream=%d", e->id, e->stream);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e) {
  NEED_CTX;
  NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  fake_gpu_log("cuEventQuery event=%d", e->id);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
  NEED_CTX;
  if (!a || !b || !a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  *ms = 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  NEED_CTX;
  if (!e || flags) return CUDA_ERROR_INVALID_VALUE;
  if (!e->recorded) return CUDA_ERROR_INVALID_HANDLE; /* waiting on nothing: a bug */
  fake_gpu_log("cuStreamWaitEvent stream=%d event=%d (recorded on stream %d)", s ? s->id : 0, e->id, e->stream);
  return CUDA_SUCCESS;
}

/* Each allocation is preceded by its size, to keep `used` right. */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  NEED_CTX;
  NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > mem_total() - used) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t *b = aligned_alloc(256, 256 + ((bytes + 255) & ~(size_t)255));
  if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
  *b = bytes;
  used += bytes;
  *p = (CUdeviceptr)(size_t)((char *)b + 256);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX;
  size_t *b = (size_t *)((char *)(size_t)p - 256);
  used -= *b;
  free(b);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
  NEED_CTX;
  *total = mem_total();
  *free_b = *total - used;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  NEED_CTX;
  NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  if (pending) return pending;
  memcpy((void *)(size_t)dst, src, n);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  NEED_CTX;
  NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  if (pending) return pending;
  memcpy(dst, (const void *)(size_t)src, n);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  NEED_CTX;
  NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  memset((void *)(size_t)dst, v, n);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  NEED_CTX;
  if (!s && in_capture) NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  fake_op op = {.name = "memset", .y = dst, .bytes = n, .value = v};
  if (s && s->capturing) return record(&s->rec, &op) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
  run_op(&op);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned nopt,
                                   CUjit_option *opt, void **val) {
  NEED_CTX;
  const char *s = image;
  snprintf(last_image, sizeof last_image, "%s", s);
  if (strcmp(s, "ptx:bad") == 0) {
    for (unsigned i = 0; i < nopt; i++)
      if (opt[i] == CU_JIT_ERROR_LOG_BUFFER)
        snprintf(val[i], 64, "ptxas fatal: Unresolved extern function 'nope'");
    return CUDA_ERROR_INVALID_PTX;
  }
  if (strncmp(s, "cubin:", 6) != 0 && strncmp(s, "ptx:", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  /* the driver's rules: a cubin of the GPU's major version and a minor at
   * most its own; PTX whose .target is at most the GPU's */
  const char *e = getenv("FAKE_CUDA_SM");
  int gpu = e ? atoi(e) : 90, sm = 0;
  const char *t = strstr(s, ".target sm_");
  if (strncmp(s, "cubin:sm_", 9) == 0 && sscanf(s + 9, "%d", &sm) == 1 &&
      (sm / 10 != gpu / 10 || sm % 10 > gpu % 10))
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  if (strncmp(s, "ptx:", 4) == 0 && t && sscanf(t + 11, "%d", &sm) == 1 && sm > gpu)
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  /* and PTX of an ISA the driver knows: a driver for CUDA 12.x takes PTX
   * 8.x up to its own (12.4: 8.4; 12.6: 8.5, 12.8: 8.7, 12.9: 8.8), one for
   * 13.0 PTX 9.0; newer PTX (a newer toolkit's NVRTC) it refuses */
  int major, minor, drv;
  const char *ver = strstr(s, ".version ");
  cuDriverGetVersion(&drv);
  if (strncmp(s, "ptx:", 4) == 0 && ver && sscanf(ver + 9, "%d.%d", &major, &minor) == 2) {
    int dmaj = drv / 1000, dmin = drv % 1000 / 10, isa;
    if (dmaj >= 13) isa = 90 + (dmaj - 13) * 10 + dmin;
    else if (dmaj == 12) isa = 80 + (dmin <= 5 ? dmin : dmin - 1);
    else isa = 70 + dmin;
    if (major * 10 + minor > isa) return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
  }
  *m = calloc(1, sizeof **m);
  return *m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Functions belong to their module; the fake frees them with it by keeping
 * them in a small list. */
static struct CUfunc_st *funcs[64];
static int nfuncs;

EXPORT CUresult cuModuleUnload(CUmodule m) {
  NEED_CTX;
  free(m);
  for (int i = 0; i < nfuncs; i++) free(funcs[i]);
  nfuncs = 0;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  NEED_CTX;
  (void)m;
  if (strcmp(name, "missing") == 0 || nfuncs == 64) return CUDA_ERROR_NOT_FOUND;
  struct CUfunc_st *fn = calloc(1, sizeof *fn);
  if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
  snprintf(fn->name, sizeof fn->name, "%s", name);
  fn->dyn_allowed = 48 * 1024;
  funcs[nfuncs++] = fn;
  *f = fn;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  NEED_CTX;
  if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || v > 227 * 1024)
    return CUDA_ERROR_INVALID_VALUE;
  f->dyn_allowed = v;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream s,
                               void **args, void **extra) {
  NEED_CTX;
  (void)extra;
  if (!s && in_capture) NOT_WHILE_CAPTURING(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 ||
      (int)shared > f->dyn_allowed)
    return CUDA_ERROR_INVALID_VALUE;
  fake_op op;
  memset(&op, 0, sizeof op);
  snprintf(op.name, sizeof op.name, "%s", f->name);
  if (strcmp(f->name, "axpy") == 0) { /* the arguments' values, as a graph keeps them */
    op.a = *(float *)args[0];
    op.x = *(CUdeviceptr *)args[1];
    op.y = *(CUdeviceptr *)args[2];
    op.n = *(int *)args[3];
  }
  if (s && s->capturing) {
    fake_gpu_log("capture stream=%d kernel %s", s->id, f->name);
    return record(&s->rec, &op) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
  }
  run_op(&op);
  return CUDA_SUCCESS;
}

static void run_op(const fake_op *op) {
  if (op->fn) {
    op->fn(op->data);
  } else if (strcmp(op->name, "memset") == 0) {
    memset((void *)(size_t)op->y, op->value, op->bytes);
  } else {
    launches_run++;
    if (strcmp(op->name, "faults") == 0) {
      pending = CUDA_ERROR_ILLEGAL_ADDRESS;
    } else if (strcmp(op->name, "axpy") == 0) {
      const float *x = (const float *)(size_t)op->x;
      float *y = (float *)(size_t)op->y;
      for (int i = 0; i < op->n; i++) y[i] = op->a * x[i] + y[i];
    }
  }
}

EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
  case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
  case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
  case CUDA_ERROR_INVALID_PTX: *s = "CUDA_ERROR_INVALID_PTX"; break;
  case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: *s = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"; break;
  case CUDA_ERROR_ILLEGAL_STATE: *s = "CUDA_ERROR_ILLEGAL_STATE"; break;
  case CUDA_ERROR_NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
  default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
  switch (r) {
  case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
  case CUDA_ERROR_INVALID_PTX: *s = "a PTX JIT compilation failed"; break;
  case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
  case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    *s = "the provided PTX was compiled with an unsupported toolchain."; break;
  default: *s = "unknown error"; break;
  }
  return CUDA_SUCCESS;
}
