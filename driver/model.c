/* model.c - reading a model and applying the shared options. */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "driver.h"

/* --shape NAME=d0,d1,... ("NAME=" alone is a scalar). */
static int parse_shape(kiln_model_opts *o, char *arg) {
  char *eq = strrchr(arg, '=');
  if (!eq || eq == arg) {
    fprintf(stderr, "kiln: --shape takes NAME=D0,D1,..., got '%s'\n", arg);
    return -1;
  }
  if (o->nshapes == (int)(sizeof o->shapes / sizeof o->shapes[0])) {
    fprintf(stderr, "kiln: too many --shape options\n");
    return -1;
  }
  kl_shape_binding *b = &o->shapes[o->nshapes];
  b->shape.rank = 0;
  for (const char *p = eq + 1; *p;) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || v > KL_MAX_NUMEL || (*end && *end != ',') ||
        b->shape.rank == KL_MAX_RANK) {
      fprintf(stderr, "kiln: --shape %s: dims must be non-negative integers, at most %d\n",
              arg, KL_MAX_RANK);
      return -1;
    }
    b->shape.dims[b->shape.rank++] = v;
    p = *end ? end + 1 : end;
  }
  *eq = 0; /* the name ends there; it stays in argv */
  b->input = arg;
  o->nshapes++;
  return 0;
}

/* fp32, fp16 or bf16 (the names users know from frameworks). */
static int parse_precision(const char *flag, const char *arg, kl_dtype *out) {
  static const struct { const char *name; kl_dtype t; } names[] = {
      {"fp32", KL_F32}, {"fp16", KL_F16}, {"bf16", KL_BF16}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(arg, names[i].name)) {
      *out = names[i].t;
      return 0;
    }
  fprintf(stderr, "kiln: --%s=%s: choose fp32, fp16 or bf16\n", flag, arg);
  return -1;
}

/* --fp32-ops / --fp32-nodes A,B,...: names cut out of arg in place. */
static int parse_name_list(const char *flag, char *arg, const char **list, int *n, int cap,
                           bool ops) {
  for (char *name = strtok(arg, ","); name; name = strtok(NULL, ",")) {
    kl_op op;
    if (ops && kl_op_lookup(name, &op)) {
      fprintf(stderr, "kiln: --%s: no op is named '%s'\n", flag, name);
      return -1;
    }
    if (*n == cap) {
      fprintf(stderr, "kiln: --%s: more than %d names\n", flag, cap);
      return -1;
    }
    list[(*n)++] = name;
  }
  return 0;
}

static int precision_opt(kiln_model_opts *o, int opt, char *arg) {
  o->precision = true;
  o->prec.fp32_ops = o->fp32_ops;
  o->prec.fp32_nodes = o->fp32_nodes;
  switch (opt) {
  case OPT_PRECISION: return parse_precision("precision", arg, &o->prec.low);
  case OPT_IO_PRECISION:
    o->prec.io_set = true;
    return parse_precision("io-precision", arg, &o->prec.io);
  case OPT_FP32_OPS:
    return parse_name_list("fp32-ops", arg, o->fp32_ops, &o->prec.nfp32_ops, 64, true);
  default:
    return parse_name_list("fp32-nodes", arg, o->fp32_nodes, &o->prec.nfp32_nodes, 256, false);
  }
}

/* A number > 0 (and at most max) into *out; -1 after saying what opt takes. */
static int positive(const char *opt, const char *what, const char *arg, double max, double *out) {
  char *end;
  *out = strtod(arg, &end);
  if (*end || end == arg || !(*out > 0) || *out > max) {
    fprintf(stderr, "kiln: %s takes %s > 0, got '%s'\n", opt, what, arg);
    return -1;
  }
  return 0;
}

