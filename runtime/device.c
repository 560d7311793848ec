/* device.c - the device API of kilnrt.h: picks a device, checks arguments,
 * and dispatches to the device's vtable (device_host.c, device_cuda.c).
 *
 * Checks that do not depend on the device (NULL pointers, a kernel index out
 * of range, GEMM shapes that do not fit their leading dimensions) live here,
 * once, so that both devices reject the same calls with the same words. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_impl.h"

int krt_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ---- choosing a device ------------------------------------------------ */
int krt_device_kind_parse(const char *s, krt_device_kind *out) {
  static const struct {
    const char *name;
    krt_device_kind kind;
  } kinds[] = {{"auto", KRT_DEVICE_AUTO}, {"host", KRT_DEVICE_HOST}, {"cuda", KRT_DEVICE_CUDA}};
  if (!s) return -1;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(s, kinds[i].name) == 0) {
      if (out) *out = kinds[i].kind;
      return 0;
    }
  return -1;
}

static int open_with(const krt_device_ops *ops, krt_device **out, char *err, size_t errlen) {
  krt_device *d = calloc(1, sizeof *d);
  if (!d) return krt_err(err, errlen, "krt_device_open: out of memory");
  d->ops = ops;
  if (ops->open(d, err, errlen)) {
    free(d);
    return -1;
  }
  const char *no_graph = getenv("KILN_NO_GRAPH");
  d->graphs_off = no_graph && *no_graph && strcmp(no_graph, "0") != 0;
  *out = d;
  return 0;
}

int krt_device_open(krt_device_kind kind, krt_device **out, char *err, size_t errlen) {
  if (!out) return krt_err(err, errlen, "krt_device_open: no place for the device (out is NULL)");
  *out = NULL;
  /* The environment only overrides AUTO: a program that asks for a device by
   * name gets that device or an error. */
  if (kind == KRT_DEVICE_AUTO) {
    const char *env = getenv("KILN_DEVICE");
    if (env && *env && krt_device_kind_parse(env, &kind))
      return krt_err(err, errlen, "KILN_DEVICE=%s: expected host, cuda or auto", env);
  }
  switch (kind) {
  case KRT_DEVICE_HOST: return open_with(&krt_host_ops, out, err, errlen);
  case KRT_DEVICE_CUDA: return open_with(&krt_cuda_ops, out, err, errlen);
  case KRT_DEVICE_AUTO: {
    /* No GPU is the normal case on a laptop or a CI runner, not an error:
     * why the GPU was passed over is for KILN_DEVICE=cuda to say. */
    char ignored[256];
    if (open_with(&krt_cuda_ops, out, ignored, sizeof ignored) == 0) return 0;
    return open_with(&krt_host_ops, out, err, errlen);
  }
  }
  return krt_err(err, errlen, "krt_device_open: unknown device kind %d", (int)kind);
}

void krt_device_close(krt_device *d) {
  if (!d) return;
  krt_profile_enable(d, 0, NULL, 0);
  d->ops->close(d);
  free(d);
}

krt_device_kind krt_device_kind_of(const krt_device *d) { return d->ops->kind; }

const char *krt_device_name(const krt_device *d) { return d->name; }
int krt_device_sm(const krt_device *d) { return d ? d->sm : 0; }

/* ---- memory ----------------------------------------------------------- */
int krt_malloc(krt_device *d, size_t bytes, void **ptr, char *err, size_t errlen) {
  if (!d || !ptr) return krt_err(err, errlen, "krt_malloc: device or result pointer is NULL");
  *ptr = NULL;
  /* Zero bytes is a valid request (an empty tensor) that cuMemAlloc refuses;
   * NULL is a fine answer since nothing may be read through it. */
  if (bytes == 0) return 0;
  return d->ops->alloc(d, bytes, ptr, err, errlen);
}

void krt_free(krt_device *d, void *ptr) {
  if (d && ptr) d->ops->release(d, ptr);
}

static int check_copy(const char *what, const krt_device *d, const void *dst, const void *src,
                      size_t bytes, char *err, size_t errlen) {
  if (!d) return krt_err(err, errlen, "%s: device is NULL", what);
  if (bytes && (!dst || !src))
    return krt_err(err, errlen, "%s of %zu bytes: %s pointer is NULL", what, bytes,
                   !dst ? "destination" : "source");
  return 0;
}

