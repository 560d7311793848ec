/* npy.c - read and write NumPy .npy files.
 *
 * Hand-written: the format is tiny.  A file is the magic "\x93NUMPY", a
 * version byte pair, a little-endian header length (2 bytes in version 1.0,
 * 4 bytes in 2.0 and 3.0), a Python dict literal padded with spaces and a
 * newline, such as
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * and then the raw array bytes.  We parse exactly that dict (the three keys
 * in any order, any whitespace, optional trailing commas) instead of Python
 * literals in general.
 *
 * bfloat16 has no NumPy descr, so krt_npy_write stores bf16 tensors as '<f4'
 * (every bf16 value is exactly a float32); such a file reads back as f32.
 * Neither has NumPy the one-byte types of ONNX (fp8, fp4, E8M0, 4- and 2-bit
 * integers): they are written one byte an element as Kiln holds them, the
 * floats as their raw codes in '|u1', the integers as their values in '|i1'
 * or '|u1' (ml_dtypes' arrays .view(np.uint8) give the same bytes); such a
 * file reads back as u8 or i8, and feeds an input of the type (exe_main.c,
 * kiln run).
 *
 * The reader must survive hostile files: every read is length-checked, the
 * header parser never leaves its buffer, and the data size is computed from
 * bounded dims and must match the rest of the file exactly. */
#define _POSIX_C_SOURCE 200809L

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_util.h"

#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
/* NumPy itself refuses headers over 10000 bytes by default; a legal header
 * for rank <= 8 is far smaller, so this only stops absurd allocations. */
#define MAX_HEADER_LEN (1 << 20)

/* Descrs for each dtype, as NumPy writes them.  bf16 has none. */
static const char *const descrs[KRT_DTYPE_COUNT] = {
    [KRT_F32] = "<f4", [KRT_F16] = "<f2", [KRT_F64] = "<f8",
    [KRT_I8] = "|i1",  [KRT_I32] = "<i4", [KRT_I64] = "<i8",
    [KRT_BOOL] = "|b1", [KRT_U8] = "|u1",  [KRT_I16] = "<i2", [KRT_U16] = "<u2",
    [KRT_U32] = "<u4", [KRT_U64] = "<u8",
};

