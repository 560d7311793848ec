/* safetensors.c - read and write .safetensors files.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON, then
 * the data section.  The JSON object maps each tensor name to
 *     {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
 * with offsets relative to the data section, plus an optional
 * "__metadata__" entry (string -> string) that we ignore.  The JSON is
 * parsed and written with jansson, which keeps object keys in insertion
 * order, so tensors read back in header order and are written in the
 * caller's order.
 *
 * The reader must survive hostile files: the header length is bounded by
 * the file size, every number from the JSON is range-checked before use, and
 * each tensor's byte range must lie inside the data section and match its
 * shape and dtype exactly.  Overlapping or unused byte ranges are tolerated,
 * since they cannot make us read out of bounds. */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "io_util.h"

/* The reference implementation's limit; keeps a corrupt length from
 * turning into a huge allocation. */
#define MAX_HEADER_LEN ((uint64_t)100 * 1000 * 1000)

static const char *const st_dtypes[KRT_DTYPE_COUNT] = {
    [KRT_F32] = "F32", [KRT_F16] = "F16", [KRT_BF16] = "BF16",
    [KRT_F64] = "F64", [KRT_I8] = "I8",   [KRT_I32] = "I32",
    [KRT_I64] = "I64", [KRT_BOOL] = "BOOL", [KRT_U8] = "U8",
    [KRT_I16] = "I16", [KRT_U16] = "U16", [KRT_U32] = "U32", [KRT_U64] = "U64",
    /* the one-byte floats safetensors names; its packed sub-byte types are
     * not read (Kiln holds one element a byte) */
    [KRT_F8E4M3FN] = "F8_E4M3", [KRT_F8E5M2] = "F8_E5M2", [KRT_F8E8M0] = "F8_E8M0",
};

/* ---- reading --------------------------------------------------------- */
typedef struct {
  const char *path;
  char *errbuf;
  size_t errlen;
  FILE *f;
  int64_t data_start, data_len; /* the data section within the file */
  int64_t *offsets; /* index only: each tensor's file offset, no data read */
  const krt_named_tensor *items; /* the set being filled (for offsets) */
} reader;

/* Reads the JSON integer `v` into *out if it lies in [0, max]. */
static bool get_int(const json_t *v, int64_t max, int64_t *out) {
  if (!json_is_integer(v)) return false;
  json_int_t i = json_integer_value(v);
  if (i < 0 || i > max) return false;
  *out = (int64_t)i;
  return true;
}

/* Parses one header entry and reads its data into nt->tensor. */
static int read_entry(reader *r, const char *name, const json_t *e,
                      krt_named_tensor *nt) {
  const char *path = r->path;
  char *eb = r->errbuf;
  size_t el = r->errlen;
  krt_tensor t = {0};

  if (!json_is_object(e))
    return krt_fail(eb, el, path, "tensor '%s': entry is not an object", name);

  const char *dt = json_string_value(json_object_get(e, "dtype"));
  if (!dt)
    return krt_fail(eb, el, path, "tensor '%s': missing or non-string 'dtype'",
                    name);
  int d = 0;
  while (d < KRT_DTYPE_COUNT && (!st_dtypes[d] || strcmp(dt, st_dtypes[d]) != 0)) d++;
  if (d == KRT_DTYPE_COUNT)
    return krt_fail(eb, el, path, "tensor '%s': unsupported dtype '%s'", name,
                    dt);
  t.dtype = (krt_dtype)d;

  const json_t *shape = json_object_get(e, "shape");
  if (!json_is_array(shape))
    return krt_fail(eb, el, path, "tensor '%s': missing or non-array 'shape'",
                    name);
  if (json_array_size(shape) > KRT_MAX_RANK)
    return krt_fail(eb, el, path, "tensor '%s': more than %d dimensions", name,
                    KRT_MAX_RANK);
  t.rank = (int)json_array_size(shape);
  for (int i = 0; i < t.rank; i++)
    if (!get_int(json_array_get(shape, (size_t)i), KRT_MAX_NUMEL,
                 &t.dims[i]))
      return krt_fail(eb, el, path,
                      "tensor '%s': shape dimension %d is not an integer in "
                      "[0, %lld]", name, i, (long long)KRT_MAX_NUMEL);
  int64_t numel = krt_tensor_numel(&t);
  if (numel < 0)
    return krt_fail(eb, el, path, "tensor '%s': shape has more than %lld "
                    "elements", name, (long long)KRT_MAX_NUMEL);

  const json_t *offs = json_object_get(e, "data_offsets");
  int64_t begin, end;
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !get_int(json_array_get(offs, 0), INT64_MAX, &begin) ||
      !get_int(json_array_get(offs, 1), INT64_MAX, &end))
    return krt_fail(eb, el, path, "tensor '%s': 'data_offsets' must be two "
                    "non-negative integers", name);
  if (begin > end || end > r->data_len)
    return krt_fail(eb, el, path, "tensor '%s': data_offsets [%lld, %lld] out "
                    "of bounds (data section is %lld bytes)", name,
                    (long long)begin, (long long)end, (long long)r->data_len);
  /* numel < 2^31 and sizes <= 8: no overflow. */
  int64_t nbytes = numel * (int64_t)krt_dtype_size(t.dtype);
  if (end - begin != nbytes)
    return krt_fail(eb, el, path, "tensor '%s': data_offsets span %lld bytes "
                    "but shape and dtype need %lld", name,
                    (long long)(end - begin), (long long)nbytes);

  char *copy = strdup(name);
  if (r->offsets) { /* the caller maps the file instead */
    if (!copy) return krt_fail(eb, el, path, "out of memory for tensor '%s'", name);
    r->offsets[nt - r->items] = r->data_start + begin;
    nt->name = copy;
    nt->tensor = t;
    return 0;
  }
  t.data = malloc(nbytes ? (size_t)nbytes : 1);
  if (!copy || !t.data) {
    free(copy);
    free(t.data);
    return krt_fail(eb, el, path, "out of memory for tensor '%s'", name);
  }
  if (fseeko(r->f, (off_t)(r->data_start + begin), SEEK_SET) != 0 ||
      !krt_read_data(r->f, &t, (size_t)nbytes)) {
    free(copy);
    free(t.data);
    return krt_fail(eb, el, path, "tensor '%s': read error", name);
  }
  nt->name = copy;
  nt->tensor = t;
  return 0;
}

