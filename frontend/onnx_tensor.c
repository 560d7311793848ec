/* onnx_tensor.c - ONNX TensorProto contents: dtypes, raw_data and the typed
 * fields, external data files, and .pb tensor files. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/pb/kilnrt_pb.h"
#include "../runtime/pb/onnx_tensor.h"
#include "onnx_internal.h"

int kl_onnx_dtype(int onnx_type, kl_dtype *out) {
  krt_dtype t;
  if (krt_onnx_dtype(onnx_type, &t)) return -1;
  *out = (kl_dtype)t; /* the two enums share their order */
  return 0;
}

/* [offset, offset+length) of an external data file that must lie in the
 * model's folder, where it lies: in a mapping of the file that g keeps. */
static int map_external(const Onnx__TensorProto *t, const char *model_path, kl_graph *g,
                        size_t want, const void **raw, kl_error *err) {
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
  size_t size = 0;
  const unsigned char *base = kl_graph_map_file(g, path, &size);
  int rc = 0;
  if (!base)
    rc = kl_fail(err, (kl_loc){model_path, 0, 0}, "tensor '%s': cannot open external data '%s': %s",
                 tname, path, strerror(errno));
  else if ((unsigned long long)offset > size || want > size - (size_t)offset)
    rc = kl_fail(err, (kl_loc){model_path, 0, 0},
                 "tensor '%s': external data '%s' has %lld bytes; offset %lld + %zu is past its end",
                 tname, path, (long long)size, offset, want);
  else
    *raw = base + offset;
  free(path);
  return rc;
}

int kl_onnx_tensor_data(kl_onnx_ctx *c, const Onnx__TensorProto *t, const kl_onnx_span *span,
                        kl_dtype *dtype, kl_shape *shape, const void **raw, void **owned) {
  kl_loc loc = {c->path, 0, 0};
  char msg[400];
  krt_tensor h;
  *raw = NULL;
  *owned = NULL;
  int rc = krt_onnx_tensor_header(t, &h, msg, sizeof msg);
  if (rc) {
    kl_fail(c->err, loc, "%s", msg);
    c->err->unsupported = rc == -2;
    return -1;
  }
  *dtype = (kl_dtype)h.dtype;
  shape->rank = h.rank;
  for (int d = 0; d < h.rank; d++) shape->dims[d] = h.dims[d];
  size_t bytes = (size_t)krt_tensor_numel(&h) * krt_dtype_size(h.dtype);
  Onnx__TensorProto with_raw;
  if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
    return map_external(t, c->path, c->g, bytes, raw, c->err);
  /* the 4- and 2-bit types are packed in the file: unpacked below */
  bool packed = krt_dtype_bits(h.dtype) < 8;
  if (packed && t->has_data_location &&
      t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    kl_fail(c->err, loc, "tensor '%s': %s in external data is not supported",
            t->name ? t->name : "?", krt_dtype_name(h.dtype));
    c->err->unsupported = true;
    return -1;
  }
  if (span && span->has) { /* raw_data, left in the mapped model file */
    *raw = c->file->base + span->off;
    if (span->len == bytes && !packed) return 0;
    /* the runtime's check, and its words, on the bytes where they are */
    with_raw = *t;
    with_raw.has_raw_data = 1;
    with_raw.raw_data = (ProtobufCBinaryData){span->len, (uint8_t *)*raw};
    t = &with_raw;
  }
  if (krt_onnx_tensor_payload(t, &h, owned, msg, sizeof msg))
    return kl_fail(c->err, loc, "%s", msg);
  *raw = *owned;
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

kl_tensor *kl_read_tensor_pb(const char *path, kl_error *err) {
  krt_tensor raw;
  char msg[600];
  if (krt_pb_read(path, &raw, msg, sizeof msg)) {
    kl_fail(err, (kl_loc){0}, "%s", msg);
    return NULL;
  }
  kl_shape s = {.rank = raw.rank};
  for (int d = 0; d < raw.rank; d++) s.dims[d] = raw.dims[d];
  kl_tensor *out = kl_tensor_new((kl_dtype)raw.dtype, &s);
  if (kl_tensor_from_raw(out, raw.data)) {
    kl_fail(err, (kl_loc){path, 0, 0},
            "a 64-bit integer lies beyond 2^53, which cannot be held exactly");
    kl_tensor_free(out);
    out = NULL;
  }
  krt_tensor_free(&raw);
  return out;
}
