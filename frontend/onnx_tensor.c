/* onnx_tensor.c - ONNX TensorProto contents: dtypes, raw_data and the typed
 * fields, external data files, and .pb tensor files. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "onnx_internal.h"

int kl_onnx_dtype(int onnx_type, kl_dtype *out) {
  switch (onnx_type) {
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: *out = KL_F32; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: *out = KL_F16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: *out = KL_BF16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: *out = KL_F64; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: *out = KL_I8; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: *out = KL_I32; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: *out = KL_I64; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: *out = KL_BOOL; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: *out = KL_U8; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT16: *out = KL_I16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16: *out = KL_U16; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32: *out = KL_U32; return 0;
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64: *out = KL_U64; return 0;
  default: return -1;
  }
}

static const char *onnx_type_name(int t) {
  static const char *const names[] = {"undefined", "float", "uint8", "int8", "uint16",
                                      "int16", "int32", "int64", "string", "bool",
                                      "float16", "double", "uint32", "uint64",
                                      "complex64", "complex128", "bfloat16"};
  return t >= 0 && t <= 16 ? names[t] : "unknown";
}

/* Read [offset, offset+length) of an external data file that must lie in
 * the model's folder. */
static int read_external(const Onnx__TensorProto *t, const char *model_path,
                         size_t want, unsigned char **raw, kl_error *err) {
  const char *location = NULL;
  long long offset = 0, length = -1;
  for (size_t i = 0; i < t->n_external_data; i++) {
    const Onnx__StringStringEntryProto *e = t->external_data[i];
    if (!e->key || !e->value) continue;
    char *end;
    if (!strcmp(e->key, "location")) location = e->value;
    else if (!strcmp(e->key, "offset") || !strcmp(e->key, "length")) {
      errno = 0;
      long long v = strtoll(e->value, &end, 10);
      if (*end || end == e->value || errno || v < 0)
        return kl_fail(err, (kl_loc){model_path, 0, 0},
                       "tensor '%s': external data %s '%s' is not a non-negative integer",
                       t->name ? t->name : "?", e->key, e->value);
      if (!strcmp(e->key, "offset")) offset = v;
      else length = v;
    }
  }
  const char *tname = t->name ? t->name : "?";
  if (!location || !*location)
    return kl_fail(err, (kl_loc){model_path, 0, 0},
                   "tensor '%s': external data has no location", tname);
  /* The file must be inside the model's folder: no absolute paths and no
   * ".." component, so a model cannot read arbitrary files. */
  if (location[0] == '/')
    return kl_fail(err, (kl_loc){model_path, 0, 0},
                   "tensor '%s': external data location '%s' is an absolute path", tname,
                   location);
  for (const char *p = location; *p;) {
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 2 && p[0] == '.' && p[1] == '.')
      return kl_fail(err, (kl_loc){model_path, 0, 0},
                     "tensor '%s': external data location '%s' leaves the model's folder",
                     tname, location);
    p += n + (slash ? 1 : 0);
  }
  if (length >= 0 && (size_t)length != want)
    return kl_fail(err, (kl_loc){model_path, 0, 0},
                   "tensor '%s': external data length %lld, but the tensor needs %zu bytes",
                   tname, length, want);
  const char *slash = strrchr(model_path, '/');
  size_t dir = slash ? (size_t)(slash - model_path + 1) : 0;
  char *path = malloc(dir + strlen(location) + 1);
  if (!path) abort();
  memcpy(path, model_path, dir);
  strcpy(path + dir, location);
  FILE *f = fopen(path, "rb");
  int rc = 0;
  if (!f) {
    rc = kl_fail(err, (kl_loc){model_path, 0, 0}, "tensor '%s': cannot open external data '%s': %s",
                 tname, path, strerror(errno));
  } else {
    long long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || offset > size || (long long)want > size - offset)
      rc = kl_fail(err, (kl_loc){model_path, 0, 0},
                   "tensor '%s': external data '%s' has %lld bytes; offset %lld + %zu is past its end",
                   tname, path, size, offset, want);
    else if (!(*raw = malloc(want ? want : 1)))
      abort();
    else if (fseek(f, offset, SEEK_SET) != 0 || fread(*raw, 1, want, f) != want)
      rc = kl_fail(err, (kl_loc){model_path, 0, 0}, "tensor '%s': reading '%s' failed", tname, path);
    fclose(f);
  }
  free(path);
  return rc;
}