int krt_upload(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
               size_t errlen) {
  if (check_copy("krt_upload", d, dst, src, bytes, err, errlen)) return -1;
  return bytes ? d->ops->upload(d, dst, src, bytes, err, errlen) : 0;
}

int krt_download(krt_device *d, void *dst, const void *src, size_t bytes, char *err,
                 size_t errlen) {
  if (check_copy("krt_download", d, dst, src, bytes, err, errlen)) return -1;
  return bytes ? d->ops->download(d, dst, src, bytes, err, errlen) : 0;
}

int krt_memset_zero(krt_device *d, void *dst, size_t bytes, char *err, size_t errlen) {
  if (check_copy("krt_memset_zero", d, dst, dst, bytes, err, errlen)) return -1;
  return bytes ? d->ops->memset_zero(d, dst, bytes, err, errlen) : 0;
}

int krt_synchronize(krt_device *d, char *err, size_t errlen) {
  if (!d) return krt_err(err, errlen, "krt_synchronize: device is NULL");
  return d->ops->synchronize(d, err, errlen);
}

/* ---- CUDA Graphs ------------------------------------------------------- */
struct krt_graph {
  void *exec;   /* the instantiated graph */
  int warm;     /* one plain run done: libraries loaded, handles made */
  int refused;  /* the driver refused the capture: plain launches */
};

void krt_device_set_graphs(krt_device *d, int on) {
  if (d) d->graphs_off = !on;
}

int krt_device_graphs(const krt_device *d) {
  return d && d->ops->graph_begin && !d->graphs_off;
}

void krt_device_graph_counts(const krt_device *d, long *captures, long *replays) {
  if (captures) *captures = d ? d->graph_captures : 0;
  if (replays) *replays = d ? d->graph_replays : 0;
}

int krt_graph_run(krt_device *d, krt_graph **graph, int capturable, krt_compute_fn compute,
                  void *self, char *err, size_t errlen) {
  if (!d || !graph || !compute) return krt_err(err, errlen, "krt_graph_run: NULL argument");
  krt_graph *g = *graph;
  /* the profiler times each kernel between marks: plain launches */
  if (!capturable || !krt_device_graphs(d) || d->nmarks || (g && g->refused))
    return compute(self, err, errlen) ? -1 : 0;
  if (!g) {
    if (!(g = calloc(1, sizeof *g))) return krt_err(err, errlen, "krt_graph_run: out of memory");
    *graph = g;
  }
  if (!g->warm) {
    /* The first run is plain: what a run does once (cuBLAS's handle and
     * workspace, a kernel's shared-memory opt-in) allocates or sets state,
     * which a capture may not; the second is captured. */
    g->warm = 1;
    return compute(self, err, errlen) ? -1 : 0;
  }
  if (!g->exec) {
    /* A call the driver refuses while capturing fails and invalidates the
     * capture (end fails too): then the graph is given up and compute runs
     * plainly, where a real error shows again.  An error of compute's own
     * with a sound capture (a bad argument) ends the run. */
    char why[400] = "", call[400] = "";
    if (d->ops->graph_begin(d, err, errlen)) return -1;
    int rc = compute(self, call, sizeof call);
    void *exec = NULL;
    int end = d->ops->graph_end(d, &exec, why, sizeof why);
    if (end) {
      g->refused = 1;
      fprintf(stderr, "kiln: the CUDA graph capture was refused (%s%s%s); running with plain launches\n",
              rc ? call : "", rc ? "; " : "", why);
      return compute(self, err, errlen) ? -1 : 0;
    }
    if (rc) {
      d->ops->graph_destroy(d, exec);
      return krt_err(err, errlen, "%s", call);
    }
    g->exec = exec;
    d->graph_captures++;
  }
  if (d->ops->graph_launch(d, g->exec, err, errlen)) return -1;
  d->graph_replays++;
  return 0;
}

void krt_graph_free(krt_device *d, krt_graph *graph) {
  if (!graph) return;
  if (d && graph->exec) d->ops->graph_destroy(d, graph->exec);
  free(graph);
}

