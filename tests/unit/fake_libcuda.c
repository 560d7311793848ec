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
 * kernel's opt-in through cuFuncSetAttribute. */
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

EXPORT CUresult cuCtxSynchronize(void) {
  NEED_CTX;
  CUresult r = pending;
  pending = CUDA_SUCCESS;
  return r;
}

/* ---- streams and events, for the gradient exchange's ordering ------------
 * Work runs at once, so every event is complete when recorded; what the
 * fake keeps is the order of the calls, in the file FAKE_GPU_LOG (which
 * fake_libnccl.c appends to as well), one line per call. */
struct CUstream_st {
  int id;
};
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
  struct CUstream_st *st = malloc(sizeof *st);
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
  free(s);
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
  if (pending) return pending;
  memcpy((void *)(size_t)dst, src, n);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  NEED_CTX;
  if (pending) return pending;
  memcpy(dst, (const void *)(size_t)src, n);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  NEED_CTX;
  memset((void *)(size_t)dst, v, n);
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
  (void)s;
  (void)extra;
  if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 ||
      (int)shared > f->dyn_allowed)
    return CUDA_ERROR_INVALID_VALUE;
  if (strcmp(f->name, "faults") == 0) {
    pending = CUDA_ERROR_ILLEGAL_ADDRESS;
  } else if (strcmp(f->name, "axpy") == 0) {
    float a = *(float *)args[0];
    const float *x = (const float *)(size_t) * (CUdeviceptr *)args[1];
    float *y = (float *)(size_t) * (CUdeviceptr *)args[2];
    int n = *(int *)args[3];
    for (int i = 0; i < n; i++) y[i] = a * x[i] + y[i];
  }
  return CUDA_SUCCESS;
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
  default: *s = "unknown error"; break;
  }
  return CUDA_SUCCESS;
}
