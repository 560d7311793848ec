/* device_cuda.c - the cuda device: a GPU through the CUDA driver API, GEMM
 * through cuBLAS.
 *
 * Neither library is linked.  libcuda.so.1 ships with the GPU driver, not
 * with the toolkit, so a program linked against it would not even start on a
 * machine without a GPU, where it should run on the host device instead.
 * Both are dlopen'ed: libcuda when a cuda device is opened, cuBLAS (hundreds
 * of MB) at the first krt_gemm.  cuda.h and cublas_api.h are included for
 * their types only, and every entry point is declared with __typeof__ of the
 * header's prototype so that a signature cannot drift from the ABI.  The
 * versioned names (cuMemAlloc_v2, ...) are the ones cuda.h's macros select;
 * the unversioned symbols are the old 32-bit ABI.
 *
 * The device uses the primary context: it is the one cuBLAS (through the
 * runtime API inside it) uses, so kernels, copies and GEMMs share memory.
 * Kernels, GEMMs and zeroing go to one stream of the device's own, which a
 * CUDA graph can capture (the legacy default stream cannot); it is a
 * blocking stream, so the synchronous copies on the legacy stream stay in
 * order with it without events.
 * Every entry point makes the context current first, since the caller may
 * use the device from any thread. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda.h>
#include <nccl.h>
#include <time.h>

#include "comm_impl.h"
#include "device_impl.h"

/* ---- loading the libraries ------------------------------------------------ */
#define CU_FUNCS(X)                                                                        \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute)                      \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent)           \
  X(cuCtxSynchronize) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemcpyHtoD_v2)                  \
  X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2) X(cuMemGetInfo_v2) X(cuModuleLoadDataEx)             \
  X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute) X(cuLaunchKernel)         \
  X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuStreamCreate) X(cuDriverGetVersion) \
  X(cuStreamDestroy_v2) X(cuMemsetD8Async) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture)  \
  X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)

#define BLAS_FUNCS(X)                                                                      \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasGemmStridedBatchedEx)                     \
  X(cublasGetStatusName) X(cublasGetStatusString) X(cublasSetStream_v2)

/* cuBLASLt: GEMMs with an epilogue (bias, relu, a separate C input) */
#define LT_FUNCS(X)                                                                        \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmulDescCreate)                         \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                           \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                             \
  X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmul) X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                 \
  X(cublasLtMatmulAlgoGetHeuristic)

/* The profiler's, resolved only when it is first used: a driver without
 * them still runs models. */
#define PROF_FUNCS(X)                                                                      \
  X(cuEventCreate) X(cuEventRecord) X(cuEventElapsedTime_v2) X(cuEventDestroy_v2)          \
  X(cuEventSynchronize) X(cuMemcpyDtoD_v2)

#define DECLARE(f) __typeof__(f) *f;
static struct {
  int loaded;
  CU_FUNCS(DECLARE)
} cu;
static struct {
  int loaded;
  BLAS_FUNCS(DECLARE)
} blas;
static struct {
  int loaded;
  LT_FUNCS(DECLARE)
} lt;
static struct {
  int loaded;
  PROF_FUNCS(DECLARE)
} prof;
static void *driver_lib; /* libcuda.so.1, once loaded */
#undef DECLARE

/* The libraries are loaded once per process and never closed: the driver
 * starts threads and registers exit handlers, and unloading it under them is
 * a known way to crash at exit. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* dlsym returns void *; converting it to a function pointer is what POSIX
 * requires to work, though ISO C leaves it undefined.  Going through memcpy
 * says so without a -Wpedantic warning. */
static int resolve(void *lib, const char *libname, const char *sym, void *fnptr, char *err,
                   size_t errlen) {
  void *p = dlsym(lib, sym);
  if (!p)
    return krt_err(err, errlen, "%s has no %s (driver or library too old for this program)",
                   libname, sym);
  memcpy(fnptr, &p, sizeof p);
  return 0;
}

static int load_driver(char *err, size_t errlen) {
  pthread_mutex_lock(&load_lock);
  int rc = 0;
  if (!cu.loaded) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      rc = krt_err(err, errlen, "no CUDA driver (libcuda.so.1 not found): %s", dlerror());
      goto out;
    }
#define RESOLVE(f) \
  if (rc == 0) rc = resolve(lib, "libcuda.so.1", #f, &cu.f, err, errlen);
    CU_FUNCS(RESOLVE)
#undef RESOLVE
    if (rc) {
      dlclose(lib); /* nothing of it was used */
      memset(&cu, 0, sizeof cu);
      goto out;
    }
    cu.loaded = 1;
    driver_lib = lib;
  }
out:
  pthread_mutex_unlock(&load_lock);
  return rc;
}

/* dlopen the first of `names` (NULL-terminated) that loads: the versioned
 * names of the ABI range this file was written against, newest first, then
 * the unversioned one a developer install provides, then the toolkit's own
 * folder for an install not on the loader's path; NULL with err set (every
 * name tried) when none does. */
static void *open_first(const char *const *names, const char *what, char *err, size_t errlen) {
  void *lib = NULL;
  char first_error[256] = "", tried[512] = "";
  for (size_t i = 0; names[i] && !lib; i++) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib && i == 0) snprintf(first_error, sizeof first_error, "%s", dlerror());
    size_t k = strlen(tried);
    if (!lib) snprintf(tried + k, sizeof tried - k, "%s%s", k ? ", " : "", names[i]);
  }
  if (!lib) krt_err(err, errlen, "%s not found (tried %s): %s", what, tried, first_error);
  return lib;
}

/* One library's entry points, by name, into the struct that holds them. */
typedef struct {
  const char *name;
  void *fnptr;
} entry;

/* Load a library (names as for open_first) and resolve its entries once;
 * on failure nothing is kept (*state zeroed, the library closed). */
