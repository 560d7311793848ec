/* parse.c - entry points of the .kl frontend: run the parser, then finish
 * the graph (load weights, check outputs, verify). */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "parse_state.h"
#include "parser.h"
#define YYSTYPE KL_YYSTYPE
#define YYLTYPE KL_YYLTYPE
#include "lexer.h"

/* Resolve load("file") against the model's folder. */
static char *resolve_path(const char *model, const char *path) {
  const char *slash = strrchr(model, '/');
  size_t dir = (path[0] == '/' || !slash) ? 0 : (size_t)(slash - model + 1);
  char *out = malloc(dir + strlen(path) + 1);
  if (!out) abort();
  memcpy(out, model, dir);
  strcpy(out + dir, path);
  return out;
}

int kl_safetensors_map(kl_graph *g, const char *path, kl_mapped_tensor **out, int *n,
                       char *msg, size_t len) {
  krt_tensor_set set = {0};
  int64_t *offsets = NULL;
  *out = NULL;
  *n = 0;
  if (krt_safetensors_index(path, &set, &offsets, msg, len)) return -1;
  size_t size = 0;
  const unsigned char *base = kl_graph_map_file(g, path, &size);
  if (!base) {
    snprintf(msg, len, "%s: %s", path, strerror(errno));
    krt_tensor_set_free(&set);
    free(offsets);
    return -1;
  }
  kl_mapped_tensor *ts = calloc((size_t)set.count + 1, sizeof *ts);
  if (!ts) abort();
  int rc = 0;
  for (int i = 0; i < set.count && !rc; i++) {
    const krt_tensor *t = &set.items[i].tensor;
    size_t bytes = (size_t)krt_tensor_numel(t) * krt_dtype_size(t->dtype);
    kl_mapped_tensor *m = &ts[i];
    m->name = kl_arena_strdup(&g->arena, set.items[i].name);
    m->dtype = (kl_dtype)t->dtype;
    m->shape.rank = t->rank;
    for (int d = 0; d < t->rank; d++) m->shape.dims[d] = t->dims[d];
    /* the index checked the offsets against the size it saw; the file
     * may have changed since */
    if ((size_t)offsets[i] > size || bytes > size - (size_t)offsets[i]) {
      snprintf(msg, len, "%s: tensor '%s' lies past the end of the file", path, m->name);
      rc = -1;
    } else if (m->dtype == KL_BOOL) { /* stored as any nonzero byte; we promise 0 or 1 */
      unsigned char *b = kl_arena_alloc(&g->arena, bytes ? bytes : 1);
      for (size_t k = 0; k < bytes; k++) b[k] = base[offsets[i] + (int64_t)k] != 0;
      m->data = b;
    } else {
      m->data = base + offsets[i];
    }
  }
  if (!rc) {
    *out = ts;
    *n = set.count;
  } else {
    free(ts);
  }
  krt_tensor_set_free(&set);
  free(offsets);
  return rc;
}

/* load("file", key=...): the tensor's bytes where they lie in the file. */
static int load_params(kl_parser *P) {
  kl_graph *g = P->g;
  for (int i = 0; i < g->params.len; i++) {
    kl_value *v = g->params.items[i];
    if (v->init.kind != KL_INIT_LOAD) continue;
    char *path = resolve_path(P->file, v->init.path);
    kl_mapped_tensor *ts;
    int n, rc = 0;
    char msg[512];
    if (kl_safetensors_map(g, path, &ts, &n, msg, sizeof msg)) {
      rc = kl_fail(P->err, v->loc, "cannot load '%s': %s", v->name, msg);
    } else {
      const char *key = v->init.key ? v->init.key : v->name;
      const kl_mapped_tensor *t = NULL;
      for (int k = 0; k < n && !t; k++)
        if (!strcmp(ts[k].name, key)) t = &ts[k];
      char a[128], b[128];
      if (!t)
        rc = kl_fail(P->err, v->loc, "'%s' has no tensor named '%s'", path, key);
      else if (t->dtype != v->dtype || !kl_shape_equal(&t->shape, &v->shape))
        rc = kl_fail(P->err, v->loc, "'%s' in '%s' is %s%s, but '%s' is declared %s%s",
                     key, path, kl_dtype_name(t->dtype), kl_shape_str(&t->shape, a, sizeof a),
                     v->name, kl_dtype_name(v->dtype), kl_shape_str(&v->shape, b, sizeof b));
      else
        v->data = (void *)t->data; /* read-only: nothing writes a value's data */
      free(ts);
    }
    free(path);
    if (rc) return rc;
  }
  return 0;
}