int kiln_model_opt(kiln_model_opts *o, int opt, char *arg) {
  if (opt == OPT_TRAIN) {
    o->train = true;
    return 0;
  }
  if (opt == OPT_LOSS || opt == OPT_LOGITS || opt == OPT_LABELS || opt == OPT_OPTIMIZER ||
      opt == OPT_SCHEDULE) {
    const char **slot[] = {&o->loss, &o->logits, &o->labels, &o->optimizer, &o->schedule};
    *slot[opt - OPT_LOSS] = arg;
    return 0;
  }
  if (opt == OPT_DATA_PARALLEL) {
    o->data_parallel = true;
    return 0;
  }
  if (opt == OPT_BUCKET_MB) {
    o->data_parallel = true;
    return positive("--bucket-mb", "a size in MiB", arg, 1e6, &o->bucket_mb);
  }
  if (opt == OPT_CLIP) return positive("--clip", "a number", arg, 1e30, &o->clip);
  if (opt == OPT_PRECISION || opt == OPT_IO_PRECISION || opt == OPT_FP32_OPS ||
      opt == OPT_FP32_NODES)
    return precision_opt(o, opt, arg);
  if (opt == OPT_WEIGHTS) {
    o->weights = arg;
    return 0;
  }
  if (opt == OPT_SHAPE) return parse_shape(o, arg);
  char *eq = strchr(arg, '=');
  char *end;
  if (!eq || eq == arg) {
    fprintf(stderr, "kiln: --dim takes NAME=VALUE, got '%s'\n", arg);
    return -1;
  }
  long long v = strtoll(eq + 1, &end, 10);
  if (*end || end == eq + 1 || v < 0 || v > KL_MAX_NUMEL) {
    fprintf(stderr, "kiln: --dim %s: the value must be a non-negative integer\n", arg);
    return -1;
  }
  if (o->ndims == (int)(sizeof o->dims / sizeof o->dims[0])) {
    fprintf(stderr, "kiln: too many --dim options\n");
    return -1;
  }
  *eq = 0; /* the name ends there; it stays in argv */
  o->dims[o->ndims++] = (kl_dim_override){arg, v};
  return 0;
}

/* Every tensor in the file must name a param or const of the model: a
 * silently ignored weight is a bug that is hard to find later.  The bytes
 * stay in the file (mapped, not copied). */
int kiln_apply_weights(kl_graph *g, const char *path) {
  kl_mapped_tensor *ts;
  int n;
  char msg[512];
  if (kl_safetensors_map(g, path, &ts, &n, msg, sizeof msg)) {
    fprintf(stderr, "kiln: error: %s\n", msg);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    const kl_mapped_tensor *t = &ts[i];
    kl_value *v = kl_graph_find_value(g, t->name);
    if (!v || (v->kind != KL_VAL_PARAM && v->kind != KL_VAL_CONST)) {
      fprintf(stderr, "kiln: error: %s: tensor '%s' is not a param or const of the model\n",
              path, t->name);
      rc = -1;
      break;
    }
    if (t->dtype != v->dtype || !kl_shape_equal(&t->shape, &v->shape)) {
      char a[128], b[128];
      fprintf(stderr, "kiln: error: %s: tensor '%s' is %s%s, but the model declares %s%s\n",
              path, t->name, kl_dtype_name(t->dtype), kl_shape_str(&t->shape, a, sizeof a),
              kl_dtype_name(v->dtype), kl_shape_str(&v->shape, b, sizeof b));
      rc = -1;
      break;
    }
    v->data = (void *)t->data; /* read-only: nothing writes a value's data */
    v->init = (kl_init){.kind = KL_INIT_DATA};
  }
  free(ts);
  return rc;
}

int kiln_model_opt_or_usage(kiln_model_opts *o, int opt, char *arg, const char *help) {
  if (opt < OPT_DIM || opt > OPT_BUCKET_MB) {
    fputs(help, stderr);
    return -1;
  }
  return kiln_model_opt(o, opt, arg);
}

/* .kl is text; an ONNX model is protobuf, whose first bytes are field keys
 * and lengths: control characters no text holds (ir_version's key is 0x08). */
static bool looks_binary(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] < 0x20 && (p[i] == 0 || !strchr("\t\n\r\f\v", p[i]))) return true;
  return false;
}