static int load_library(const char *const *names, const char *what, const char *libname,
                        const entry *entries, size_t n, int *loaded, void *state, size_t size,
                        char *err, size_t errlen) {
  pthread_mutex_lock(&load_lock);
  int rc = 0;
  if (!*loaded) {
    void *lib = open_first(names, what, err, errlen);
    rc = lib ? 0 : -1;
    for (size_t i = 0; i < n && rc == 0; i++)
      rc = resolve(lib, libname, entries[i].name, entries[i].fnptr, err, errlen);
    if (rc && lib) dlclose(lib);
    if (rc) memset(state, 0, size);
    else *loaded = 1;
  }
  pthread_mutex_unlock(&load_lock);
  return rc;
}

static int load_cublas(char *err, size_t errlen) {
  /* the GEMM and cuBLASLt entry points used here are the same in 12 and 13 */
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                      "/usr/local/cuda/lib64/libcublas.so.13",
                                      "/usr/local/cuda/lib64/libcublas.so.12", NULL};
#define ENTRY(f) {#f, &blas.f},
  static const entry entries[] = {BLAS_FUNCS(ENTRY)};
#undef ENTRY
  return load_library(names, "cuBLAS 12 or 13", "libcublas", entries, sizeof entries / sizeof *entries,
                      &blas.loaded, &blas, sizeof blas, err, errlen);
}

static int load_cublaslt(char *err, size_t errlen) {
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                                      "/usr/local/cuda/lib64/libcublasLt.so.13",
                                      "/usr/local/cuda/lib64/libcublasLt.so.12", NULL};
#define ENTRY(f) {#f, &lt.f},
  static const entry entries[] = {LT_FUNCS(ENTRY)};
#undef ENTRY
  return load_library(names, "cuBLASLt 12 or 13", "libcublasLt", entries, sizeof entries / sizeof *entries,
                      &lt.loaded, &lt, sizeof lt, err, errlen);
}

static int load_profiler(char *err, size_t errlen) {
  pthread_mutex_lock(&load_lock);
  int rc = 0;
  if (!prof.loaded) {
#define RESOLVE(f) \
  if (rc == 0) rc = resolve(driver_lib, "libcuda.so.1", #f, &prof.f, err, errlen);
    PROF_FUNCS(RESOLVE)
#undef RESOLVE
    if (rc) memset(&prof, 0, sizeof prof);
    else prof.loaded = 1;
  }
  pthread_mutex_unlock(&load_lock);
  return rc;
}

/* ---- errors -------------------------------------------------------------- */
/* "<what>: CUDA_ERROR_X (description)", what naming the call and its kernel
 * or sizes. */
static int cu_fail(CUresult r, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int cu_fail(CUresult r, char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return -1;
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const char *name = NULL, *desc = NULL;
  if (cu.cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = NULL;
  if (cu.cuGetErrorString(r, &desc) != CUDA_SUCCESS || !desc) desc = "unknown error";
  if (name)
    snprintf(err, errlen, "%s: %s (%s)", what, name, desc);
  else
    snprintf(err, errlen, "%s: CUDA error %d (%s)", what, (int)r, desc);
  return -1;
}

/* ---- the device ------------------------------------------------------------ */
typedef struct {
  CUdevice dev;
  CUcontext ctx;
  int sm;                  /* 90 for compute capability 9.0 */
  cublasHandle_t blas;     /* created at the first krt_gemm */
  cublasLtHandle_t lt;     /* ... with an epilogue */
  CUstream stream;         /* everything enqueued; captured into graphs */
  char last_kernel[128];   /* for asynchronous errors seen at a synchronize */
  struct cuda_nccl *nccl;  /* data-parallel: made at the first exchange */
  struct lt_site *sites;   /* cuBLASLt call sites seen (cuda_gemm_lt) */
  int nsites;
  CUdeviceptr workspace;   /* cuBLASLt's, made at its first call */
  size_t workspace_bytes;
} cuda_dev;

static void lt_sites_free(cuda_dev *c);

static void nccl_free(cuda_dev *c);

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

static int use_ctx(cuda_dev *c, char *err, size_t errlen) {
  CUresult r = cu.cuCtxSetCurrent(c->ctx);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuCtxSetCurrent");
}

static int cuda_open(krt_device *d, char *err, size_t errlen) {
  if (load_driver(err, errlen)) return -1;
  CUresult r = cu.cuInit(0);
  if (r != CUDA_SUCCESS) return cu_fail(r, err, errlen, "cuInit");
  /* The GPU code NVRTC built here, and cuBLAS, need a driver of this
   * toolkit's major version or newer: say so, rather than fail later at a
   * module load with CUDA_ERROR_UNSUPPORTED_PTX_VERSION. */
  int driver = 0;
  if ((r = cu.cuDriverGetVersion(&driver)) != CUDA_SUCCESS) return cu_fail(r, err, errlen, "cuDriverGetVersion");
  if (driver / 1000 < CUDA_VERSION / 1000)
    return krt_err(err, errlen, "the GPU driver supports CUDA %d.%d; this program was built with CUDA %d.%d "
                   "and needs a driver for CUDA %d or newer (update the NVIDIA driver)",
                   driver / 1000, driver % 1000 / 10, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10,
                   CUDA_VERSION / 1000);
  cuda_dev *c = calloc(1, sizeof *c);
  if (!c) return krt_err(err, errlen, "krt_device_open: out of memory");
  int major = 0, minor = 0;
  char gpu[128] = "";
  /* a rank of a data-parallel run takes its node-local GPU */
  int ordinal = 0, count = 0;
  static const char *const local[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                      "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof local / sizeof *local && !ordinal; i++)
    if (getenv(local[i])) ordinal = atoi(getenv(local[i]));
  if (ordinal > 0 && cu.cuDeviceGetCount(&count) == CUDA_SUCCESS && count > 0) ordinal %= count;
  if ((r = cu.cuDeviceGet(&c->dev, ordinal)) != CUDA_SUCCESS) {
    cu_fail(r, err, errlen, "cuDeviceGet(%d)", ordinal);
    goto fail;
  }
  if ((r = cu.cuDeviceGetName(gpu, (int)sizeof gpu, c->dev)) != CUDA_SUCCESS) {
    cu_fail(r, err, errlen, "cuDeviceGetName");
    goto fail;
  }
  if ((r = cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                   c->dev)) != CUDA_SUCCESS ||
      (r = cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                   c->dev)) != CUDA_SUCCESS) {
    cu_fail(r, err, errlen, "cuDeviceGetAttribute(compute capability) on %s", gpu);
    goto fail;
  }
  c->sm = major * 10 + minor;
  if ((r = cu.cuDevicePrimaryCtxRetain(&c->ctx, c->dev)) != CUDA_SUCCESS) {
    cu_fail(r, err, errlen, "cuDevicePrimaryCtxRetain on %s", gpu);
    goto fail;
  }
  if (use_ctx(c, err, errlen)) {
    cu.cuDevicePrimaryCtxRelease_v2(c->dev);
    goto fail;
  }
  if ((r = cu.cuStreamCreate(&c->stream, CU_STREAM_DEFAULT)) != CUDA_SUCCESS) {
    cu_fail(r, err, errlen, "cuStreamCreate on %s", gpu);
    cu.cuDevicePrimaryCtxRelease_v2(c->dev);
    goto fail;
  }
  snprintf(d->name, sizeof d->name, "cuda: %s", gpu);
  d->priv = c;
  d->sm = c->sm;
  return 0;
fail:
  free(c);
  return -1;
}

static void cuda_close(krt_device *d) {
  cuda_dev *c = d->priv;
  if (c->blas && use_ctx(c, NULL, 0) == 0) blas.cublasDestroy_v2(c->blas);
  if (c->sites && use_ctx(c, NULL, 0) == 0) lt_sites_free(c);
  if (c->lt && use_ctx(c, NULL, 0) == 0) lt.cublasLtDestroy(c->lt);
  if (c->workspace && use_ctx(c, NULL, 0) == 0) cu.cuMemFree_v2(c->workspace);
  if (c->nccl && use_ctx(c, NULL, 0) == 0) nccl_free(c);
  if (c->stream && use_ctx(c, NULL, 0) == 0) cu.cuStreamDestroy_v2(c->stream);
  /* Releasing the last reference destroys the context and with it every
   * allocation and module still in it. */
  cu.cuDevicePrimaryCtxRelease_v2(c->dev);
  free(c);
  d->priv = NULL;
}

static int cuda_alloc(krt_device *d, size_t bytes, void **ptr, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUdeviceptr p = 0;
  CUresult r = cu.cuMemAlloc_v2(&p, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    size_t free_b = 0, total_b = 0;
    if (cu.cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS)
      return krt_err(err, errlen,
                     "cuMemAlloc: out of GPU memory on %s: %zu bytes (%.1f MiB) asked, "
                     "%zu bytes (%.1f MiB) free of %zu (%.1f MiB) (CUDA_ERROR_OUT_OF_MEMORY)",
                     d->name, bytes, (double)bytes / 1048576.0, free_b,
                     (double)free_b / 1048576.0, total_b, (double)total_b / 1048576.0);
  }
  if (r != CUDA_SUCCESS) return cu_fail(r, err, errlen, "cuMemAlloc of %zu bytes", bytes);
  *ptr = (void *)(uintptr_t)p;
  return 0;
}

/* krt_free cannot report: an error here means the context is already broken,
 * and the next synchronize or copy says so. */
static void cuda_release(krt_device *d, void *ptr) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, NULL, 0) == 0) cu.cuMemFree_v2(dptr(ptr));
}

