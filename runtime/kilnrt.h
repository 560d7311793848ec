/* kilnrt.h - Kiln's runtime library: tensors, half-precision conversions and
 * tensor files (.npy, .safetensors).  One public header for the runtime/
 * folder; compiled programs and the driver include only this. */
#ifndef KILN_KILNRT_H
#define KILN_KILNRT_H

#include <stddef.h>
#include <stdint.h>

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

/* ---- half types ------------------------------------------------------ */
/* IEEE binary16 and bfloat16 bit patterns.  float -> half rounds to nearest,
 * ties to even; overflow gives Inf, NaN stays NaN (made quiet), subnormals
 * are exact.  half -> float is exact. */
uint16_t krt_f32_to_f16(float f);
float krt_f16_to_f32(uint16_t h);
uint16_t krt_f32_to_bf16(float f);
float krt_bf16_to_f32(uint16_t h);

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
int krt_safetensors_write(const char *path, const krt_tensor_set *set,
                          char *errbuf, size_t errlen);
/* NULL when absent. */
const krt_tensor *krt_tensor_set_find(const krt_tensor_set *set,
                                      const char *name);
/* Frees names, data and items, not the struct; NULL-safe. */
void krt_tensor_set_free(krt_tensor_set *set);

#endif /* KILN_KILNRT_H */