int kl_onnx_tensor_data(const Onnx__TensorProto *t, const char *model_path,
                        kl_dtype *dtype, kl_shape *shape, void **raw,
                        kl_error *err) {
  kl_loc loc = {model_path, 0, 0};
  const char *name = t->name ? t->name : "?";
  *raw = NULL;
  if (!t->has_data_type || kl_onnx_dtype(t->data_type, dtype))
  {
    kl_fail(err, loc, "tensor '%s': data type %s is not supported", name,
            onnx_type_name(t->has_data_type ? t->data_type : 0));
    err->unsupported = true;
    return -1;
  }
  if (t->n_dims > KL_MAX_RANK)
    return kl_fail(err, loc, "tensor '%s': rank %zu is above the limit of %d", name, t->n_dims,
                   KL_MAX_RANK);
  shape->rank = (int)t->n_dims;
  int64_t numel = 1;
  for (size_t d = 0; d < t->n_dims; d++) {
    int64_t v = t->dims[d];
    if (v < 0 || v > KL_MAX_NUMEL || (v && numel > KL_MAX_NUMEL / v))
      return kl_fail(err, loc, "tensor '%s': dims are negative or hold more than %lld elements",
                     name, (long long)KL_MAX_NUMEL);
    shape->dims[d] = v;
    numel *= v;
  }
  size_t esize = kl_dtype_size(*dtype), bytes = (size_t)numel * esize;
  unsigned char *out = NULL;
  int rc = 0;
  /* Sizes are checked before anything is allocated: a few bytes of
   * protobuf must not make us allocate gigabytes. */
  if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    rc = read_external(t, model_path, bytes, &out, err);
  } else if (t->has_raw_data) {
    if (t->raw_data.len != bytes)
      rc = kl_fail(err, loc, "tensor '%s': raw_data has %zu bytes, but %s%s needs %zu", name,
                   t->raw_data.len, kl_dtype_name(*dtype),
                   kl_shape_str(shape, (char[128]){0}, 128), bytes);
    else if (!(out = malloc(bytes ? bytes : 1)))
      abort();
    else if (bytes)
      memcpy(out, t->raw_data.data, bytes);
  } else {
    /* Typed fields: f32 in float_data; f64 in double_data; i64 in
     * int64_data; u32 and u64 in uint64_data; everything narrower (and
     * f16/bf16 bit patterns) in int32_data. */
    size_t have;
    switch (*dtype) {
    case KL_F32: have = t->n_float_data; break;
    case KL_F64: have = t->n_double_data; break;
    case KL_I64: have = t->n_int64_data; break;
    case KL_U32: case KL_U64: have = t->n_uint64_data; break;
    default: have = t->n_int32_data; break;
    }
    if (have != (size_t)numel) {
      rc = kl_fail(err, loc, "tensor '%s': holds %zu values, but its shape needs %lld", name,
                   have, (long long)numel);
    } else {
      if (!(out = malloc(bytes ? bytes : 1))) abort();
      for (int64_t i = 0; i < numel; i++) {
        unsigned char *p = out + (size_t)i * esize;
        switch (*dtype) {
        case KL_F32: memcpy(p, &t->float_data[i], 4); break;
        case KL_F64: memcpy(p, &t->double_data[i], 8); break;
        case KL_I64: memcpy(p, &t->int64_data[i], 8); break;
        case KL_I32: memcpy(p, &t->int32_data[i], 4); break;
        case KL_F16:
        case KL_BF16: { uint16_t h = (uint16_t)t->int32_data[i]; memcpy(p, &h, 2); break; }
        case KL_I8: *p = (unsigned char)(int8_t)t->int32_data[i]; break;
        case KL_BOOL: *p = t->int32_data[i] != 0; break;
        case KL_U8: *p = (unsigned char)t->int32_data[i]; break;
        case KL_I16: case KL_U16: { uint16_t h = (uint16_t)t->int32_data[i]; memcpy(p, &h, 2); break; }
        case KL_U32: { uint32_t x = (uint32_t)t->uint64_data[i]; memcpy(p, &x, 4); break; }
        case KL_U64: memcpy(p, &t->uint64_data[i], 8); break;
        default: break;
        }
      }
    }
  }
  if (rc) {
    free(out);
    return rc;
  }
  *raw = out;
  return 0;
}

/* Whole file into memory (ONNX files and .pb tensors). */
unsigned char *kl_onnx_read_file(const char *path, size_t *len, kl_error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    kl_fail(err, (kl_loc){0}, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0, got;
  unsigned char *buf = malloc(cap);
  if (!buf) abort();
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      if (cap >= ((size_t)1 << 31)) { /* protobuf's own limit is 2 GiB */
        fclose(f);
        free(buf);
        kl_fail(err, (kl_loc){path, 0, 0}, "the file is larger than 2 GiB");
        return NULL;
      }
      unsigned char *grown = realloc(buf, cap *= 2);
      if (!grown) abort();
      buf = grown;
    }
  }
  fclose(f);
  *len = n;
  return buf;
}

kl_tensor *kl_read_tensor_pb(const char *path, char **name, kl_error *err) {
  size_t len;
  unsigned char *buf = kl_onnx_read_file(path, &len, err);
  if (!buf) return NULL;
  Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, buf);
  free(buf);
  if (!t) {
    kl_fail(err, (kl_loc){path, 0, 0}, "not a TensorProto (.pb) file");
    return NULL;
  }
  kl_dtype dt;
  kl_shape s;
  void *raw;
  kl_tensor *out = NULL;
  if (kl_onnx_tensor_data(t, path, &dt, &s, &raw, err) == 0) {
    out = kl_tensor_new(dt, &s);
    if (kl_tensor_from_raw(out, raw)) {
      kl_fail(err, (kl_loc){path, 0, 0},
              "an i64 value lies beyond 2^53, which the interpreter cannot represent exactly");
      kl_tensor_free(out);
      out = NULL;
    }
    free(raw);
    if (out && name) *name = t->name && *t->name ? strdup(t->name) : NULL;
  }
  onnx__tensor_proto__free_unpacked(t, NULL);
  return out;
}