static int cuda_upload(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                       size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUresult r = cu.cuMemcpyHtoD_v2(dptr(dst), src, bytes);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuMemcpyHtoD of %zu bytes", bytes);
}

static int cuda_download(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                         size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUresult r = cu.cuMemcpyDtoH_v2(dst, dptr(src), bytes);
  if (r == CUDA_SUCCESS) return 0;
  /* A copy waits for earlier kernels, so it is often where their faults
   * surface. */
  return cu_fail(r, err, errlen, "cuMemcpyDtoH of %zu bytes%s%s%s", bytes,
                 c->last_kernel[0] ? " (after " : "", c->last_kernel,
                 c->last_kernel[0] ? ")" : "");
}

static int cuda_memset_zero(krt_device *d, void *dst, size_t bytes, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUresult r = cu.cuMemsetD8Async(dptr(dst), 0, bytes, c->stream);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuMemsetD8Async of %zu bytes", bytes);
}

static int cuda_synchronize(krt_device *d, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUresult r = cu.cuCtxSynchronize();
  if (r == CUDA_SUCCESS) return 0;
  return cu_fail(r, err, errlen, "cuCtxSynchronize%s%s%s",
                 c->last_kernel[0] ? " (last launch: " : "", c->last_kernel,
                 c->last_kernel[0] ? ")" : "");
}

/* ---- modules --------------------------------------------------------------- */
typedef struct {
  CUmodule mod;
  CUfunction *fn;
  int *dyn_allowed; /* dynamic shared bytes each kernel has been opted in to */
} cuda_module;