/* ---- header dict parser ---------------------------------------------- */
typedef struct {
  const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
  while (c->p < c->end &&
         (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

static bool eat(cursor *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return true;
  }
  return false;
}

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static bool eat_word(cursor *c, const char *w) {
  size_t n = strlen(w);
  skip_ws(c);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
  const char *after = c->p + n;
  if (after < c->end && (is_digit(*after) || *after == '_' ||
                         ((*after | 0x20) >= 'a' && (*after | 0x20) <= 'z')))
    return false; /* "Falsey" is not False */
  c->p = after;
  return true;
}

/* A quoted string without escapes ('x' or "x"), copied into buf. */
static bool parse_str(cursor *c, char *buf, size_t n) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
  char q = *c->p++;
  size_t len = 0;
  for (; c->p < c->end && *c->p != q; c->p++) {
    if (*c->p == '\\' || len + 1 >= n) return false;
    buf[len++] = *c->p;
  }
  if (c->p >= c->end) return false;
  c->p++;
  buf[len] = '\0';
  return true;
}

static int parse_descr(const char *d, krt_dtype *dt, const char *path,
                       char *errbuf, size_t errlen) {
  for (int i = 0; i < KRT_DTYPE_COUNT; i++) {
    if (!descrs[i]) continue;
    /* Byte order is meaningless for one-byte types: accept any marker. */
    bool one_byte = descrs[i][0] == '|';
    if (strcmp(d, descrs[i]) == 0 ||
        (one_byte && d[0] && strchr("<>=|", d[0]) &&
         strcmp(d + 1, descrs[i] + 1) == 0)) {
      *dt = (krt_dtype)i;
      return 0;
    }
    if (d[0] == '>' && strcmp(d + 1, descrs[i] + 1) == 0)
      return krt_fail(errbuf, errlen, path,
                      "big-endian arrays ('%s') are not supported; save with "
                      "dtype '<%s'", d, d + 1);
  }
  return krt_fail(errbuf, errlen, path,
                  "unsupported dtype '%s' (supported: <f4 <f2 <f8 |i1 <i4 <i8 "
                  "|b1 |u1 <i2 <u2 <u4 <u8)", d);
}

static int parse_shape(cursor *c, krt_tensor *t, const char *path,
                       char *errbuf, size_t errlen) {
  if (!eat(c, '('))
    return krt_fail(errbuf, errlen, path, "malformed header: 'shape' is not a "
                                          "tuple");
  t->rank = 0;
  if (eat(c, ')')) return 0;
  for (;;) {
    skip_ws(c);
    if (c->p < c->end && *c->p == '-')
      return krt_fail(errbuf, errlen, path, "negative dimension in shape");
    if (c->p >= c->end || !is_digit(*c->p))
      return krt_fail(errbuf, errlen, path, "malformed header: bad 'shape'");
    int64_t v = 0;
    for (; c->p < c->end && is_digit(*c->p); c->p++) {
      int digit = *c->p - '0';
      if (v > (KRT_MAX_NUMEL - digit) / 10)
        return krt_fail(errbuf, errlen, path,
                        "shape dimension too large (more than %lld elements)",
                        (long long)KRT_MAX_NUMEL);
      v = v * 10 + digit;
    }
    if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 long: "3L" */
    if (t->rank == KRT_MAX_RANK)
      return krt_fail(errbuf, errlen, path, "more than %d dimensions",
                      KRT_MAX_RANK);
    t->dims[t->rank++] = v;
    if (eat(c, ')')) return 0;
    if (!eat(c, ','))
      return krt_fail(errbuf, errlen, path, "malformed header: bad 'shape'");
    if (eat(c, ')')) return 0; /* "(3,)" */
  }
}

/* Fills t->dtype, rank and dims from the header dict in [p, end). */
static int parse_header(const char *p, const char *end, krt_tensor *t,
                        const char *path, char *errbuf, size_t errlen) {
  cursor c = {p, end};
  bool have_descr = false, have_order = false, have_shape = false;
  if (!eat(&c, '{'))
    return krt_fail(errbuf, errlen, path, "malformed header: expected a dict");
  while (!eat(&c, '}')) {
    char key[32], descr[32];
    if (!parse_str(&c, key, sizeof key) || !eat(&c, ':'))
      return krt_fail(errbuf, errlen, path,
                      "malformed header: expected a quoted key and ':'");
    bool *seen;
    if (strcmp(key, "descr") == 0) {
      seen = &have_descr;
      skip_ws(&c);
      if (c.p < c.end && *c.p == '[')
        return krt_fail(errbuf, errlen, path,
                        "structured dtypes are not supported");
      if (!parse_str(&c, descr, sizeof descr))
        return krt_fail(errbuf, errlen, path, "malformed header: bad 'descr'");
      if (parse_descr(descr, &t->dtype, path, errbuf, errlen)) return -1;
    } else if (strcmp(key, "fortran_order") == 0) {
      seen = &have_order;
      if (eat_word(&c, "True"))
        return krt_fail(errbuf, errlen, path,
                        "Fortran-order arrays are not supported");
      if (!eat_word(&c, "False"))
        return krt_fail(errbuf, errlen, path,
                        "malformed header: bad 'fortran_order'");
    } else if (strcmp(key, "shape") == 0) {
      seen = &have_shape;
      if (parse_shape(&c, t, path, errbuf, errlen)) return -1;
    } else {
      return krt_fail(errbuf, errlen, path,
                      "malformed header: unexpected key '%s'", key);
    }
    if (*seen)
      return krt_fail(errbuf, errlen, path, "malformed header: duplicate key "
                                            "'%s'", key);
    *seen = true;
    if (eat(&c, '}')) break;
    if (!eat(&c, ','))
      return krt_fail(errbuf, errlen, path,
                      "malformed header: expected ',' or '}' after '%s'", key);
  }
  skip_ws(&c);
  if (c.p != c.end)
    return krt_fail(errbuf, errlen, path,
                    "malformed header: unexpected text after the dict");
  if (!have_descr || !have_order || !have_shape)
    return krt_fail(errbuf, errlen, path, "malformed header: missing '%s'",
                    !have_descr ? "descr"
                    : !have_order ? "fortran_order"
                                  : "shape");
  return 0;
}

/* ---- reading --------------------------------------------------------- */
int krt_npy_read_header(FILE *f, int64_t size, const char *path,
                        krt_npy_header *h, char *errbuf, size_t errlen) {
  memset(h, 0, sizeof *h);
  unsigned char pre[12];
  if (size < 10 || !krt_read_exact(f, pre, 10))
    return krt_fail(errbuf, errlen, path, "not a .npy file (too short)");
  if (memcmp(pre, MAGIC, MAGIC_LEN) != 0)
    return krt_fail(errbuf, errlen, path, "not a .npy file (bad magic)");
  int major = pre[6], minor = pre[7];
  int64_t off, hlen;
  if (major == 1 && minor == 0) {
    off = 10;
    hlen = pre[8] | pre[9] << 8;
  } else if ((major == 2 || major == 3) && minor == 0) {
    off = 12;
    if (!krt_read_exact(f, pre + 10, 2))
      return krt_fail(errbuf, errlen, path,
                      "truncated: file ends inside the preamble");
    hlen = (int64_t)pre[8] | (int64_t)pre[9] << 8 | (int64_t)pre[10] << 16 |
           (int64_t)pre[11] << 24;
  } else {
    return krt_fail(errbuf, errlen, path,
                    "unsupported .npy format version %d.%d", major, minor);
  }
  if (hlen > size - off)
    return krt_fail(errbuf, errlen, path,
                    "truncated: header length is %lld bytes, file has %lld "
                    "after the preamble", (long long)hlen,
                    (long long)(size - off));
  if (hlen > MAX_HEADER_LEN)
    return krt_fail(errbuf, errlen, path, "header too large (%lld bytes)",
                    (long long)hlen);
  char *hdr = krt_read_header(f, (size_t)hlen, path, errbuf, errlen);
  if (!hdr) return -1;
  krt_tensor t = {0};
  int rc = parse_header(hdr, hdr + hlen, &t, path, errbuf, errlen);
  free(hdr);
  if (rc) return -1;
  h->dtype = t.dtype;
  h->rank = t.rank;
  memcpy(h->dims, t.dims, sizeof h->dims);
  h->data_offset = off + hlen;
  return 0;
}

int krt_npy_check_data_size(const krt_npy_header *h, int64_t size,
                            int64_t nbytes, const char *path, char *errbuf,
                            size_t errlen) {
  int64_t avail = size - h->data_offset;
  if (avail == nbytes) return 0;
  return krt_fail(errbuf, errlen, path, "%s: header says %lld bytes of data, "
                  "file has %lld", avail < nbytes ? "truncated" : "trailing bytes",
                  (long long)nbytes, (long long)avail);
}

int krt_npy_read(const char *path, krt_tensor *out, char *errbuf,
                 size_t errlen) {
  if (!out) return krt_fail(errbuf, errlen, path, "no output tensor");
  memset(out, 0, sizeof *out);
  if (!path) return krt_fail(errbuf, errlen, path, "no path");

  int rc = -1;
  krt_tensor t = {0};
  krt_npy_header h;
  int64_t size;
  FILE *f = krt_open_read(path, &size, errbuf, errlen);
  if (!f) return -1;
  if (krt_npy_read_header(f, size, path, &h, errbuf, errlen)) goto done;
  t.dtype = h.dtype;
  t.rank = h.rank;
  memcpy(t.dims, h.dims, sizeof t.dims);

  int64_t numel = krt_tensor_numel(&t);
  if (numel < 0) {
    krt_fail(errbuf, errlen, path, "shape has more than %lld elements",
             (long long)KRT_MAX_NUMEL);
    goto done;
  }
  /* numel < 2^31 and sizes <= 8: no overflow. */
  int64_t nbytes = numel * (int64_t)krt_dtype_size(t.dtype);
  if (krt_npy_check_data_size(&h, size, nbytes, path, errbuf, errlen))
    goto done;
  t.data = malloc(nbytes ? (size_t)nbytes : 1);
  if (!t.data) {
    krt_fail(errbuf, errlen, path, "out of memory for %lld bytes",
             (long long)nbytes);
    goto done;
  }
  if (!krt_read_data(f, &t, (size_t)nbytes)) {
    krt_fail(errbuf, errlen, path, "read error in data");
    goto done;
  }
  *out = t;
  t.data = NULL;
  rc = 0;
done:
  free(t.data);
  fclose(f);
  return rc;
}

/* ---- writing --------------------------------------------------------- */
static const char *write_descr(krt_dtype t) {
  if (t == KRT_BF16) return "<f4";
  if (t == KRT_I4 || t == KRT_I2) return "|i1";
  if (krt_dtype_is_small_float(t) || t == KRT_U4 || t == KRT_U2) return "|u1";
  return descrs[t];
}

static bool write_data(FILE *f, const krt_tensor *t, int64_t numel) {
  if (t->dtype != KRT_BF16) {
    size_t n = (size_t)numel * krt_dtype_size(t->dtype);
    return n == 0 || fwrite(t->data, 1, n, f) == n;
  }
  /* bf16 goes out as f32, converted in chunks to bound the memory. */
  const uint16_t *src = t->data;
  float buf[1024];
  for (int64_t i = 0; i < numel;) {
    size_t n = 0;
    for (; n < 1024 && i < numel; n++, i++) {
      uint16_t h;
      memcpy(&h, src + i, sizeof h);
      buf[n] = krt_bf16_to_f32(h);
    }
    if (fwrite(buf, sizeof *buf, n, f) != n) return false;
  }
  return true;
}

int krt_npy_write(const char *path, const krt_tensor *t, char *errbuf,
                  size_t errlen) {
  if (!path) return krt_fail(errbuf, errlen, path, "no path");
  int64_t numel = krt_tensor_numel(t);
  if (!t || krt_dtype_size(t->dtype) == 0 || numel < 0 ||
      (numel > 0 && !t->data))
    return krt_fail(errbuf, errlen, path, "invalid tensor (bad dtype, rank, "
                                          "dims or data)");

  /* The dict, then spaces and '\n' so the data starts 64-byte aligned,
   * as NumPy does. */
  char hdr[256];
  int n = snprintf(hdr, sizeof hdr,
                   "{'descr': '%s', 'fortran_order': False, 'shape': (",
                   write_descr(t->dtype));
  for (int i = 0; i < t->rank; i++)
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s%lld", i ? ", " : "",
                  (long long)t->dims[i]);
  n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s), }",
                t->rank == 1 ? "," : "");
  /* At most 8 dims of 10 digits: always fits, so version 1.0 always does
   * (its limit is 65535 bytes); version 2.0 is never needed. */
  size_t pre = 10, hlen = (size_t)n + 1;
  size_t pad = (64 - (pre + hlen) % 64) % 64;
  hlen += pad;
  unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                (unsigned char)(hlen & 0xff),
                                (unsigned char)(hlen >> 8)};

  FILE *f = krt_open_write(path, errbuf, errlen);
  if (!f) return -1;
  bool ok = fwrite(preamble, 1, pre, f) == pre &&
            fwrite(hdr, 1, (size_t)n, f) == (size_t)n &&
            fprintf(f, "%*s\n", (int)pad, "") == (int)pad + 1 &&
            write_data(f, t, numel);
  return krt_close_write(f, ok, path, errbuf, errlen);
}