bool kiln_is_onnx(const char *path) {
  size_t n = strlen(path);
  if (n >= 5 && strcmp(path + n - 5, ".onnx") == 0) return true;
  FILE *f = fopen(path, "rb");
  if (!f) return false; /* the .kl reader says why it cannot open it */
  unsigned char head[512];
  size_t got = fread(head, 1, sizeof head, f);
  fclose(f);
  return looks_binary(head, got);
}

void kiln_print_onnx_error(const char *path, const kl_error *err) {
  kl_error_print(stderr, err);
  size_t n = strlen(path);
  if (strstr(err->msg, "not an ONNX model") && !(n >= 5 && !strcmp(path + n - 5, ".onnx")))
    fprintf(stderr, "kiln: note: %s was read as ONNX because it holds bytes that .kl text "
                    "never does (control characters)\n", path);
}

kl_graph *kiln_load_model(const char *path, const kiln_model_opts *o) {
  kl_error err;
  kl_graph *g;
  if (kiln_is_onnx(path)) {
    kl_onnx_options oopt = {.shapes = o->shapes, .nshapes = o->nshapes, .dims = o->dims,
                            .ndims = o->ndims};
    g = kl_onnx_load(path, &oopt, &err);
    if (g && o->train && kiln_onnx_train_block(g, o)) {
      kl_graph_free(g);
      return NULL;
    }
  } else {
    if (o->nshapes) {
      fprintf(stderr, "kiln: error: --shape is for ONNX models; .kl models take --dim\n");
      return NULL;
    }
    kl_parse_options popt = {.dims = o->dims, .ndims = o->ndims};
    g = kl_parse_file(path, &popt, &err);
  }
  if (!g) {
    kiln_print_onnx_error(path, &err); /* (a .kl error prints as it is) */
    return NULL;
  }
  if ((o->weights && kiln_apply_weights(g, o->weights)) || kiln_apply_precision(g, o)) {
    kl_graph_free(g);
    return NULL;
  }
  return g;
}

int kiln_apply_precision(kl_graph *g, const kiln_model_opts *o) {
  kl_error err;
  kl_pipeline_options po = {.precision = o->precision ? &o->prec : NULL, .target = kl_cg_target_for(kiln_cutoff_sm),
                            .dump = stdout, .dump_after = o->dump_after, .train = o->train,
                            .mem_limit = o->mem_limit, .no_fuse = o->no_fuse, .notes = stderr};
  if (o->train && !g->train) {
    fprintf(stderr, "kiln: error: --train: model '%s' has no train block (a loss and an optimizer: "
                    "docs/DSL.md, Training)\n", g->name);
    return -1;
  }
  if (o->data_parallel && !o->train) {
    fprintf(stderr, "kiln: error: --data-parallel is for a training step (--train)\n");
    return -1;
  }
  if (o->data_parallel && g->train) {
    g->train->data_parallel = true;
    g->train->bucket_bytes = (size_t)((o->bucket_mb > 0 ? o->bucket_mb : 25) * 1048576.0);
    if (!g->train->bucket_bytes) g->train->bucket_bytes = 1;
  }
  if (!kl_pipeline_rewrite(g, &po, &err)) return 0;
  kl_error_print(stderr, &err);
  return -1;
}

int kiln_parse_mem_limit(const char *cmd, const char *arg, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = arg[0] >= '0' && arg[0] <= '9' ? strtoull(arg, &end, 10) : 0;
  unsigned shift = 0;
  if (v && !errno) {
    switch (*end) {
    case 'k': case 'K': shift = 10, end++; break;
    case 'm': case 'M': shift = 20, end++; break;
    case 'g': case 'G': shift = 30, end++; break;
    default: break;
    }
    if (shift && (*end == 'B' || *end == 'b')) end++;
  }
  if (!v || errno || *end || v > (SIZE_MAX >> shift)) {
    fprintf(stderr, "kiln %s: --mem-limit=%s: give a positive number of bytes, with K, M or G for "
                    "KiB, MiB or GiB (e.g. 512M)\n", cmd, arg);
    return -1;
  }
  *out = (size_t)v << shift;
  return 0;
}