/* Load one image; for PTX, the JIT's log goes into the message. */
static int load_image(cuda_dev *c, CUmodule *mod, const void *image, const char *what, char *err,
                      size_t errlen) {
  char log[2048] = "";
  CUjit_option opt[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *val[] = {log, (void *)(uintptr_t)sizeof log};
  CUresult r = cu.cuModuleLoadDataEx(mod, image, 2, opt, val);
  if (r == CUDA_SUCCESS) return 0;
  log[sizeof log - 1] = '\0';
  cu_fail(r, err, errlen, "cuModuleLoadDataEx(%s for sm_%d)", what, c->sm);
  if (log[0] && err) {
    size_t n = strlen(err);
    if (n + 1 < errlen) snprintf(err + n, errlen - n, "\n%s", log);
  }
  return -1;
}

static void cuda_module_unload(krt_module *m) {
  cuda_module *cm = m->priv;
  cuda_dev *c = m->dev->priv;
  if (cm->mod && use_ctx(c, NULL, 0) == 0) cu.cuModuleUnload(cm->mod);
  free(cm->fn);
  free(cm->dyn_allowed);
  free(cm);
  m->priv = NULL;
}

static int cuda_module_load(krt_module *m, const krt_module_desc *desc, char *err,
                            size_t errlen) {
  cuda_dev *c = m->dev->priv;
  if (use_ctx(c, err, errlen)) return -1;
  cuda_module *cm = calloc(1, sizeof *cm);
  size_t n = m->nkernels ? (size_t)m->nkernels : 1;
  if (cm) {
    cm->fn = calloc(n, sizeof *cm->fn);
    cm->dyn_allowed = calloc(n, sizeof *cm->dyn_allowed);
  }
  if (!cm || !cm->fn || !cm->dyn_allowed) {
    if (cm) {
      free(cm->fn);
      free(cm->dyn_allowed);
    }
    free(cm);
    return krt_err(err, errlen, "krt_module_load: out of memory");
  }
  m->priv = cm;
  /* The image by the driver's rules (krt_pick_image); a cubin's size is not
   * needed: it is an ELF image that carries its own length. */
  int pick = krt_pick_image(c->sm, desc->cubins, desc->ncubins, desc->ptx);
  const krt_cubin *cubin = pick >= 0 ? &desc->cubins[pick] : NULL;
  int rc = -1;
  if (cubin) rc = load_image(c, &cm->mod, cubin->data, "cubin", err, errlen);
  /* (a cubin the driver refuses after all: the PTX, when it may run) */
  if (rc && desc->ptx && krt_ptx_target(desc->ptx) <= c->sm)
    rc = load_image(c, &cm->mod, desc->ptx, "PTX", err, errlen);
  if (rc && pick == -2) {
    char have[256] = "";
    size_t len = 0;
    for (int i = 0; i < desc->ncubins && len + 16 < sizeof have; i++)
      len += (size_t)snprintf(have + len, sizeof have - len, "%ssm_%d", i ? ", " : "",
                              desc->cubins[i].sm);
    char ptx[64] = "no PTX";
    if (desc->ptx) snprintf(ptx, sizeof ptx, "PTX for compute_%d", krt_ptx_target(desc->ptx));
    krt_err(err, errlen,
            "no code for this GPU (%s, sm_%d): the program has cubins for %s and %s; "
            "compile it for sm_%d",
            m->dev->name, c->sm, len ? have : "no architecture", ptx, c->sm);
  }
  if (rc) goto fail;
  for (int i = 0; i < m->nkernels; i++) {
    CUresult r = cu.cuModuleGetFunction(&cm->fn[i], cm->mod, m->names[i]);
    if (r != CUDA_SUCCESS) {
      cu_fail(r, err, errlen, "cuModuleGetFunction(kernel %s)", m->names[i]);
      goto fail;
    }
  }
  return 0;
fail:
  cuda_module_unload(m);
  return -1;
}

/* ---- which image a GPU runs ------------------------------------------------
 * The driver's rules: a cubin built for sm_XY runs on a GPU of the same
 * major version X and a minor of Y or above (sm_80's runs on an sm_86 or
 * sm_89 card, never on sm_90); PTX for compute_XY is compiled by the
 * driver for any GPU of XY or above, at a cost paid at every load. */
int krt_ptx_target(const char *ptx) {
  const char *t = ptx ? strstr(ptx, ".target sm_") : NULL;
  int sm = 0;
  if (t) sscanf(t + 11, "%d", &sm);
  return sm; /* 0: none said, which any GPU takes */
}

int krt_pick_image(int sm, const krt_cubin *cubins, int n, const char *ptx) {
  int best = -1;
  for (int i = 0; i < n; i++) {
    int s = cubins[i].sm;
    if (!cubins[i].data || s / 10 != sm / 10 || s % 10 > sm % 10) continue;
    if (best < 0 || s > cubins[best].sm) best = i;
  }
  if (best >= 0) return best;
  return ptx && krt_ptx_target(ptx) <= sm ? -1 : -2;
}

/* Above 48 KiB of dynamic shared memory a kernel must opt in, once. */
#define CUDA_DEFAULT_DYN_SHARED (48u * 1024u)

static int cuda_launch(krt_module *m, int index, krt_dim3 grid, krt_dim3 block,
                       size_t dyn_shared, void **args, char *err, size_t errlen) {
  cuda_module *cm = m->priv;
  cuda_dev *c = m->dev->priv;
  const char *name = m->names[index];
  if (use_ctx(c, err, errlen)) return -1;
  if (dyn_shared > (size_t)0x7fffffff)
    return krt_err(err, errlen, "kernel %s: %zu bytes of dynamic shared memory", name,
                   dyn_shared);
  if (dyn_shared > CUDA_DEFAULT_DYN_SHARED && (int)dyn_shared > cm->dyn_allowed[index]) {
    CUresult r = cu.cuFuncSetAttribute(cm->fn[index],
                                       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       (int)dyn_shared);
    if (r != CUDA_SUCCESS)
      return cu_fail(r, err, errlen,
                     "cuFuncSetAttribute(kernel %s, max dynamic shared = %zu bytes)", name,
                     dyn_shared);
    cm->dyn_allowed[index] = (int)dyn_shared;
  }
  snprintf(c->last_kernel, sizeof c->last_kernel, "kernel %s", name);
  CUresult r = cu.cuLaunchKernel(cm->fn[index], grid.x, grid.y, grid.z, block.x, block.y,
                                 block.z, (unsigned)dyn_shared, c->stream, args, NULL);
  if (r == CUDA_SUCCESS) return 0;
  return cu_fail(r, err, errlen,
                 "cuLaunchKernel(kernel %s, grid (%u,%u,%u), block (%u,%u,%u), %zu bytes "
                 "dynamic shared)",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z, dyn_shared);
}

/* ---- GEMM -------------------------------------------------------------------- */
static int blas_fail(cublasStatus_t s, char *err, size_t errlen, const char *what) {
  return krt_err(err, errlen, "%s: %s (%s)", what, blas.cublasGetStatusName(s),
                 blas.cublasGetStatusString(s));
}

/* ---- cuBLASLt: a GEMM with its epilogue ----------------------------------
 * One cublasLtMatmul: D = act(alpha * op(B)^T op(A)^T + beta * C_in^T +
 * bias), column-major as below, the bias one value per row of D^T, i.e.
 * per column of our row-major C.
 *
 * Each call site's descriptors and the algorithm are made once, at its
 * first call (a compiled model's warm-up run), and kept: a site is the
 * whole krt_gemm_desc, pointers included, which a compiled call repeats
 * every run.  The heuristic is told how the operands are really aligned
 * (a GEMM on a view starts at any element; by default cuBLASLt assumes 256
 * bytes and refuses, CUBLAS_STATUS_NOT_SUPPORTED, what is not) and how
 * much workspace there is: LT_WORKSPACE, made at the first call. */
enum { LT_SITES = 1024 };
#define LT_WORKSPACE ((size_t)32 << 20)

typedef struct lt_site {
  krt_gemm_desc key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc, ld;
  cublasLtMatmulAlgo_t algo;
} lt_site;

static bool same_gemm(const krt_gemm_desc *x, const krt_gemm_desc *y) {
  return x->dtype == y->dtype && x->trans_a == y->trans_a && x->trans_b == y->trans_b &&
         x->m == y->m && x->n == y->n && x->k == y->k && x->batch == y->batch && x->a == y->a &&
         x->lda == y->lda && x->stride_a == y->stride_a && x->b == y->b && x->ldb == y->ldb &&
         x->stride_b == y->stride_b && x->c == y->c && x->ldc == y->ldc &&
         x->stride_c == y->stride_c && x->c_in == y->c_in && x->bias == y->bias && x->relu == y->relu;
}

static void lt_site_free(lt_site *s) {
  if (s->ld) lt.cublasLtMatrixLayoutDestroy(s->ld);
  if (s->lc) lt.cublasLtMatrixLayoutDestroy(s->lc);
  if (s->lb) lt.cublasLtMatrixLayoutDestroy(s->lb);
  if (s->la) lt.cublasLtMatrixLayoutDestroy(s->la);
  if (s->op) lt.cublasLtMatmulDescDestroy(s->op);
  memset(s, 0, sizeof *s);
}

static void lt_sites_free(cuda_dev *c) {
  for (int i = 0; i < c->nsites; i++) lt_site_free(&c->sites[i]);
  free(c->sites);
  c->sites = NULL;
  c->nsites = 0;
}

/* The largest power of two (at most 256) the address is a multiple of. */
static uint32_t alignment_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

/* A layout of cuBLASLt: rows x cols column-major at ld, `batch` of them
 * `stride` elements apart. */
static cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, cudaDataType t, int64_t rows,
                                int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasStatus_t s = lt.cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
  int32_t count = (int32_t)batch;
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
    s = lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                            sizeof count);
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
    s = lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride);
  return s;
}