/* ---- modules and launches ---------------------------------------------- */
void krt_module_unload(krt_module *m) {
  if (!m) return;
  if (m->priv) m->dev->ops->module_unload(m);
  for (int i = 0; i < m->nkernels && m->names; i++) free(m->names[i]);
  free(m->names);
  free(m->host);
  free(m);
}

int krt_module_load(krt_device *d, const krt_module_desc *desc, krt_module **out, char *err,
                    size_t errlen) {
  if (!out) return krt_err(err, errlen, "krt_module_load: out is NULL");
  *out = NULL;
  if (!d || !desc) return krt_err(err, errlen, "krt_module_load: device or module is NULL");
  if (desc->nkernels < 0 || (desc->nkernels > 0 && !desc->kernels) || desc->ncubins < 0 ||
      (desc->ncubins > 0 && !desc->cubins))
    return krt_err(err, errlen, "krt_module_load: bad module description (%d kernels, %d cubins)",
                   desc->nkernels, desc->ncubins);
  krt_module *m = calloc(1, sizeof *m);
  if (!m) return krt_err(err, errlen, "krt_module_load: out of memory");
  m->dev = d;
  size_t n = desc->nkernels ? (size_t)desc->nkernels : 1;
  m->names = calloc(n, sizeof *m->names);
  m->host = calloc(n, sizeof *m->host);
  if (!m->names || !m->host) goto oom;
  for (int i = 0; i < desc->nkernels; i++, m->nkernels++) {
    const char *name = desc->kernels[i].name;
    if (!name || !*name) {
      krt_err(err, errlen, "krt_module_load: kernel %d has no name", i);
      goto fail;
    }
    if (!(m->names[i] = strdup(name))) goto oom;
    m->host[i] = desc->kernels[i].host;
  }
  if (d->ops->module_load(m, desc, err, errlen)) goto fail;
  *out = m;
  return 0;
oom:
  krt_err(err, errlen, "krt_module_load: out of memory");
fail:
  m->priv = NULL;
  krt_module_unload(m);
  return -1;
}

int krt_launch(krt_module *m, int index, krt_dim3 grid, krt_dim3 block, size_t dyn_shared,
               void **args, char *err, size_t errlen) {
  if (!m) return krt_err(err, errlen, "krt_launch: module is NULL");
  if (index < 0 || index >= m->nkernels)
    return krt_err(err, errlen, "krt_launch: kernel index %d out of range (module has %d)",
                   index, m->nkernels);
  return m->dev->ops->launch(m, index, grid, block, dyn_shared, args, err, errlen);
}

/* ---- GEMM --------------------------------------------------------------- */
/* Both BLAS interfaces take 32-bit sizes and leading dimensions (Debian's
 * OpenBLAS is built without ILP64; cublasGemmStridedBatchedEx takes int), so
 * everything is checked against INT_MAX here, once. */