static int read_set(const char *path, krt_tensor_set *out, int64_t **offsets, char *errbuf,
                    size_t errlen) {
  if (!out) return krt_fail(errbuf, errlen, path, "no output set");
  memset(out, 0, sizeof *out);
  if (offsets) *offsets = NULL;
  if (!path) return krt_fail(errbuf, errlen, path, "no path");

  int rc = -1;
  char *hdr = NULL;
  json_t *root = NULL;
  krt_tensor_set set = {0};
  int64_t size;
  FILE *f = krt_open_read(path, &size, errbuf, errlen);
  if (!f) return -1;

  unsigned char lenb[8];
  if (size < 8 || !krt_read_exact(f, lenb, 8)) {
    krt_fail(errbuf, errlen, path, "not a .safetensors file (shorter than 8 "
             "bytes)");
    goto done;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | lenb[i];
  if (n > MAX_HEADER_LEN) {
    krt_fail(errbuf, errlen, path, "header length %llu is over the 100 MB "
             "limit", (unsigned long long)n);
    goto done;
  }
  if ((int64_t)n > size - 8) {
    krt_fail(errbuf, errlen, path, "truncated: header length is %llu bytes, "
             "file has %lld after the length", (unsigned long long)n,
             (long long)(size - 8));
    goto done;
  }
  hdr = krt_read_header(f, (size_t)n, path, errbuf, errlen);
  if (!hdr) goto done;
  json_error_t jerr;
  root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    krt_fail(errbuf, errlen, path, "bad JSON header at byte %d: %s",
             jerr.position, jerr.text);
    goto done;
  }
  if (!json_is_object(root)) {
    krt_fail(errbuf, errlen, path, "JSON header is not an object");
    goto done;
  }

  /* n <= 100 MB bounds the entry count far below INT_MAX. */
  size_t count = json_object_size(root);
  set.items = calloc(count ? count : 1, sizeof *set.items);
  if (!set.items) {
    krt_fail(errbuf, errlen, path, "out of memory");
    goto done;
  }
  int64_t *offs = offsets ? calloc(count ? count : 1, sizeof *offs) : NULL;
  if (offsets && !offs) {
    krt_fail(errbuf, errlen, path, "out of memory");
    goto done;
  }
  reader r = {path, errbuf, errlen, f, 8 + (int64_t)n, size - 8 - (int64_t)n, offs, set.items};
  const char *name;
  json_t *e;
  json_object_foreach(root, name, e) {
    if (strcmp(name, "__metadata__") == 0) continue;
    if (read_entry(&r, name, e, &set.items[set.count])) {
      free(offs);
      goto done;
    }
    set.count++;
  }
  *out = set;
  set = (krt_tensor_set){0};
  if (offsets) *offsets = offs;
  rc = 0;
done:
  krt_tensor_set_free(&set);
  json_decref(root);
  free(hdr);
  fclose(f);
  return rc;
}

int krt_safetensors_read(const char *path, krt_tensor_set *out, char *errbuf,
                         size_t errlen) {
  return read_set(path, out, NULL, errbuf, errlen);
}