/* Make site s for g: descriptors, then the heuristic's algorithm for the
 * operands' alignments and the workspace; *what names the call that
 * failed. */
static cublasStatus_t lt_site_make(cuda_dev *c, lt_site *s, const krt_gemm_desc *g, cudaDataType t,
                                   cublasComputeType_t compute, cudaDataType scale, const char **what) {
  memset(s, 0, sizeof *s);
  s->key = *g;
  cublasOperation_t ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                    tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = g->bias ? (g->relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                   : (g->relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  *what = "cublasLtMatmulDescCreate";
  cublasStatus_t st = lt.cublasLtMatmulDescCreate(&s->op, compute, scale);
  if (st == CUBLAS_STATUS_SUCCESS)
    *what = "cublasLtMatmulDescSetAttribute",
    st = lt.cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  if (st == CUBLAS_STATUS_SUCCESS && g->bias)
    st = lt.cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                           sizeof g->bias);
  /* our B is cuBLAS's A: n x k (or k x n transposed), and our A its B */
  if (st == CUBLAS_STATUS_SUCCESS)
    *what = "cublasLtMatrixLayoutCreate",
    st = lt_layout(&s->la, t, g->trans_b ? g->k : g->n, g->trans_b ? g->n : g->k, g->ldb, g->batch,
                   g->stride_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt_layout(&s->lb, t, g->trans_a ? g->m : g->k, g->trans_a ? g->k : g->m, g->lda, g->batch,
                   g->stride_a);
  if (st == CUBLAS_STATUS_SUCCESS) st = lt_layout(&s->lc, t, g->n, g->m, g->ldc, g->batch, g->stride_c);
  if (st == CUBLAS_STATUS_SUCCESS) st = lt_layout(&s->ld, t, g->n, g->m, g->ldc, g->batch, g->stride_c);
  /* cuBLAS's A, B, C, D are our b, a, c_in (or c), c */
  uint32_t al[4] = {alignment_of(g->b), alignment_of(g->a), alignment_of(g->c_in ? g->c_in : g->c),
                    alignment_of(g->c)};
  uint64_t ws = c->workspace_bytes;
  cublasLtMatmulPreference_t pref = NULL;
  if (st == CUBLAS_STATUS_SUCCESS)
    *what = "cublasLtMatmulPreference", st = lt.cublasLtMatmulPreferenceCreate(&pref);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                 sizeof ws);
  static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
    st = lt.cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al[i], sizeof al[i]);
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  memset(&result, 0, sizeof result);
  if (st == CUBLAS_STATUS_SUCCESS)
    *what = "cublasLtMatmulAlgoGetHeuristic",
    st = lt.cublasLtMatmulAlgoGetHeuristic(c->lt, s->op, s->la, s->lb, s->lc, s->ld, pref, 1, &result,
                                           &found);
  if (pref) lt.cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found < 1) st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (st == CUBLAS_STATUS_SUCCESS) s->algo = result.algo;
  else lt_site_free(s);
  return st;
}

