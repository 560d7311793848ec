/* onnx_map.c - an .onnx file mapped rather than read, with its weights left
 * where they lie.  protobuf-c copies every bytes field when it parses, so a
 * model's embedded weights (initializers' raw_data) would be in memory twice
 * while loading and once after.  Instead the wire format is walked first:
 * the model is re-encoded without the raw_data of the main graph's
 * initializers (a few KB of protobuf to parse), and where each one lies in
 * the file is noted, for params to point into the mapping. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"

enum { MODEL_GRAPH = 7, GRAPH_INITIALIZER = 5, TENSOR_RAW_DATA = 9, WIRE_LEN = 2 };

typedef struct {
  unsigned char *p;
  size_t len, cap;
} bytes;

static void put(bytes *b, const void *src, size_t n) {
  if (b->len + n > b->cap) {
    b->cap = (b->len + n) * 2 + 64;
    unsigned char *grown = realloc(b->p, b->cap);
    if (!grown) abort();
    b->p = grown;
  }
  if (n) memcpy(b->p + b->len, src, n);
  b->len += n;
}

static void put_varint(bytes *b, uint64_t v) {
  unsigned char tmp[10];
  size_t n = 0;
  do {
    tmp[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  put(b, tmp, n);
}

static bool get_varint(const unsigned char *p, size_t end, size_t *pos, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < end; shift += 7) {
    unsigned char c = p[(*pos)++];
    *v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

/* One field on the wire: [start, end) in all, its payload from `data`
 * (for length-delimited fields). */
typedef struct {
  uint64_t number;
  int wire;
  size_t start, data, end;
} field;

/* The field at *pos (then moved past it); false on anything malformed or
 * a deprecated group, which the caller leaves to protobuf-c to report. */
static bool next_field(const unsigned char *p, size_t end, size_t *pos, field *f) {
  uint64_t key, n;
  f->start = *pos;
  if (!get_varint(p, end, pos, &key)) return false;
  f->number = key >> 3;
  f->wire = (int)(key & 7);
  switch (f->wire) {
  case 0: if (!get_varint(p, end, pos, &n)) return false; break;
  case 1: n = 8; if (end - *pos < n) return false; *pos += n; break;
  case 5: n = 4; if (end - *pos < n) return false; *pos += n; break;
  case WIRE_LEN:
    if (!get_varint(p, end, pos, &n) || n > end - *pos) return false;
    *pos += n;
    break;
  default: return false;
  }
  f->data = f->wire == WIRE_LEN ? *pos - n : f->start;
  f->end = *pos;
  return true;
}

/* A TensorProto without its raw_data, noting where the last one (the one
 * protobuf keeps) lies. */
static bool strip_tensor(const unsigned char *p, const field *t, bytes *out, kl_onnx_span *span) {
  bytes tmp = {0};
  size_t pos = t->data;
  field f;
  *span = (kl_onnx_span){0};
  while (pos < t->end) {
    if (!next_field(p, t->end, &pos, &f)) {
      free(tmp.p);
      return false;
    }
    if (f.number == TENSOR_RAW_DATA && f.wire == WIRE_LEN)
      *span = (kl_onnx_span){f.data, f.end - f.data, true};
    else
      put(&tmp, p + f.start, f.end - f.start);
  }
  put_varint(out, GRAPH_INITIALIZER << 3 | WIRE_LEN);
  put_varint(out, tmp.len);
  put(out, tmp.p, tmp.len);
  free(tmp.p);
  return true;
}

/* The GraphProto payload with its initializers stripped, into out. */
static bool strip_graph(const unsigned char *p, const field *g, bytes *out, kl_onnx_span **spans,
                        int *nspans) {
  size_t pos = g->data;
  field f;
  int cap = 0;
  while (pos < g->end) {
    if (!next_field(p, g->end, &pos, &f)) return false;
    if (f.number != GRAPH_INITIALIZER || f.wire != WIRE_LEN) {
      put(out, p + f.start, f.end - f.start);
      continue;
    }
    if (*nspans == cap) {
      cap = cap ? 2 * cap : 64;
      kl_onnx_span *grown = realloc(*spans, (size_t)cap * sizeof **spans);
      if (!grown) abort();
      *spans = grown;
    }
    if (!strip_tensor(p, &f, out, &(*spans)[*nspans])) return false;
    (*nspans)++;
  }
  return true;
}

/* The model re-encoded without its main graph's raw_data, or false when
 * the wire is not as expected (then it is parsed as it is). */
static bool strip_model(const unsigned char *p, size_t len, bytes *out, kl_onnx_span **spans,
                        int *nspans) {
  size_t pos = 0;
  field f, graph = {0};
  int ngraphs = 0;
  while (pos < len) {
    if (!next_field(p, len, &pos, &f)) return false;
    if (f.number == MODEL_GRAPH && f.wire == WIRE_LEN) graph = f, ngraphs++;
  }
  if (ngraphs != 1) return false; /* protobuf would merge several */
  bytes g = {0};
  if (!strip_graph(p, &graph, &g, spans, nspans)) {
    free(g.p);
    return false;
  }
  put(out, p, graph.start);
  put_varint(out, MODEL_GRAPH << 3 | WIRE_LEN);
  put_varint(out, g.len);
  put(out, g.p, g.len);
  put(out, p + graph.end, len - graph.end);
  free(g.p);
  return true;
}

Onnx__ModelProto *kl_onnx_unpack_file(const char *path, kl_onnx_file *file, kl_error *err) {
  memset(file, 0, sizeof *file);
  size_t len = 0;
  unsigned char *base = kl_map_file(path, &len);
  if (!base) { /* not a regular file, or mmap refused: read it */
    unsigned char *data = kl_onnx_read_file(path, &len, err);
    if (!data) return NULL;
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, data);
    free(data);
    if (!m) kl_fail(err, (kl_loc){path, 0, 0}, "not an ONNX model (the protobuf does not parse)");
    return m;
  }
  bytes stripped = {0};
  Onnx__ModelProto *m;
  if (strip_model(base, len, &stripped, &file->spans, &file->nspans)) {
    m = onnx__model_proto__unpack(NULL, stripped.len, stripped.p);
  } else {
    free(file->spans);
    file->spans = NULL;
    file->nspans = 0;
    m = onnx__model_proto__unpack(NULL, len, base);
  }
  free(stripped.p);
  if (!m) {
    kl_fail(err, (kl_loc){path, 0, 0}, "not an ONNX model (the protobuf does not parse)");
    kl_onnx_file_close(file);
    kl_unmap_file(base, len);
    return NULL;
  }
  file->base = base;
  file->len = len;
  return m;
}

void kl_onnx_file_close(kl_onnx_file *file) {
  kl_unmap_file(file->base, file->len);
  free(file->spans);
  memset(file, 0, sizeof *file);
}
