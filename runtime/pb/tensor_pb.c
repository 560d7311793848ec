/* tensor_pb.c - ONNX TensorProto (.pb) tensor files, the format of the
 * inputs and outputs in ONNX's test data, decoded with protobuf-c from the
 * system's onnx.proto. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io_util.h"
#include "kilnrt_pb.h"
#include "onnx_tensor.h"

int krt_onnx_dtype(int onnx_type, krt_dtype *out) {
  switch (onnx_type) {
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: *out = KRT_F32; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: *out = KRT_F16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: *out = KRT_BF16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: *out = KRT_F64; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: *out = KRT_I8; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: *out = KRT_I32; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: *out = KRT_I64; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: *out = KRT_BOOL; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: *out = KRT_U8; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT16: *out = KRT_I16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16: *out = KRT_U16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32: *out = KRT_U32; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64: *out = KRT_U64; return 0;
  /* Debian's onnx.proto predates these: ONNX's numbers, 17 to 26 */
  case 17: *out = KRT_F8E4M3FN; return 0;
  case 18: *out = KRT_F8E4M3FNUZ; return 0;
  case 19: *out = KRT_F8E5M2; return 0;
  case 20: *out = KRT_F8E5M2FNUZ; return 0;
  case 21: *out = KRT_U4; return 0;
  case 22: *out = KRT_I4; return 0;
  case 23: *out = KRT_F4E2M1; return 0;
  case 24: *out = KRT_F8E8M0; return 0;
  case 25: *out = KRT_U2; return 0;
  case 26: *out = KRT_I2; return 0;
  default: return -1;
  }
}

const char *krt_onnx_type_name(int t) {
  static const char *const names[] = {"undefined", "float", "uint8", "int8", "uint16",
                                      "int16", "int32", "int64", "string", "bool",
                                      "float16", "double", "uint32", "uint64",
                                      "complex64", "complex128", "bfloat16",
                                      "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
                                      "float8e5m2fnuz", "uint4", "int4", "float4e2m1",
                                      "float8e8m0", "uint2", "int2", "float6e2m3",
                                      "float6e3m2"};
  return t >= 0 && t < (int)(sizeof names / sizeof *names) ? names[t] : "unknown";
}