int krt_safetensors_index(const char *path, krt_tensor_set *out, int64_t **offsets,
                          char *errbuf, size_t errlen) {
  return read_set(path, out, offsets, errbuf, errlen);
}

/* ---- writing --------------------------------------------------------- */
/* Builds the header object; fails on a bad tensor or name. */
static json_t *build_header(const char *path, const krt_tensor_set *set,
                            char *errbuf, size_t errlen) {
  json_t *root = json_object();
  if (!root) {
    krt_fail(errbuf, errlen, path, "out of memory");
    return NULL;
  }
  int64_t off = 0;
  for (int i = 0; i < set->count; i++) {
    const krt_named_tensor *nt = &set->items[i];
    const krt_tensor *t = &nt->tensor;
    int64_t numel = krt_tensor_numel(t);
    if (!nt->name || strcmp(nt->name, "__metadata__") == 0 ||
        json_object_get(root, nt->name)) {
      krt_fail(errbuf, errlen, path, "tensor %d: missing, reserved or "
               "duplicate name '%s'", i, nt->name ? nt->name : "(null)");
      goto bad;
    }
    if (krt_dtype_size(t->dtype) == 0 || numel < 0 || !st_dtypes[t->dtype] ||
        (numel > 0 && !t->data)) {
      krt_fail(errbuf, errlen, path, "tensor '%s': invalid tensor (bad dtype or one "
               "safetensors cannot hold, "
               "rank, dims or data)", nt->name);
      goto bad;
    }
    int64_t nbytes = numel * (int64_t)krt_dtype_size(t->dtype);
    if (off > INT64_MAX - nbytes) {
      krt_fail(errbuf, errlen, path, "tensors total more than 2^63 bytes");
      goto bad;
    }
    json_t *shape = json_array();
    for (int d = 0; shape && d < t->rank; d++)
      if (json_array_append_new(shape, json_integer(t->dims[d]))) {
        json_decref(shape);
        shape = NULL;
      }
    /* "o" hands shape over to the new object, even when packing fails. */
    json_t *e = shape ? json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                  st_dtypes[t->dtype], "shape", shape,
                                  "data_offsets", (json_int_t)off,
                                  (json_int_t)(off + nbytes))
                      : NULL;
    if (!e || json_object_set_new(root, nt->name, e)) {
      krt_fail(errbuf, errlen, path, "tensor '%s': cannot add to header (name "
               "not UTF-8, or out of memory)", nt->name);
      goto bad;
    }
    off += nbytes;
  }
  return root;
bad:
  json_decref(root);
  return NULL;
}

int krt_safetensors_write(const char *path, const krt_tensor_set *set,
                          char *errbuf, size_t errlen) {
  if (!path) return krt_fail(errbuf, errlen, path, "no path");
  if (!set || set->count < 0 || (set->count > 0 && !set->items))
    return krt_fail(errbuf, errlen, path, "invalid tensor set");
  json_t *root = build_header(path, set, errbuf, errlen);
  if (!root) return -1;
  char *js = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!js) return krt_fail(errbuf, errlen, path, "cannot serialise the header");

  /* Pad with spaces so the data section starts 8-byte aligned. */
  size_t len = strlen(js), pad = (8 - len % 8) % 8;
  uint64_t n = len + pad;
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(n >> (8 * i));

  FILE *f = krt_open_write(path, errbuf, errlen);
  if (!f) {
    free(js);
    return -1;
  }
  bool ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(js, 1, len, f) == len &&
            fprintf(f, "%*s", (int)pad, "") == (int)pad;
  for (int i = 0; ok && i < set->count; i++) {
    const krt_tensor *t = &set->items[i].tensor;
    size_t nbytes = (size_t)krt_tensor_numel(t) * krt_dtype_size(t->dtype);
    ok = nbytes == 0 || fwrite(t->data, 1, nbytes, f) == nbytes;
  }
  int rc = krt_close_write(f, ok, path, errbuf, errlen);
  free(js);
  return rc;
}

/* ---- sets ------------------------------------------------------------ */
const krt_tensor *krt_tensor_set_find(const krt_tensor_set *set,
                                      const char *name) {
  if (!set || !name) return NULL;
  for (int i = 0; i < set->count; i++)
    if (set->items[i].name && strcmp(set->items[i].name, name) == 0)
      return &set->items[i].tensor;
  return NULL;
}

void krt_tensor_set_free(krt_tensor_set *set) {
  if (!set) return;
  for (int i = 0; i < set->count; i++) {
    free(set->items[i].name);
    krt_tensor_free(&set->items[i].tensor);
  }
  free(set->items);
  set->items = NULL;
  set->count = 0;
}
