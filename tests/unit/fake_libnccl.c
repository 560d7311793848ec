/* fake_libnccl.c - a stand-in libnccl.so.2 for testing the cuda device's
 * gradient exchange (device_cuda.c) without a GPU, beside fake_libcuda.c:
 * "device" memory is host memory, and the fake is every rank at once, each
 * holding what this one holds, so the sum over n ranks is n times the
 * value.  It checks what a real NCCL would refuse (an id that is not the
 * one ncclGetUniqueId gave, a rank out of range, the default stream for a
 * collective meant to overlap, a call outside a group that was opened) and
 * logs every call in order to FAKE_GPU_LOG through fake_libcuda.c's
 * fake_gpu_log.  FAKE_NCCL_FAIL=allreduce makes ncclAllReduce fail. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#define EXPORT __attribute__((visibility("default")))

static const char FAKE_ID[] = "fake-nccl-unique-id";

struct ncclComm {
  int nranks, rank;
};
static int group_depth;

static void log_call(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_call(const char *fmt, ...) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *p = lib ? dlsym(lib, "fake_gpu_log") : NULL;
  if (lib) dlclose(lib);
  if (!p) return;
  void (*f)(const char *, ...);
  memcpy(&f, &p, sizeof p);
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  f("%s", line);
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclInvalidArgument: return "invalid argument (fake NCCL)";
  case ncclInvalidUsage: return "invalid usage (fake NCCL)";
  default: return "unhandled error (fake NCCL)";
  }
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, FAKE_ID, sizeof FAKE_ID);
  log_call("ncclGetUniqueId");
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  log_call("ncclCommInitRank nranks=%d rank=%d", nranks, rank);
  if (memcmp(id.internal, FAKE_ID, sizeof FAKE_ID) || nranks < 1 || rank < 0 || rank >= nranks)
    return ncclInvalidArgument;
  struct ncclComm *c = malloc(sizeof *c);
  if (!c) return ncclSystemError;
  c->nranks = nranks, c->rank = rank;
  *comm = c;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  log_call("ncclCommDestroy");
  free(comm);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  log_call("ncclCommAbort");
  free(comm);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
  (void)comm;
  *async = ncclSuccess;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupStart(void) {
  group_depth++;
  log_call("ncclGroupStart");
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
  if (group_depth <= 0) return ncclInvalidUsage;
  group_depth--;
  log_call("ncclGroupEnd");
  return ncclSuccess;
}

/* the stream's id, as fake_libcuda.c's CUstream holds it first */
static int stream_id(cudaStream_t s) { return s ? *(const int *)(const void *)s : 0; }

EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  log_call("ncclAllReduce count=%zu type=%d op=%d stream=%d", count, (int)type, (int)op, stream_id(stream));
  const char *f = getenv("FAKE_NCCL_FAIL");
  if (f && !strcmp(f, "allreduce")) return ncclUnhandledCudaError;
  if (!comm || op != ncclSum || (type != ncclFloat32 && type != ncclFloat64)) return ncclInvalidArgument;
  for (size_t i = 0; i < count; i++) {
    if (type == ncclFloat32) ((float *)recv)[i] = ((const float *)send)[i] * (float)comm->nranks;
    else ((double *)recv)[i] = ((const double *)send)[i] * comm->nranks;
  }
  return ncclSuccess;
}
