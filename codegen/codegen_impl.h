/* codegen_impl.h - shared by the files of codegen/ (internal). */
#ifndef KILN_CODEGEN_IMPL_H
#define KILN_CODEGEN_IMPL_H

#include <stdio.h>

#include "codegen.h"

const char *kl_cg_storage(kl_dtype t);
/* Arithmetic type of a dtype in kernels: float for f16/bf16/f32, double
 * for f64, int64_t/uint64_t for integers. */
const char *kl_cg_compute_type(kl_dtype t);
/* Expression of a stored element `expr` of dtype t converted to `to`. */
const char *kl_cg_load(char *buf, size_t len, kl_dtype t, const char *to, const char *expr);
/* Statement `dst = value;` rounding value to dtype t's storage. */
void kl_cg_store(FILE *f, kl_dtype t, const char *dst, const char *value);

/* ---- templates ---------------------------------------------------------
 * A template turns one node into kernels (written to kernels.cu) and the
 * host code of run() that launches them or calls the runtime's GEMM.  The
 * families of templates are tables; emit_model.c asks each in turn. */
typedef struct kl_cg_emitter kl_cg_emitter;

typedef struct {
  bool (*handles)(const kl_node *n);
  /* 0, or -1 with the emitter's error set (kl_cg_fail) */
  int (*emit)(kl_cg_emitter *e, const kl_node *n);
} kl_cg_template;

extern const kl_cg_template kl_cg_templates_basic[];    /* templates_basic.c */
extern const kl_cg_template kl_cg_templates_movement[]; /* templates_movement.c */
extern const kl_cg_template kl_cg_templates_nn[];       /* templates_nn.c */

/* The kernels.cu stream, and a fresh kernel: its name ("k7") and index. */
FILE *kl_cg_kernels(kl_cg_emitter *e);
int kl_cg_new_kernel(kl_cg_emitter *e, char *name, size_t len);
/* The run() stream, for comments and custom host code (the model is `m`,
 * errors go to err/errlen, a failing call is followed by `return -1;`). */
FILE *kl_cg_host(kl_cg_emitter *e);
/* C expression of a value's device pointer in run(), and of a scratch
 * buffer of `bytes` private to the current node (im2col and the like). */
const char *kl_cg_ptr(kl_cg_emitter *e, const kl_value *v, char *buf, size_t len);
const char *kl_cg_scratch(kl_cg_emitter *e, size_t bytes, char *buf, size_t len);
/* Launch kernel `k` over `threads` threads (grid-stride kernels: blocks of
 * 256, at most 4096 blocks) with the given pointer expressions as its
 * arguments, in order. */
void kl_cg_launch(kl_cg_emitter *e, int k, int64_t threads, const char *const *args, int nargs);
/* The same with the node's inputs then its output as arguments. */
void kl_cg_launch_node(kl_cg_emitter *e, int k, int64_t threads, const kl_node *n);
/* A runtime GEMM (see krt_gemm_desc): pointers as expressions. */
typedef struct {
  kl_dtype dtype;
  int trans_a, trans_b;
  int64_t m, n, k, batch;
  const char *a; int64_t lda, stride_a;
  const char *b; int64_t ldb, stride_b;
  const char *c; int64_t ldc, stride_c;
  double alpha, beta;
} kl_cg_gemm;
void kl_cg_emit_gemm(kl_cg_emitter *e, const kl_cg_gemm *g);
int kl_cg_fail(kl_cg_emitter *e, const kl_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A one-line comment naming the node, its op and output, in both streams. */
void kl_cg_comment(kl_cg_emitter *e, const kl_node *n);
bool kl_cg_is_elementwise(const kl_node *n);
/* Integer div/mod: the kernel takes one more argument, an int flag it sets
 * when a divisor is zero. */
bool kl_cg_traps_zero_divisor(const kl_node *n);
/* Kernel writers: each emits one kernel named `name` and its emulator
 * entry for node n. */
void kl_cg_elementwise(FILE *f, const char *name, const kl_node *n);
void kl_cg_gather_copy(FILE *f, const char *name, const kl_node *n);
void kl_cg_softmax(FILE *f, const char *name, const kl_node *n);
void kl_cg_reduce(FILE *f, const char *name, const kl_node *n);

#endif