static int cuda_gemm_lt(cuda_dev *c, const krt_gemm_desc *g, cudaDataType t,
                        cublasComputeType_t compute, cudaDataType scale, const void *alpha,
                        const void *beta, char *err, size_t errlen) {
  if (!c->lt) {
    if (load_cublaslt(err, errlen)) return -1;
    cublasStatus_t s = lt.cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
      c->lt = NULL;
      return blas_fail(s, err, errlen, "cublasLtCreate");
    }
    /* without the workspace, the algorithms that need none */
    if (cu.cuMemAlloc_v2(&c->workspace, LT_WORKSPACE) == CUDA_SUCCESS) c->workspace_bytes = LT_WORKSPACE;
    else c->workspace = 0;
  }
  lt_site *site = NULL, once;
  for (int i = 0; i < c->nsites && !site; i++)
    if (same_gemm(&c->sites[i].key, g)) site = &c->sites[i];
  const char *what = "cublasLtMatmul";
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (!site) {
    if (!c->sites && !(c->sites = calloc(LT_SITES, sizeof *c->sites)))
      return krt_err(err, errlen, "krt_gemm: out of memory");
    /* past LT_SITES call sites, the descriptors are made for the call */
    site = c->nsites < LT_SITES ? &c->sites[c->nsites] : &once;
    s = lt_site_make(c, site, g, t, compute, scale, &what);
    if (s == CUBLAS_STATUS_SUCCESS && site != &once) c->nsites++;
  }
  if (s == CUBLAS_STATUS_SUCCESS)
    what = "cublasLtMatmul",
    s = lt.cublasLtMatmul(c->lt, site->op, alpha, g->b, site->la, g->a, site->lb, beta,
                          g->c_in ? g->c_in : g->c, site->lc, g->c, site->ld, &site->algo,
                          (void *)(uintptr_t)c->workspace, c->workspace_bytes, (cudaStream_t)c->stream);
  if (site == &once) lt_site_free(&once);
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char msg[300];
  snprintf(msg, sizeof msg, "%s(%s, m=%lld n=%lld k=%lld batch=%lld, epilogue%s%s%s; alignment a %u, b %u, c %u)",
           what, krt_dtype_name(g->dtype), (long long)g->m, (long long)g->n, (long long)g->k,
           (long long)g->batch, g->bias ? " bias" : "", g->relu ? " relu" : "", g->c_in ? " c_in" : "",
           alignment_of(g->a), alignment_of(g->b), alignment_of(g->c));
  return blas_fail(s, err, errlen, msg);
}

/* cuBLAS is column-major.  A row-major m x n matrix is the same bytes as a
 * column-major n x m one, its transpose, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T: swap the operands and m with n, keep the flags. */
static int cuda_gemm(krt_device *d, const krt_gemm_desc *g, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  if (!c->blas) {
    if (load_cublas(err, errlen)) return -1;
    cublasStatus_t s = blas.cublasCreate_v2(&c->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
      c->blas = NULL;
      return blas_fail(s, err, errlen, "cublasCreate");
    }
    if ((s = blas.cublasSetStream_v2(c->blas, (cudaStream_t)c->stream)) != CUBLAS_STATUS_SUCCESS)
      return blas_fail(s, err, errlen, "cublasSetStream");
  }
  cudaDataType t;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  float alpha32 = (float)g->alpha, beta32 = (float)g->beta;
  const void *alpha = &alpha32, *beta = &beta32;
  switch (g->dtype) {
  case KRT_F32: t = CUDA_R_32F; break;
  case KRT_F16: t = CUDA_R_16F; break;
  case KRT_BF16: t = CUDA_R_16BF; break;
  case KRT_F64:
    t = CUDA_R_64F;
    compute = CUBLAS_COMPUTE_64F;
    alpha = &g->alpha; /* the scale type follows the compute type */
    beta = &g->beta;
    break;
  default:
    return krt_err(err, errlen, "krt_gemm: dtype %s is not supported on cuda",
                   krt_dtype_name(g->dtype));
  }
  if (g->bias || g->relu || (g->c_in && g->c_in != g->c))
    return cuda_gemm_lt(c, g, t, compute, g->dtype == KRT_F64 ? CUDA_R_64F : CUDA_R_32F, alpha,
                        beta, err, errlen);
  cublasStatus_t s = blas.cublasGemmStridedBatchedEx(
      c->blas, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      (int)g->n, (int)g->m, (int)g->k, alpha, g->b, t, (int)g->ldb, g->stride_b, g->a, t,
      (int)g->lda, g->stride_a, beta, g->c, t, (int)g->ldc, g->stride_c, (int)g->batch, compute,
      CUBLAS_GEMM_DEFAULT);
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char what[160];
  snprintf(what, sizeof what, "cublasGemmStridedBatchedEx(%s, m=%lld n=%lld k=%lld batch=%lld)",
           krt_dtype_name(g->dtype), (long long)g->m, (long long)g->n, (long long)g->k,
           (long long)g->batch);
  return blas_fail(s, err, errlen, what);
}

/* ---- the profiler: an event per mark, on the device's stream ----------- */
static int cuda_mark(krt_device *d, int i, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen) || load_profiler(err, errlen)) return -1;
  CUresult r = CUDA_SUCCESS;
  if (!d->mark_events[i]) {
    CUevent ev = NULL;
    r = prof.cuEventCreate(&ev, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) return cu_fail(r, err, errlen, "cuEventCreate (profiler)");
    d->mark_events[i] = ev;
  }
  r = prof.cuEventRecord((CUevent)d->mark_events[i], c->stream);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuEventRecord (profiler)");
}

static int cuda_between(krt_device *d, int from, int to, double *ms, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  if (!d->mark_events[from] || !d->mark_events[to])
    return krt_err(err, errlen, "profiler: mark %d or %d was never recorded", from, to);
  float f = 0;
  CUresult r = prof.cuEventSynchronize((CUevent)d->mark_events[to]);
  if (r == CUDA_SUCCESS)
    r = prof.cuEventElapsedTime_v2(&f, (CUevent)d->mark_events[from], (CUevent)d->mark_events[to]);
  *ms = f;
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuEventElapsedTime (profiler)");
}

static void cuda_marks_free(krt_device *d) {
  cuda_dev *c = d->priv;
  if (!d->mark_events || !prof.loaded || use_ctx(c, NULL, 0)) return;
  for (int i = 0; i < d->nmarks; i++)
    if (d->mark_events[i]) prof.cuEventDestroy_v2((CUevent)d->mark_events[i]);
}

