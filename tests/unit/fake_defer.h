/* fake_defer.h - how the fake cuBLAS libraries enqueue a GEMM on a stream:
 * through fake_libcuda.c's fake_cuda_defer, which records it when the
 * stream captures a CUDA graph (to run at each replay), and otherwise
 * leaves it to the caller to run now.  The fake driver is found as the
 * real one would be, by its soname, among the libraries already loaded. */
#ifndef FAKE_DEFER_H
#define FAKE_DEFER_H

#include <dlfcn.h>
#include <string.h>

/* 1: recorded for a graph; 0: run fn(data) now */
static int fake_defer(void *stream, void (*fn)(void *), const void *data, size_t bytes) {
  static int (*defer)(void *, void (*)(void *), const void *, size_t);
  if (!defer) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = lib ? dlsym(lib, "fake_cuda_defer") : NULL;
    if (p) memcpy(&defer, &p, sizeof p);
  }
  return stream && defer ? defer(stream, fn, data, bytes) : 0;
}

/* 1 while the fake driver captures a graph */
static int fake_capturing(void) {
  static int (*capturing)(void);
  if (!capturing) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = lib ? dlsym(lib, "fake_cuda_in_capture") : NULL;
    if (p) memcpy(&capturing, &p, sizeof p);
  }
  return capturing ? capturing() : 0;
}

#endif