/* A model without `model NAME` is named after its file ("mlp.kl" -> mlp),
 * made into an identifier so the printed IR parses back. */
static void set_default_name(kl_graph *g, const char *filename) {
  const char *base = strrchr(filename, '/');
  base = base ? base + 1 : filename;
  char buf[128];
  size_t n = 0;
  for (const char *p = base; *p && *p != '.' && n < sizeof buf - 1; p++)
    buf[n++] = (isalnum((unsigned char)*p) || *p == '_') ? *p : '_';
  buf[n] = 0;
  if (n == 0 || isdigit((unsigned char)buf[0]) || kl_is_keyword(buf))
    snprintf(buf, sizeof buf, "%s", "main");
  g->name = kl_arena_strdup(&g->arena, buf);
}

static void cleanup(kl_parser *P) {
  while (P->nframes > 0) {
    kl_frame *f = &P->frames[--P->nframes];
    free(f->pos); free(f->posattr); free(f->kw); free(f->kwloc);
  }
  free(P->frames); free(P->syms); free(P->sym_slots); free(P->bound); free(P->names); free(P->name_locs); free(P->list);
  kl_arena_free(&P->tmp);
}

kl_graph *kl_parse_string(const char *text, size_t len, const char *filename,
                          const kl_parse_options *opt, kl_error *err) {
  kl_parser P = {.file = filename, .opt = opt, .err = err, .line = 1, .col = 1};
  P.g = kl_graph_new(NULL);
  memset(err, 0, sizeof *err);
  yyscan_t scanner;
  if (kl_yylex_init_extra(&P, &scanner)) abort();
  YY_BUFFER_STATE buf = kl_yy_scan_bytes(text, (int)len, scanner);
  int rc = kl_yyparse(scanner, &P);
  kl_yy_delete_buffer(buf, scanner);
  kl_yylex_destroy(scanner);
  if (rc == 2 && !P.failed) /* bison's stack limit */
    kl_parser_fail(&P, P.line, P.col, "the model is nested too deeply");
  else if (rc && !P.failed)
    kl_parser_fail(&P, P.line, P.col, "syntax error");
  if (!P.failed) {
    for (int i = 0; opt && i < opt->ndims; i++) {
      bool found = false;
      for (int s = 0; s < P.nsyms; s++)
        found |= P.syms[s].is_dim && strcmp(P.syms[s].name, opt->dims[i].name) == 0;
      if (!found) {
        kl_fail(err, (kl_loc){filename, 0, 0}, "--dim %s: the model has no dim named '%s'",
                opt->dims[i].name, opt->dims[i].name);
        P.failed = true;
        break;
      }
    }
  }
  if (!P.failed && !P.seen_model) set_default_name(P.g, filename);
  if (!P.failed && P.g->outputs.len == 0) {
    kl_fail(err, (kl_loc){filename, P.line, P.col},
            "the model has no outputs (add `output NAME`)");
    P.failed = true;
  }
  if (!P.failed && (load_params(&P) || kl_verify(P.g, err))) P.failed = true;
  cleanup(&P);
  if (P.failed) {
    kl_graph_free(P.g);
    return NULL;
  }
  return P.g;
}

kl_graph *kl_parse_file(const char *path, const kl_parse_options *opt,
                        kl_error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    kl_fail(err, (kl_loc){0}, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  if (!text) abort();
  size_t got;
  while ((got = fread(text + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      if (cap > ((size_t)1 << 30)) {
        fclose(f);
        free(text);
        kl_fail(err, (kl_loc){path, 0, 0}, "the file is larger than 1 GiB");
        return NULL;
      }
      char *grown = realloc(text, cap *= 2);
      if (!grown) abort();
      text = grown;
    }
  }
  bool bad = ferror(f);
  fclose(f);
  if (bad) {
    free(text);
    kl_fail(err, (kl_loc){path, 0, 0}, "read error");
    return NULL;
  }
  kl_graph *g = kl_parse_string(text, len, path, opt, err);
  free(text);
  return g;
}