static int cuda_copy(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                     size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen) || load_profiler(err, errlen)) return -1;
  CUresult r = prof.cuMemcpyDtoD_v2(dptr(dst), dptr(src), bytes);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuMemcpyDtoD");
}

/* ---- NCCL: a data-parallel step's gradient exchange ----------------------
 * libnccl.so.2 is loaded at the first exchange, like cuBLAS.  Rank 0's
 * NCCL id reaches the others through the communicator (MPI).  Each bucket
 * is summed on a stream of its own: an event recorded on the device's
 * stream after the bucket's gradients orders the exchange after them, and
 * an event recorded after it orders the first reader of the sums (at
 * krt_all_reduce_wait) after the exchange; the backward kernels between
 * run meanwhile.  The wait polls that event up to the communicator's
 * timeout, and NCCL's asynchronous errors with it. */
#define STREAM_FUNCS(X)                                                                    \
  X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamWaitEvent) X(cuEventCreate)            \
  X(cuEventRecord) X(cuEventQuery) X(cuEventDestroy_v2) X(cuEventElapsedTime_v2)
#define NCCL_FUNCS(X)                                                                      \
  X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclAllReduce) X(ncclGroupStart) X(ncclGroupEnd) \
  X(ncclCommDestroy) X(ncclCommAbort) X(ncclGetErrorString) X(ncclCommGetAsyncError)

#define DECLARE(f) __typeof__(f) *f;
static struct {
  int loaded;
  STREAM_FUNCS(DECLARE)
} st;
static struct {
  int loaded;
  NCCL_FUNCS(DECLARE)
} nc;
#undef DECLARE

enum { NCCL_MAX_BUCKETS = 4096 };

struct cuda_nccl {
  ncclComm_t comm;
  CUstream stream;
  CUevent ready[NCCL_MAX_BUCKETS], done[NCCL_MAX_BUCKETS];
  char started[NCCL_MAX_BUCKETS];
};

static int load_nccl(char *err, size_t errlen) {
  pthread_mutex_lock(&load_lock);
  int rc = 0;
  if (!st.loaded) {
#define RESOLVE(f) \
  if (rc == 0) rc = resolve(driver_lib, "libcuda.so.1", #f, &st.f, err, errlen);
    STREAM_FUNCS(RESOLVE)
#undef RESOLVE
    if (rc) memset(&st, 0, sizeof st);
    else st.loaded = 1;
  }
  pthread_mutex_unlock(&load_lock);
  if (rc) return -1;
  /* KILN_NCCL_LIBRARY names another build (and lets the tests name none) */
  const char *own = getenv("KILN_NCCL_LIBRARY");
  const char *const names[] = {own && *own ? own : "libnccl.so.2", own && *own ? NULL : "libnccl.so",
                               "/usr/local/cuda/lib/libnccl.so.2", NULL};
#define ENTRY(f) {#f, &nc.f},
  static const entry entries[] = {NCCL_FUNCS(ENTRY)};
#undef ENTRY
  return load_library(names, "NCCL (the data-parallel gradient exchange on GPUs)", "libnccl", entries,
                      sizeof entries / sizeof *entries, &nc.loaded, &nc, sizeof nc, err, errlen);
}

static int nccl_fail(ncclResult_t r, const krt_comm *k, char *err, size_t errlen, const char *what,
                     int bucket) {
  return krt_err(err, errlen, "%s (rank %d of %d, step %lld, bucket %d): %s", what, k->rank, k->size,
                 (long long)k->step, bucket, nc.ncclGetErrorString ? nc.ncclGetErrorString(r) : "?");
}

static void nccl_free(cuda_dev *c) {
  struct cuda_nccl *n = c->nccl;
  for (int b = 0; b < NCCL_MAX_BUCKETS; b++) {
    if (n->ready[b]) st.cuEventDestroy_v2(n->ready[b]);
    if (n->done[b]) st.cuEventDestroy_v2(n->done[b]);
  }
  if (n->stream) st.cuStreamDestroy_v2(n->stream);
  if (n->comm) nc.ncclCommDestroy(n->comm);
  free(n);
  c->nccl = NULL;
}

static int nccl_setup(cuda_dev *c, krt_comm *k, char *err, size_t errlen) {
  if (load_nccl(err, errlen)) return -1;
  struct cuda_nccl *n = calloc(1, sizeof *n);
  if (!n) return krt_err(err, errlen, "out of memory");
  c->nccl = n;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t r = ncclSuccess;
  if (k->rank == 0 && (r = nc.ncclGetUniqueId(&id)) != ncclSuccess) {
    nccl_fail(r, k, err, errlen, "ncclGetUniqueId", 0);
    goto fail;
  }
  if (krt_comm_broadcast(k, &id, sizeof id, 0, err, errlen)) goto fail;
  if ((r = nc.ncclCommInitRank(&n->comm, k->size, id, k->rank)) != ncclSuccess) {
    nccl_fail(r, k, err, errlen, "ncclCommInitRank", 0);
    goto fail;
  }
  CUresult cr = st.cuStreamCreate(&n->stream, CU_STREAM_NON_BLOCKING);
  if (cr != CUDA_SUCCESS) {
    cu_fail(cr, err, errlen, "cuStreamCreate (the gradient exchange's stream)");
    goto fail;
  }
  return 0;
fail:
  nccl_free(c);
  return -1;
}

static int cuda_comm_start(krt_device *d, krt_comm *k, int bucket, int count, void *const *src,
                           void *const *dst, const int64_t *numel, krt_dtype dtype, char *err,
                           size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen) || (!c->nccl && nccl_setup(c, k, err, errlen))) return -1;
  struct cuda_nccl *n = c->nccl;
  if (bucket >= NCCL_MAX_BUCKETS) return krt_err(err, errlen, "gradient bucket %d: at most %d", bucket, NCCL_MAX_BUCKETS);
  if (n->started[bucket])
    return krt_err(err, errlen, "rank %d: step %lld: gradient bucket %d started twice", k->rank,
                   (long long)k->step, bucket);
  CUresult cr = CUDA_SUCCESS;
  for (int e = 0; e < 2 && cr == CUDA_SUCCESS; e++) {
    CUevent *ev = e ? &n->done[bucket] : &n->ready[bucket];
    if (!*ev) cr = st.cuEventCreate(ev, CU_EVENT_DEFAULT);
  }
  if (cr == CUDA_SUCCESS) cr = st.cuEventRecord(n->ready[bucket], c->stream);
  if (cr == CUDA_SUCCESS) cr = st.cuStreamWaitEvent(n->stream, n->ready[bucket], 0);
  if (cr != CUDA_SUCCESS) return cu_fail(cr, err, errlen, "ordering gradient bucket %d after the backward pass", bucket);
  ncclResult_t r = nc.ncclGroupStart();
  if (r != ncclSuccess) return nccl_fail(r, k, err, errlen, "ncclGroupStart", bucket);
  for (int i = 0; i < count && r == ncclSuccess; i++)
    r = nc.ncclAllReduce(src[i], dst[i], (size_t)numel[i], dtype == KRT_F64 ? ncclFloat64 : ncclFloat32,
                         ncclSum, n->comm, (cudaStream_t)n->stream);
  ncclResult_t r2 = nc.ncclGroupEnd();
  if (r != ncclSuccess || r2 != ncclSuccess)
    return nccl_fail(r != ncclSuccess ? r : r2, k, err, errlen, r != ncclSuccess ? "ncclAllReduce" : "ncclGroupEnd", bucket);
  if ((cr = st.cuEventRecord(n->done[bucket], n->stream)) != CUDA_SUCCESS)
    return cu_fail(cr, err, errlen, "cuEventRecord (gradient bucket %d done)", bucket);
  n->started[bucket] = 1;
  return 0;
}