static int say(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int say(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

int krt_onnx_tensor_header(const Onnx__TensorProto *t, krt_tensor *out, char *err,
                           size_t errlen) {
  const char *name = t->name ? t->name : "?";
  memset(out, 0, sizeof *out);
  if (!t->has_data_type || krt_onnx_dtype(t->data_type, &out->dtype))
    return say(err, errlen, -2, "tensor '%s': data type %s is not supported", name,
               krt_onnx_type_name(t->has_data_type ? t->data_type : 0));
  if (t->n_dims > KRT_MAX_RANK)
    return say(err, errlen, -1, "tensor '%s': rank %zu is above the limit of %d", name,
               t->n_dims, KRT_MAX_RANK);
  out->rank = (int)t->n_dims;
  int64_t numel = 1;
  for (size_t d = 0; d < t->n_dims; d++) {
    int64_t v = t->dims[d];
    if (v < 0 || v > KRT_MAX_NUMEL || (v && numel > KRT_MAX_NUMEL / v))
      return say(err, errlen, -1, "tensor '%s': dims are negative or hold more than %lld elements",
                 name, (long long)KRT_MAX_NUMEL);
    out->dims[d] = v;
    numel *= v;
  }
  return 0;
}

static const char *shape_text(const krt_tensor *h, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "%s[", krt_dtype_name(h->dtype));
  for (int d = 0; d < h->rank && k < len; d++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? "," : "", (long long)h->dims[d]);
  if (k < len) snprintf(buf + k, len - k, "]");
  return buf;
}

/* 4- and 2-bit types: ONNX packs two or four elements a byte, the first in
 * the lowest bits, in raw_data or one packed byte per int32_data entry.
 * Kiln holds one element a byte (kilnrt.h): unpacked here, signed ones
 * sign-extended. */
static int packed_payload(const Onnx__TensorProto *t, const krt_tensor *h, void **data,
                          char *err, size_t errlen) {
  const char *name = t->name ? t->name : "?";
  int bits = krt_dtype_bits(h->dtype), per = 8 / bits;
  int64_t numel = krt_tensor_numel(h);
  size_t nbytes = (size_t)((numel + per - 1) / per), have;
  char shape[160];
  if (t->has_raw_data) {
    have = t->raw_data.len;
    if (have != nbytes)
      return say(err, errlen, -1, "tensor '%s': raw_data has %zu bytes, but %s packed %d a byte "
                 "needs %zu", name, have, shape_text(h, shape, sizeof shape), per, nbytes);
  } else if ((have = t->n_int32_data) != nbytes) {
    return say(err, errlen, -1, "tensor '%s': int32_data holds %zu packed bytes, but %s packed "
               "%d a byte needs %zu", name, have, shape_text(h, shape, sizeof shape), per, nbytes);
  }
  unsigned char *out = malloc(numel ? (size_t)numel : 1);
  if (!out) return say(err, errlen, -1, "tensor '%s': out of memory", name);
  bool is_signed = h->dtype == KRT_I4 || h->dtype == KRT_I2;
  unsigned mask = (1u << bits) - 1, sign = 1u << (bits - 1);
  for (int64_t i = 0; i < numel; i++) {
    size_t b = (size_t)(i / per);
    unsigned byte = t->has_raw_data ? t->raw_data.data[b] : (unsigned)t->int32_data[b] & 0xffu;
    unsigned v = (byte >> (i % per * bits)) & mask;
    out[i] = (unsigned char)(is_signed && (v & sign) ? v | ~mask : v);
  }
  *data = out;
  return 0;
}

int krt_onnx_tensor_payload(const Onnx__TensorProto *t, const krt_tensor *h, void **data,
                            char *err, size_t errlen) {
  const char *name = t->name ? t->name : "?";
  int64_t numel = krt_tensor_numel(h);
  size_t esize = krt_dtype_size(h->dtype), bytes = (size_t)numel * esize;
  char shape[160];
  *data = NULL;
  if (krt_dtype_bits(h->dtype) < 8) return packed_payload(t, h, data, err, errlen);
  /* Sizes are checked before anything is allocated: a few bytes of
   * protobuf must not make us allocate gigabytes. */
  if (t->has_raw_data) {
    if (t->raw_data.len != bytes)
      return say(err, errlen, -1, "tensor '%s': raw_data has %zu bytes, but %s needs %zu", name,
                 t->raw_data.len, shape_text(h, shape, sizeof shape), bytes);
    unsigned char *out = malloc(bytes ? bytes : 1);
    if (!out) return say(err, errlen, -1, "tensor '%s': out of memory (%zu bytes)", name, bytes);
    if (bytes) memcpy(out, t->raw_data.data, bytes);
    *data = out;
    return 0;
  }
  /* Typed fields: f32 in float_data; f64 in double_data; i64 in
   * int64_data; u32 and u64 in uint64_data; everything narrower (and
   * f16/bf16 bit patterns) in int32_data. */
  size_t have;
  switch (h->dtype) {
  case KRT_F32: have = t->n_float_data; break;
  case KRT_F64: have = t->n_double_data; break;
  case KRT_I64: have = t->n_int64_data; break;
  case KRT_U32: case KRT_U64: have = t->n_uint64_data; break;
  default: have = t->n_int32_data; break;
  }
  if (have != (size_t)numel)
    return say(err, errlen, -1, "tensor '%s': holds %zu values, but its shape needs %lld", name,
               have, (long long)numel);
  unsigned char *out = malloc(bytes ? bytes : 1);
  if (!out) return say(err, errlen, -1, "tensor '%s': out of memory (%zu bytes)", name, bytes);
  for (int64_t i = 0; i < numel; i++) {
    unsigned char *p = out + (size_t)i * esize;
    switch (h->dtype) {
    case KRT_F32: memcpy(p, &t->float_data[i], 4); break;
    case KRT_F64: memcpy(p, &t->double_data[i], 8); break;
    case KRT_I64: memcpy(p, &t->int64_data[i], 8); break;
    case KRT_I32: memcpy(p, &t->int32_data[i], 4); break;
    case KRT_F16:
    case KRT_BF16:
    case KRT_I16:
    case KRT_U16: { uint16_t v = (uint16_t)t->int32_data[i]; memcpy(p, &v, 2); break; }
    case KRT_I8: *p = (unsigned char)(int8_t)t->int32_data[i]; break;
    case KRT_BOOL: *p = t->int32_data[i] != 0; break;
    case KRT_U8: *p = (unsigned char)t->int32_data[i]; break;
    case KRT_F8E4M3FN: case KRT_F8E4M3FNUZ: case KRT_F8E5M2: case KRT_F8E5M2FNUZ:
    case KRT_F8E8M0: *p = (unsigned char)t->int32_data[i]; break; /* the code */
    case KRT_U32: { uint32_t v = (uint32_t)t->uint64_data[i]; memcpy(p, &v, 4); break; }
    case KRT_U64: memcpy(p, &t->uint64_data[i], 8); break;
    default: break;
    }
  }
  *data = out;
  return 0;
}

int krt_pb_read(const char *path, krt_tensor *out, char *errbuf, size_t errlen) {
  memset(out, 0, sizeof *out);
  int64_t size;
  FILE *f = krt_open_read(path, &size, errbuf, errlen);
  if (!f) return -1;
  /* protobuf's own limit for one message is 2 GiB */
  if (size > ((int64_t)1 << 31)) {
    fclose(f);
    return krt_fail(errbuf, errlen, path, "the file is larger than 2 GiB");
  }
  unsigned char *buf = malloc(size ? (size_t)size : 1);
  if (!buf) {
    fclose(f);
    return krt_fail(errbuf, errlen, path, "out of memory (%lld bytes)", (long long)size);
  }
  bool ok = krt_read_exact(f, buf, (size_t)size);
  fclose(f);
  Onnx__TensorProto *t = ok ? onnx__tensor_proto__unpack(NULL, (size_t)size, buf) : NULL;
  free(buf);
  if (!ok) return krt_fail(errbuf, errlen, path, "read failed");
  if (!t) return krt_fail(errbuf, errlen, path, "not an ONNX TensorProto (.pb) file");
  char msg[400];
  krt_tensor h;
  int rc = krt_onnx_tensor_header(t, &h, msg, sizeof msg);
  if (!rc && t->has_data_location &&
      t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    snprintf(msg, sizeof msg, "external data is not supported in a tensor file");
    rc = -1;
  }
  if (!rc) rc = krt_onnx_tensor_payload(t, &h, &h.data, msg, sizeof msg);
  onnx__tensor_proto__free_unpacked(t, NULL);
  if (rc) return krt_fail(errbuf, errlen, path, "%s", msg);
  *out = h;
  return 0;
}