static int gemm_check(const krt_gemm_desc *g, char *err, size_t errlen) {
  if (g->dtype != KRT_F32 && g->dtype != KRT_F64 && g->dtype != KRT_F16 &&
      g->dtype != KRT_BF16)
    return krt_err(err, errlen, "krt_gemm: dtype %s is not supported (f32, f64, f16, bf16)",
                   krt_dtype_name(g->dtype));
  if (g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0 || g->m > INT_MAX || g->n > INT_MAX ||
      g->k > INT_MAX || g->batch > INT_MAX)
    return krt_err(err, errlen,
                   "krt_gemm: m=%lld n=%lld k=%lld batch=%lld: each must be in 0..%d",
                   (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch,
                   INT_MAX);
  int64_t cols_a = g->trans_a ? g->m : g->k, cols_b = g->trans_b ? g->k : g->n;
  const struct {
    char name;
    int64_t ld, min, stride;
  } ops[3] = {{'a', g->lda, cols_a, g->stride_a},
              {'b', g->ldb, cols_b, g->stride_b},
              {'c', g->ldc, g->n, g->stride_c}};
  for (int i = 0; i < 3; i++) {
    int64_t min = ops[i].min > 1 ? ops[i].min : 1;
    if (ops[i].ld < min || ops[i].ld > INT_MAX)
      return krt_err(err, errlen,
                     "krt_gemm %lldx%lldx%lld: ld%c=%lld, expected %lld..%d (row-major, "
                     "trans_a=%d trans_b=%d)",
                     (long long)g->m, (long long)g->n, (long long)g->k, ops[i].name,
                     (long long)ops[i].ld, (long long)min, INT_MAX, !!g->trans_a, !!g->trans_b);
    if (ops[i].stride < 0)
      return krt_err(err, errlen, "krt_gemm: stride_%c=%lld is negative", ops[i].name,
                     (long long)ops[i].stride);
  }
  if (g->batch2 < 0 || g->batch2 > INT_MAX || g->stride_a2 < 0 || g->stride_b2 < 0 ||
      g->stride_c2 < 0)
    return krt_err(err, errlen, "krt_gemm: batch2=%lld or an outer stride is out of range",
                   (long long)g->batch2);
  if (g->m == 0 || g->n == 0 || g->batch == 0) return 0;
  /* Batch items must not share C: on a GPU they are written concurrently,
   * so an accumulation through stride_c = 0 would race.  The C elements of
   * all items are disjoint when, with C's four dims (outer and inner batch,
   * rows, columns) sorted by stride, each stride passes the span of all
   * the smaller ones (items may sit side by side within rows). */
  int64_t dims[4][2] = {{g->batch2 > 1 ? g->batch2 : 1, g->stride_c2},
                        {g->batch, g->stride_c}, {g->m, g->ldc}, {g->n, 1}};
  for (int i = 1; i < 4; i++) /* insertion sort by stride */
    for (int j = i; j > 0 && dims[j][1] < dims[j - 1][1]; j--) {
      int64_t t0 = dims[j][0], t1 = dims[j][1];
      dims[j][0] = dims[j - 1][0], dims[j][1] = dims[j - 1][1];
      dims[j - 1][0] = t0, dims[j - 1][1] = t1;
    }
  int64_t span = 1; /* elements the smaller dims cover, end to end */
  bool ok = true;
  for (int i = 0; i < 4 && ok; i++) {
    if (dims[i][0] <= 1) continue;
    ok = dims[i][1] >= span;
    span = (dims[i][0] - 1) * dims[i][1] + span;
  }
  if (!ok)
    return krt_err(err, errlen,
                   "krt_gemm: stride_c=%lld, stride_c2=%lld make the %lld x %lld C matrices "
                   "(%lldx%lld, ldc=%lld) overlap",
                   (long long)g->stride_c, (long long)g->stride_c2,
                   (long long)(g->batch2 > 1 ? g->batch2 : 1), (long long)g->batch,
                   (long long)g->m, (long long)g->n, (long long)g->ldc);
  if (!g->c || (g->k > 0 && (!g->a || !g->b)))
    return krt_err(err, errlen, "krt_gemm: matrix %c is NULL",
                   !g->c ? 'c' : !g->a ? 'a' : 'b');
  return 0;
}

int krt_gemm(krt_device *d, const krt_gemm_desc *g, char *err, size_t errlen) {
  if (!d || !g) return krt_err(err, errlen, "krt_gemm: device or description is NULL");
  if (gemm_check(g, err, errlen)) return -1;
  if (g->m == 0 || g->n == 0 || g->batch == 0) return 0;
  if (g->batch2 <= 1) return d->ops->gemm(d, g, err, errlen);
  /* the outer batch: one strided-batched call per item (cuBLAS has one
   * batch stride) */
  size_t es = krt_dtype_size(g->dtype);
  for (int64_t o = 0; o < g->batch2; o++) {
    krt_gemm_desc item = *g;
    item.batch2 = 1;
    item.a = g->a ? (const char *)g->a + (size_t)(o * g->stride_a2) * es : NULL;
    item.b = g->b ? (const char *)g->b + (size_t)(o * g->stride_b2) * es : NULL;
    item.c = (char *)g->c + (size_t)(o * g->stride_c2) * es;
    if (g->c_in) item.c_in = (const char *)g->c_in + (size_t)(o * g->stride_c2) * es;
    if (d->ops->gemm(d, &item, err, errlen)) return -1;
  }
  return 0;
}