static int cuda_comm_wait(krt_device *d, krt_comm *k, int bucket, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  struct cuda_nccl *n = c->nccl;
  if (!n || bucket >= NCCL_MAX_BUCKETS || !n->started[bucket]) return 0;
  if (use_ctx(c, err, errlen)) return -1;
  double t0 = krt_now_ms();
  for (;;) {
    CUresult cr = st.cuEventQuery(n->done[bucket]);
    if (cr == CUDA_SUCCESS) break;
    if (cr != CUDA_ERROR_NOT_READY) return cu_fail(cr, err, errlen, "cuEventQuery (gradient bucket %d)", bucket);
    ncclResult_t async = ncclSuccess;
    if (nc.ncclCommGetAsyncError(n->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
      return nccl_fail(async, k, err, errlen, "ncclAllReduce (asynchronous error)", bucket);
    if (krt_now_ms() - t0 > k->timeout_s * 1e3) {
      nc.ncclCommAbort(n->comm);
      n->comm = NULL;
      char what[64];
      snprintf(what, sizeof what, "the exchange of gradient bucket %d", bucket);
      k->ops->abort(k, what); /* does not return */
      return krt_err(err, errlen, "gradient bucket %d: timed out", bucket);
    }
    struct timespec pause = {0, 20000};
    nanosleep(&pause, NULL);
  }
  double t1 = krt_now_ms();
  float busy = 0;
  if (st.cuEventElapsedTime_v2(&busy, n->ready[bucket], n->done[bucket]) == CUDA_SUCCESS)
    k->stats.busy_ms += busy;
  k->stats.exposed_ms += t1 - t0, k->stats.buckets++;
  n->started[bucket] = 0;
  CUresult cr = st.cuStreamWaitEvent(c->stream, n->done[bucket], 0);
  return cr == CUDA_SUCCESS ? 0 : cu_fail(cr, err, errlen, "cuStreamWaitEvent (gradient bucket %d)", bucket);
}

/* ---- CUDA Graphs: the device's stream captured, thread-local (another
 * thread's CUDA calls do not spoil it) ---------------------------------- */
static int cuda_graph_begin(krt_device *d, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUresult r = cu.cuStreamBeginCapture_v2(c->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuStreamBeginCapture");
}

static int cuda_graph_end(krt_device *d, void **exec, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  CUgraph graph = NULL;
  CUgraphExec ge = NULL;
  CUresult r = cu.cuStreamEndCapture(c->stream, &graph);
  if (r != CUDA_SUCCESS) {
    if (graph) cu.cuGraphDestroy(graph);
    return cu_fail(r, err, errlen, "cuStreamEndCapture");
  }
  r = cu.cuGraphInstantiateWithFlags(&ge, graph, 0);
  cu.cuGraphDestroy(graph); /* the executable graph keeps what it needs */
  if (r != CUDA_SUCCESS) return cu_fail(r, err, errlen, "cuGraphInstantiate");
  *exec = ge;
  return 0;
}

static int cuda_graph_launch(krt_device *d, void *exec, char *err, size_t errlen) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, err, errlen)) return -1;
  /* an asynchronous fault names the graph: --no-graph (KILN_NO_GRAPH=1)
   * runs the kernels one by one, and then it names the kernel */
  snprintf(c->last_kernel, sizeof c->last_kernel, "a CUDA graph replay: KILN_NO_GRAPH=1 names the kernel");
  CUresult r = cu.cuGraphLaunch((CUgraphExec)exec, c->stream);
  return r == CUDA_SUCCESS ? 0 : cu_fail(r, err, errlen, "cuGraphLaunch");
}

static void cuda_graph_destroy(krt_device *d, void *exec) {
  cuda_dev *c = d->priv;
  if (use_ctx(c, NULL, 0) == 0) cu.cuGraphExecDestroy((CUgraphExec)exec);
}

const krt_device_ops krt_cuda_ops = {
    .kind = KRT_DEVICE_CUDA,
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .memset_zero = cuda_memset_zero,
    .synchronize = cuda_synchronize,
    .module_load = cuda_module_load,
    .module_unload = cuda_module_unload,
    .launch = cuda_launch,
    .gemm = cuda_gemm,
    .mark = cuda_mark,
    .between = cuda_between,
    .marks_free = cuda_marks_free,
    .copy = cuda_copy,
    .comm_start = cuda_comm_start,
    .comm_wait = cuda_comm_wait,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
};
