/* onnx_load.c - ONNX ModelProto -> IR: initializers, inputs, nodes through
 * the converter tables, outputs; plus the helpers converters use. */
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"
#include "../passes/passes.h"

static const kl_onnx_op *const families[] = {kl_onnx_ops_math, kl_onnx_ops_nn,
                                             kl_onnx_ops_tensor, kl_onnx_ops_sequence,
                                             kl_onnx_ops_quant, kl_onnx_ops_rnn,
                                             kl_onnx_ops_training};

static const kl_onnx_op *find_converter(const char *op, int opset) {
  const kl_onnx_op *best = NULL;
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    for (const kl_onnx_op *r = families[f]; r->op; r++)
      if (!strcmp(r->op, op) && r->since <= opset && (!best || r->since > best->since))
        best = r;
  return best;
}

static bool is_default_domain(const char *d) {
  return !d || !*d || !strcmp(d, "ai.onnx");
}

/* The opset the model imports for a domain; 0 when none. */
static int domain_opset(const kl_onnx_ctx *c, const char *domain) {
  if (is_default_domain(domain)) return c->opset;
  for (size_t i = 0; i < c->model->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = c->model->opset_import[i];
    if (o->domain && !strcmp(o->domain, domain) && o->has_version) return (int)o->version;
  }
  return 0;
}

static const kl_onnx_op *node_converter(const kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const char *op = n->op_type ? n->op_type : "";
  if (is_default_domain(n->domain)) return find_converter(op, c->opset);
  char key[300];
  snprintf(key, sizeof key, "%.150s.%.140s", n->domain, op);
  return find_converter(key, domain_opset(c, n->domain));
}

/* ---- value bindings -------------------------------------------------- */
/* Bindings are found through two hash indexes, so big models load in
 * linear time. */
static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static uint64_t hash_ptr(const void *p) {
  uint64_t h = (uint64_t)(uintptr_t)p;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

static void index_binding(kl_onnx_ctx *c, int i) {
  size_t mask = (size_t)c->index_cap - 1, k;
  if (c->vals[i].name && *c->vals[i].name) {
    k = (size_t)hash_str(c->vals[i].name) & mask;
    while (c->by_name[k] && strcmp(c->vals[c->by_name[k] - 1].name, c->vals[i].name))
      k = (k + 1) & mask;
    c->by_name[k] = i + 1; /* replaces an older binding of the same name */
  }
  if (c->vals[i].v) {
    k = (size_t)hash_ptr(c->vals[i].v) & mask;
    while (c->by_value[k] && c->vals[c->by_value[k] - 1].v != c->vals[i].v) k = (k + 1) & mask;
    c->by_value[k] = i + 1;
  }
}

static void reindex(kl_onnx_ctx *c) {
  while (c->index_cap < 2 * c->capvals + 2) c->index_cap = c->index_cap ? 2 * c->index_cap : 128;
  free(c->by_name);
  free(c->by_value);
  c->by_name = calloc((size_t)c->index_cap, sizeof *c->by_name);
  c->by_value = calloc((size_t)c->index_cap, sizeof *c->by_value);
  if (!c->by_name || !c->by_value) abort();
  for (int i = 0; i < c->nvals; i++) index_binding(c, i);
}

static kl_onnx_binding *lookup(kl_onnx_ctx *c, const char *name) {
  if (!c->index_cap || !*name) return NULL;
  size_t mask = (size_t)c->index_cap - 1, k = (size_t)hash_str(name) & mask;
  for (; c->by_name[k]; k = (k + 1) & mask)
    if (!strcmp(c->vals[c->by_name[k] - 1].name, name)) return &c->vals[c->by_name[k] - 1];
  return NULL;
}

static void bind_name(kl_onnx_ctx *c, const char *name, kl_value *v) {
  if (c->nvals == c->capvals) {
    c->capvals = c->capvals ? 2 * c->capvals : 64;
    kl_onnx_binding *grown = realloc(c->vals, (size_t)c->capvals * sizeof *grown);
    if (!grown) abort();
    c->vals = grown;
    reindex(c);
  }
  c->vals[c->nvals++] = (kl_onnx_binding){.name = name, .v = v};
  index_binding(c, c->nvals - 1);
}

/* ONNX names are any strings ("onnx::Add_3", "0"); IR names are made into
 * identifiers so that the printed IR stays readable and parses.  What a
 * graph input or output is called by the model stays in its label. */
static const char *identifier(const char *onnx, char *buf, size_t cap) {
  size_t n = 0;
  if (!onnx || !*onnx || isdigit((unsigned char)onnx[0])) buf[n++] = 'v';
  for (const char *p = onnx ? onnx : ""; *p && n < cap - 1; p++)
    buf[n++] = isalnum((unsigned char)*p) ? *p : '_';
  buf[n] = 0;
  return buf;
}

static const char *ir_name(kl_graph *g, const char *onnx) {
  char buf[256];
  return kl_graph_fresh_value_name(g, identifier(onnx, buf, sizeof buf));
}

/* ---- converter helpers ----------------------------------------------- */
static const char *node_label(const Onnx__NodeProto *n) {
  return n->name && *n->name ? n->name : (n->n_output && n->output[0] ? n->output[0] : "?");
}

int kl_onnx_fail(kl_onnx_ctx *c, const char *fmt, ...) {
  char body[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  if (!c->node) return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "%s", body);
  return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "node '%s' (%s): %s", node_label(c->node),
                 c->node->op_type, body);
}

int kl_onnx_unsupported(kl_onnx_ctx *c, const char *fmt, ...) {
  char body[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  kl_onnx_fail(c, "%s", body);
  c->err->unsupported = true;
  return -1;
}

int kl_onnx_ninputs(const Onnx__NodeProto *n) {
  int k = (int)n->n_input;
  while (k > 0 && (!n->input[k - 1] || !*n->input[k - 1])) k--;
  return k;
}

kl_value *kl_onnx_input(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k) {
  if (k >= (int)n->n_input || !n->input[k] || !*n->input[k]) return NULL;
  kl_onnx_binding *b = lookup(c, n->input[k]);
  return b ? b->v : NULL;
}

int kl_onnx_bind(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value *v) {
  if (k >= (int)n->n_output || !n->output[k] || !*n->output[k]) return 0; /* unused */
  if (lookup(c, n->output[k]))
    return kl_onnx_fail(c, "output '%s' is produced twice", n->output[k]);
  /* A fresh IR value takes the ONNX name; an aliased one (Identity) keeps
   * its own. */
  if (v->kind == KL_VAL_NODE && v->producer && !strncmp(v->name, "kl_tmp", 6))
    kl_graph_rename_value(c->g, v, ir_name(c->g, n->output[k]));
  bind_name(c, n->output[k], v);
  return 0;
}

int kl_onnx_input_seq(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value ***items,
                      int *len, kl_dtype *dtype) {
  kl_onnx_binding *b = k < (int)n->n_input && n->input[k] && *n->input[k]
                           ? lookup(c, n->input[k]) : NULL;
  if (!b || !b->is_seq) return kl_onnx_fail(c, "input %d must be a sequence", k);
  *items = b->seq;
  *len = b->seq_len;
  *dtype = b->seq_dtype;
  return 0;
}

int kl_onnx_bind_seq(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, kl_value **items,
                     int len, kl_dtype dtype) {
  if (k >= (int)n->n_output || !n->output[k] || !*n->output[k]) return 0;
  if (lookup(c, n->output[k]))
    return kl_onnx_fail(c, "output '%s' is produced twice", n->output[k]);
  for (int i = 0; i < len; i++)
    if (items[i]->dtype != dtype)
      return kl_onnx_fail(c, "sequence items must all be %s, item %d is %s",
                          kl_dtype_name(dtype), i, kl_dtype_name(items[i]->dtype));
  kl_value **copy = kl_arena_alloc(&c->g->arena, (size_t)(len + 1) * sizeof *copy);
  if (len) memcpy(copy, items, (size_t)len * sizeof *copy);
  bind_name(c, n->output[k], NULL);
  kl_onnx_binding *b = &c->vals[c->nvals - 1];
  b->seq = copy;
  b->seq_len = len;
  b->is_seq = true;
  b->seq_dtype = dtype;
  return 0;
}

kl_node *kl_onnx_emit_node(kl_onnx_ctx *c, kl_op op, kl_value **ins, int nins,
                           const kl_attr *attrs, int nattrs, int nouts) {
  (void)nouts; /* the op decides; split's comes from its sizes */
  kl_error e;
  kl_node *node = kl_graph_add_node(c->g, op, c->node ? ir_name(c->g, node_label(c->node)) : NULL,
                                    ins, nins,
                                    attrs, nattrs, NULL, 0, (kl_loc){c->path, 0, 0}, &e);
  if (!node) {
    kl_onnx_fail(c, "%s", e.msg);
    return NULL;
  }
  if (c->node) { /* what `kiln check` names when the node diverges */
    node->onnx_name = kl_arena_strdup(&c->g->arena, node_label(c->node));
    node->onnx_op = kl_arena_strdup(&c->g->arena, c->node->op_type ? c->node->op_type : "?");
  }
  /* Temporary names until kl_onnx_bind gives the ONNX ones. */
  for (int k = 0; k < node->noutputs; k++)
  {
    char tmp[64]; /* unique without a search: the value count only grows */
    snprintf(tmp, sizeof tmp, "kl_tmp_%d", c->g->values.len + k);
    kl_graph_rename_value(c->g, node->outputs[k], kl_graph_fresh_value_name(c->g, tmp));
  }
  return node;
}

kl_value *kl_onnx_emit(kl_onnx_ctx *c, kl_op op, kl_value **ins, int nins,
                       const kl_attr *attrs, int nattrs) {
  kl_node *n = kl_onnx_emit_node(c, op, ins, nins, attrs, nattrs, 1);
  return n ? n->outputs[0] : NULL;
}

kl_value *kl_onnx_constant(kl_onnx_ctx *c, kl_dtype t, const kl_shape *s,
                           const double *vals, int n) {
  kl_attr a[3] = {
      {.name = "value", .kind = KL_ATTR_FLOATS, .floats = (double *)vals, .n = n},
      kl_adt("dtype", t),
      kl_ais("shape", s->dims, s->rank),
  };
  return kl_onnx_emit(c, KL_OP_CONSTANT, NULL, 0, a, 3);
}

kl_value *kl_onnx_scalar(kl_onnx_ctx *c, kl_dtype t, double v) {
  kl_shape s = {0};
  return kl_onnx_constant(c, t, &s, &v, 1);
}

const Onnx__AttributeProto *kl_onnx_attr(const Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name)) return n->attribute[i];
  return NULL;
}

int64_t kl_onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, name);
  return a && a->has_i ? a->i : dflt;
}

double kl_onnx_attr_float(const Onnx__NodeProto *n, const char *name, double dflt) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, name);
  return a && a->has_f ? a->f : dflt;
}

const char *kl_onnx_attr_string(kl_onnx_ctx *c, const Onnx__NodeProto *n,
                                const char *name, const char *dflt) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, name);
  if (!a || !a->has_s) return dflt;
  char *s = kl_arena_alloc(&c->g->arena, a->s.len + 1);
  if (a->s.len) memcpy(s, a->s.data, a->s.len);
  return s;
}

int kl_onnx_attr_ints(const Onnx__NodeProto *n, const char *name, const int64_t **out) {
  const Onnx__AttributeProto *a = kl_onnx_attr(n, name);
  if (!a || (a->n_ints == 0 && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS))
    return -1;
  *out = a->ints;
  return (int)a->n_ints;
}

/* ---- compile-time constants ------------------------------------------ */
enum { MAX_FOLD_NUMEL = 1 << 22 }; /* folding is for shapes and small tables */

static kl_onnx_binding *binding_of(kl_onnx_ctx *c, const kl_value *v) {
  if (!c->index_cap) return NULL;
  size_t mask = (size_t)c->index_cap - 1, k = (size_t)hash_ptr(v) & mask;
  for (; c->by_value[k]; k = (k + 1) & mask)
    if (c->vals[c->by_value[k] - 1].v == v) return &c->vals[c->by_value[k] - 1];
  return NULL;
}

/* Evaluate v from constants alone, recursively; NULL when it depends on a
 * graph input.  Results are cached in the bindings. */
static kl_tensor *fold(kl_onnx_ctx *c, kl_value *v, kl_tensor **scratch, int depth) {
  kl_onnx_binding *b = binding_of(c, v);
  if (b && b->const_checked) return b->konst;
  kl_tensor *t = NULL;
  if (kl_shape_numel(&v->shape) > MAX_FOLD_NUMEL || depth > 2000) {
    t = NULL;
  } else if (v->kind == KL_VAL_INPUT) {
    if (b && !c->blocking_input) c->blocking_input = b->name;
  } else if (v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST) {
    kl_error e;
    if (kl_value_materialize(v, &t, &e)) t = NULL;
  } else if (v->kind == KL_VAL_NODE && v->producer) {
    kl_node *n = v->producer;
    kl_tensor *in[64], *out[64];
    bool ok = n->ninputs <= 64 && n->noutputs <= 64;
    for (int k = 0; ok && k < n->ninputs; k++)
      ok = (in[k] = fold(c, n->inputs[k], scratch, depth + 1)) != NULL;
    kl_error e;
    if (ok && kl_fold_eval(n, in, out, &e) == 0)
      for (int k = 0; k < n->noutputs; k++) {
        if (n->outputs[k] == v) t = out[k];
        else kl_tensor_free(out[k]);
      }
  }
  if (b) {
    b->konst = t;
    b->const_checked = true;
  } else if (t) {
    /* an intermediate IR value with no ONNX name: keep it for freeing */
    bind_name(c, "", v);
    c->vals[c->nvals - 1].konst = t;
    c->vals[c->nvals - 1].const_checked = true;
  }
  (void)scratch;
  return t;
}

/* The first element of an i64 or u64 constant beyond 2^53 (exact doubles
 * end there, and with them the interpreter's numbers); -1 when none. */
static int64_t first_inexact(const kl_value *v, int64_t *value) {
  const unsigned char *p = v->data; /* may be unaligned: in a mapped file */
  const int64_t limit = (int64_t)1 << 53;
  for (int64_t i = 0, n = kl_shape_numel(&v->shape); i < n; i++) {
    int64_t x;
    memcpy(&x, p + 8 * i, 8);
    bool beyond = v->dtype == KL_U64 ? (uint64_t)x > (uint64_t)limit : x > limit || x < -limit;
    if (beyond) {
      *value = x;
      return i;
    }
  }
  return -1;
}

const kl_tensor *kl_onnx_const(kl_onnx_ctx *c, kl_value *v, const char *what) {
  if (!v) {
    kl_onnx_fail(c, "%s is missing", what);
    return NULL;
  }
  kl_tensor *t = fold(c, v, NULL, 0);
  int64_t x, at;
  if (!t && (v->kind == KL_VAL_PARAM || v->kind == KL_VAL_CONST) && v->data &&
      (v->dtype == KL_I64 || v->dtype == KL_U64) && (at = first_inexact(v, &x)) >= 0) {
    kl_onnx_binding *b = binding_of(c, v);
    kl_onnx_fail(c, "%s ('%s') holds %lld at element %lld, beyond 2^53: an integer that "
                    "large cannot be held exactly", what, b && *b->name ? b->name : v->name,
                 (long long)x, (long long)at);
  } else if (!t) {
    kl_onnx_fail(c, "%s ('%s') must be known at compile time: Kiln compiles static "
                    "shapes, and this value depends on a graph input",
                 what, v->name);
  }
  return t;
}

int kl_onnx_const_ints(kl_onnx_ctx *c, kl_value *v, const char *what, int64_t *out,
                       int cap) {
  const kl_tensor *t = kl_onnx_const(c, v, what);
  if (!t) return -1;
  if (!kl_dtype_is_int(t->dtype) && t->dtype != KL_BOOL)
    return kl_onnx_fail(c, "%s must be an integer tensor, got %s", what,
                        kl_dtype_name(t->dtype));
  if (t->numel > cap) return kl_onnx_fail(c, "%s has %lld values (at most %d)", what,
                                          (long long)t->numel, cap);
  for (int64_t i = 0; i < t->numel; i++) out[i] = (int64_t)t->data[i];
  return (int)t->numel;
}

/* ---- the model ------------------------------------------------------- */
/* The newest opset Kiln reads in each domain it knows; 0: no limit (the
 * nodes of an unknown domain are reported as unsupported anyway). */
static int64_t newest_opset(const char *domain) {
  if (is_default_domain(domain)) return KL_ONNX_MAX_OPSET;
  if (!strcmp(domain, "ai.onnx.ml")) return KL_ONNX_MAX_OPSET_ML;
  if (!strcmp(domain, "ai.onnx.preview") || !strcmp(domain, "ai.onnx.preview.training"))
    return KL_ONNX_MAX_OPSET_PREVIEW;
  return 0;
}

/* An opset newer than Kiln knows may have changed what an op means: the
 * model is refused rather than read with older semantics. */
static int check_opset_versions(kl_onnx_ctx *c, const Onnx__ModelProto *m) {
  for (size_t i = 0; i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[i];
    int64_t newest = newest_opset(o->domain);
    if (!o->has_version || !newest || o->version <= newest) continue;
    kl_fail(c->err, (kl_loc){c->path, 0, 0},
            "the model imports opset %lld of domain '%s'; Kiln reads opsets up to %lld there",
            (long long)o->version, is_default_domain(o->domain) ? "ai.onnx" : o->domain,
            (long long)newest);
    c->err->unsupported = true;
    return -1;
  }
  return 0;
}

static int model_opset(kl_onnx_ctx *c, const Onnx__ModelProto *m) {
  int opset = -1;
  if (check_opset_versions(c, m)) return -1;
  for (size_t i = 0; i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[i];
    if ((!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) && o->has_version)
      opset = (int)o->version;
  }
  if (opset < 0) {
    /* Fine when no node needs it: the nodes of other domains are then
     * reported as unsupported. */
    for (size_t i = 0; m->graph && i < m->graph->n_node; i++) {
      const char *d = m->graph->node[i]->domain;
      if (!d || !*d || !strcmp(d, "ai.onnx"))
        return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                       "the model imports no opset of the default (ai.onnx) domain");
    }
    c->opset = 0;
    return 0;
  }
  if (opset < 1 || opset > 10000)
    return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "opset %d is not valid", opset);
  c->opset = opset;
  return 0;
}

static int add_initializers(kl_onnx_ctx *c, const Onnx__GraphProto *gp) {
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *t = gp->initializer[i];
    if (!t->name || !*t->name)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "initializer %zu has no name", i);
    if (lookup(c, t->name))
      return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "initializer '%s' is given twice",
                     t->name);
    kl_dtype dt;
    kl_shape s;
    const void *raw;
    void *owned;
    const kl_onnx_span *span = c->file && i < (size_t)c->file->nspans ? &c->file->spans[i] : NULL;
    if (kl_onnx_tensor_data(c, t, span, &dt, &s, &raw, &owned)) return -1;
    kl_value *v = kl_graph_add_param(c->g, ir_name(c->g, t->name), dt, &s, KL_VAL_PARAM,
                                     (kl_init){.kind = KL_INIT_DATA}, (kl_loc){c->path, 0, 0});
    size_t bytes = (size_t)kl_shape_numel(&s) * kl_dtype_size(dt);
    if (owned) { /* decoded from typed fields: into the graph */
      v->data = kl_arena_alloc(&c->g->arena, bytes ? bytes : 1);
      if (bytes) memcpy(v->data, raw, bytes);
      free(owned);
    } else { /* in a mapped file, where it stays (read-only) */
      v->data = (void *)raw;
    }
    bind_name(c, t->name, v);
  }
  return 0;
}

/* The declared type of a graph input or output: an unsupported dtype, a
 * non-tensor or a rank above KL_MAX_RANK is an error; *known is false
 * when a dim is not a static size (*unknown_dim then names it, NULL for
 * an undeclared shape). */
static int value_type(kl_onnx_ctx *c, const Onnx__ValueInfoProto *vi, kl_dtype *dt,
                      kl_shape *s, bool *known, const char **unknown_dim) {
  const char *name = vi->name ? vi->name : "?";
  *known = false;
  *unknown_dim = NULL;
  if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
  {
    kl_fail(c->err, (kl_loc){c->path, 0, 0},
            "'%s' is not a tensor (sequences, maps and optionals are not supported)", name);
    c->err->unsupported = true;
    return -1;
  }
  const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
  if (!tt->has_elem_type || kl_onnx_dtype(tt->elem_type, dt))
  {
    kl_fail(c->err, (kl_loc){c->path, 0, 0}, "'%s': element type %d is not supported", name,
            tt->has_elem_type ? tt->elem_type : 0);
    c->err->unsupported = true;
    return -1;
  }
  if (!tt->shape) return 0;
  if (tt->shape->n_dim > KL_MAX_RANK)
    return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "'%s': rank %zu is above %d", name,
                   tt->shape->n_dim, KL_MAX_RANK);
  s->rank = (int)tt->shape->n_dim;
  int64_t numel = 1;
  for (int d = 0; d < s->rank; d++) {
    const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
    if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ||
        dim->dim_value < 0) {
      *unknown_dim = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                         ? dim->dim_param : "?";
      return 0;
    }
    int64_t v = dim->dim_value;
    if (v > KL_MAX_NUMEL || (v && numel > KL_MAX_NUMEL / v))
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "'%s': dims hold more than %lld elements", name, (long long)KL_MAX_NUMEL);
    s->dims[d] = v;
    numel *= v;
  }
  *known = true;
  return 0;
}

/* ---- the declared inputs, and binding their symbolic dims ------------ */
/* vi as declared.  On an input, a dim_value <= 0 is an exporter's way of
 * saying "dynamic" (a real empty input is rare, and --shape still gives
 * one); on an output 0 is a size. */
static void io_decl(const Onnx__ValueInfoProto *vi, bool input, kl_onnx_io *io) {
  memset(io, 0, sizeof *io);
  snprintf(io->name, sizeof io->name, "%s", vi->name ? vi->name : "");
  io->dtype = -1;
  io->rank = -1;
  if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) return;
  io->tensor = true;
  const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
  kl_dtype dt;
  if (tt->has_elem_type && !kl_onnx_dtype(tt->elem_type, &dt)) io->dtype = (int)dt;
  if (!tt->shape || tt->shape->n_dim > KL_MAX_RANK) return;
  io->rank = (int)tt->shape->n_dim;
  for (int d = 0; d < io->rank; d++) {
    const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
    bool sized = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                 (dim->dim_value > 0 || (!input && dim->dim_value == 0));
    if (sized)
      io->dims[d] = dim->dim_value;
    else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
             dim->dim_param && *dim->dim_param)
      snprintf(io->dim_names[d], sizeof io->dim_names[d], "%s", dim->dim_param);
    else if (input)
      snprintf(io->dim_names[d], sizeof io->dim_names[d], "%.60s_dim%d", io->name, d);
    else
      snprintf(io->dim_names[d], sizeof io->dim_names[d], "?");
  }
}

const char *kl_onnx_io_str(const kl_onnx_io *io, char *buf, size_t n) {
  if (!io->tensor) {
    snprintf(buf, n, "(not a tensor)");
    return buf;
  }
  size_t used = (size_t)snprintf(buf, n, "%s", io->dtype >= 0 ? kl_dtype_name((kl_dtype)io->dtype)
                                                             : "(unsupported type)");
  if (io->rank < 0) {
    if (used < n) snprintf(buf + used, n - used, "[?] (no shape declared)");
    return buf;
  }
  for (int d = 0; d < io->rank && used < n; d++) {
    used += (size_t)(io->dim_names[d][0]
                         ? snprintf(buf + used, n - used, "%s%s", d ? ", " : "[", io->dim_names[d])
                         : snprintf(buf + used, n - used, "%s%lld", d ? ", " : "[",
                                    (long long)io->dims[d]));
  }
  if (used < n) snprintf(buf + used, n - used, "%s", io->rank ? "]" : "[]");
  return buf;
}

static bool is_initializer(const Onnx__GraphProto *gp, const char *name) {
  for (size_t j = 0; j < gp->n_initializer; j++)
    if (gp->initializer[j]->name && !strcmp(gp->initializer[j]->name, name)) return true;
  return false;
}

/* "x f32[N, 3, 224, 224], mask i64[N]": the inputs a user binds. */
static const char *inputs_text(const Onnx__GraphProto *gp, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (size_t i = 0; i < gp->n_input && used < n; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    if (!vi->name || is_initializer(gp, vi->name)) continue;
    kl_onnx_io io;
    char t[400];
    io_decl(vi, true, &io);
    used += (size_t)snprintf(buf + used, n - used, "%s%s %s", used ? ", " : "", io.name,
                             kl_onnx_io_str(&io, t, sizeof t));
  }
  if (!used) snprintf(buf, n, "(none)");
  return buf;
}

static const kl_dim_override *dim_option(const kl_onnx_options *opt, const char *name) {
  for (int k = 0; opt && k < opt->ndims; k++)
    if (!strcmp(opt->dims[k].name, name)) return &opt->dims[k];
  return NULL;
}

/* --shape names an input, has its rank and keeps its static dims; --dim
 * names a symbolic dim of some input and agrees with --shape there.  The
 * message lists the inputs as declared. */
static int check_bindings(kl_onnx_ctx *c, const Onnx__GraphProto *gp, const kl_onnx_options *opt) {
  char list[1500], a[200], t[400];
  for (int k = 0; opt && k < opt->nshapes; k++) {
    const kl_shape_binding *b = &opt->shapes[k];
    const Onnx__ValueInfoProto *vi = NULL;
    for (size_t i = 0; i < gp->n_input && !vi; i++)
      if (gp->input[i]->name && !strcmp(gp->input[i]->name, b->input) &&
          !is_initializer(gp, b->input))
        vi = gp->input[i];
    size_t used = 0; /* the dims as the user typed them: 1,3,224,224 */
    a[0] = 0;
    for (int d = 0; d < b->shape.rank && used < sizeof a; d++)
      used += (size_t)snprintf(a + used, sizeof a - used, "%s%lld", d ? "," : "",
                               (long long)b->shape.dims[d]);
    if (!vi)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "--shape %s: the model has no input named '%s'; its inputs: %s", b->input,
                     b->input, inputs_text(gp, list, sizeof list));
    kl_onnx_io io;
    io_decl(vi, true, &io);
    int bad = io.rank >= 0 && io.rank != b->shape.rank ? -2 : -1;
    for (int d = 0; bad == -1 && d < io.rank; d++) {
      const kl_dim_override *o = io.dim_names[d][0] ? dim_option(opt, io.dim_names[d]) : NULL;
      if ((!io.dim_names[d][0] && io.dims[d] != b->shape.dims[d]) ||
          (o && o->value != b->shape.dims[d]))
        bad = d;
    }
    if (bad == -2)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "--shape %s=%s: rank %d, but the model declares %s %s (rank %d); its "
                     "inputs: %s", b->input, a, b->shape.rank, io.name,
                     kl_onnx_io_str(&io, t, sizeof t), io.rank, inputs_text(gp, list, sizeof list));
    if (bad >= 0)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "--shape %s=%s: dim %d is %lld, but the model declares %s %s%s; its "
                     "inputs: %s", b->input, a, bad, (long long)b->shape.dims[bad], io.name,
                     kl_onnx_io_str(&io, t, sizeof t),
                     io.dim_names[bad][0] ? " and --dim sets it otherwise" : "",
                     inputs_text(gp, list, sizeof list));
  }
  for (int k = 0; opt && k < opt->ndims; k++) {
    bool found = false;
    for (size_t i = 0; i < gp->n_input && !found; i++) {
      kl_onnx_io io;
      io_decl(gp->input[i], true, &io);
      for (int d = 0; d < io.rank; d++) found |= !strcmp(io.dim_names[d], opt->dims[k].name);
    }
    if (!found)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "--dim %s: no input has a symbolic dim named '%s'; the model's inputs: %s",
                     opt->dims[k].name, opt->dims[k].name, inputs_text(gp, list, sizeof list));
  }
  return 0;
}

/* The shape of input vi: --shape, else the declared dims with symbolic
 * ones bound by --dim; an unbound one is an error saying how to bind it. */
static int input_shape(kl_onnx_ctx *c, const Onnx__ValueInfoProto *vi,
                       const kl_onnx_options *opt, kl_shape *s) {
  kl_onnx_io io;
  io_decl(vi, true, &io);
  for (int k = 0; opt && k < opt->nshapes; k++)
    if (!strcmp(opt->shapes[k].input, io.name)) {
      *s = opt->shapes[k].shape; /* checked by check_bindings */
      return 0;
    }
  char t[400], flags[600] = "";
  size_t used = 0;
  s->rank = io.rank;
  for (int d = 0; d < io.rank; d++) {
    const kl_dim_override *o = io.dim_names[d][0] ? dim_option(opt, io.dim_names[d]) : NULL;
    s->dims[d] = o ? o->value : io.dims[d];
    if (io.dim_names[d][0] && !o && used < sizeof flags)
      used += (size_t)snprintf(flags + used, sizeof flags - used, " --dim %s=N", io.dim_names[d]);
  }
  if (io.rank < 0)
    return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                   "input '%s' declares no shape: bind it with --shape %s=d0,d1,...", io.name,
                   io.name);
  if (used)
    return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                   "input '%s' is declared %s, with symbolic dims: bind them with --shape "
                   "%s=d0,d1,... or%s", io.name, kl_onnx_io_str(&io, t, sizeof t), io.name, flags);
  return 0;
}

static bool too_many_elements(const kl_shape *s) {
  int64_t numel = 1;
  for (int d = 0; d < s->rank; d++) {
    if (s->dims[d] < 0 || (s->dims[d] && numel > KL_MAX_NUMEL / s->dims[d])) return true;
    numel *= s->dims[d];
  }
  return false;
}

static int add_inputs(kl_onnx_ctx *c, const Onnx__GraphProto *gp, const kl_onnx_options *opt) {
  if (check_bindings(c, gp, opt)) return -1;
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    if (!vi->name || !*vi->name)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "graph input %zu has no name", i);
    if (lookup(c, vi->name)) continue; /* an initializer: a weight with a default */
    const kl_frozen_input *fz = NULL;
    for (int k = 0; opt && k < opt->nfrozen; k++)
      if (!strcmp(opt->frozen[k].input, vi->name)) fz = &opt->frozen[k];
    if (fz) {
      size_t bytes = (size_t)fz->value->numel * kl_dtype_size(fz->value->dtype);
      void *raw = malloc(bytes ? bytes : 1);
      if (!raw) abort();
      kl_tensor_to_raw(fz->value, raw);
      kl_value *v = kl_graph_add_const_data(c->g, ir_name(c->g, vi->name), fz->value->dtype,
                                            &fz->value->shape, raw, (kl_loc){c->path, 0, 0});
      free(raw);
      bind_name(c, vi->name, v);
      continue;
    }
    kl_dtype dt;
    kl_shape s = {0};
    bool known;
    const char *unknown;
    if (value_type(c, vi, &dt, &s, &known, &unknown) || input_shape(c, vi, opt, &s)) return -1;
    if (too_many_elements(&s))
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "'%s': dims hold more than %lld elements", vi->name, (long long)KL_MAX_NUMEL);
    kl_value *v = kl_graph_add_input(c->g, ir_name(c->g, vi->name), dt, &s,
                                     (kl_loc){c->path, 0, 0});
    if (strcmp(v->name, vi->name)) v->label = kl_arena_strdup(&c->g->arena, vi->name);
    bind_name(c, vi->name, v);
  }
  return 0;
}

/* Every unsupported (op, opset, node) at once, so a user sees the whole
 * list in one try. */
/* Every unsupported op at once, each with its count and first node, so a
 * user sees the whole list in one try. */
static int check_supported(kl_onnx_ctx *c, const Onnx__GraphProto *gp) {
  enum { MAX_LISTED = 40 };
  struct unsupported_op {
    const Onnx__NodeProto *first;
    int count;
  } ops[MAX_LISTED];
  int nops = 0, total = 0;
  bool more = false;
  for (size_t i = 0; i < gp->n_node; i++) {
    const Onnx__NodeProto *n = gp->node[i];
    if (node_converter(c, n)) continue;
    total++;
    int k = 0;
    while (k < nops && (strcmp(ops[k].first->op_type ? ops[k].first->op_type : "",
                               n->op_type ? n->op_type : "") ||
                        strcmp(ops[k].first->domain ? ops[k].first->domain : "",
                               n->domain ? n->domain : "")))
      k++;
    if (k < nops) ops[k].count++;
    else if (nops < MAX_LISTED) ops[nops++] = (struct unsupported_op){n, 1};
    else more = true;
  }
  if (!total) return 0;
  char msg[sizeof c->err->msg];
  size_t used = 0;
  for (int k = 0; k < nops && used < sizeof msg - 200; k++) {
    const Onnx__NodeProto *n = ops[k].first;
    bool dflt = is_default_domain(n->domain);
    used += (size_t)snprintf(msg + used, sizeof msg - used, "\n  %s%s%s (opset %d)",
                             dflt ? "" : n->domain, dflt ? "" : ".", n->op_type ? n->op_type : "",
                             domain_opset(c, n->domain));
    if (ops[k].count > 1)
      used += (size_t)snprintf(msg + used, sizeof msg - used, " x%d, first node '%s'",
                               ops[k].count, node_label(n));
    else
      used += (size_t)snprintf(msg + used, sizeof msg - used, ", node '%s'", node_label(n));
  }
  if (more && used < sizeof msg - 60)
    snprintf(msg + used, sizeof msg - used, "\n  ... and more ops");
  kl_fail(c->err, (kl_loc){c->path, 0, 0}, "%d unsupported node%s:%s", total,
          total == 1 ? "" : "s", msg);
  c->err->unsupported = true;
  return -1;
}

/* ---- the order nodes are converted in -------------------------------
 * Sweeps over the node list, each taking in list order every node whose
 * inputs are bound, until all are taken.  Computed without sweeping: a
 * node is taken in the first sweep after each of its inputs' binders (the
 * same sweep when the binder comes before it in the list), so the nodes
 * come off a heap by (sweep, place in the list), each binding its outputs
 * and releasing the nodes that wait for them: linear in the graph even
 * when the list runs backwards. */
typedef struct {
  size_t sweep, node;
} sweep_key;

static bool key_before(sweep_key a, sweep_key b) {
  return a.sweep < b.sweep || (a.sweep == b.sweep && a.node < b.node);
}

static void key_push(sweep_key *heap, size_t *n, sweep_key k) {
  size_t i = (*n)++;
  for (; i > 0 && key_before(k, heap[(i - 1) / 2]); i = (i - 1) / 2) heap[i] = heap[(i - 1) / 2];
  heap[i] = k;
}

static sweep_key key_pop(sweep_key *heap, size_t *n) {
  sweep_key top = heap[0], last = heap[--*n];
  size_t i = 0;
  for (;;) {
    size_t k = 2 * i + 1;
    if (k >= *n) break;
    if (k + 1 < *n && key_before(heap[k + 1], heap[k])) k++;
    if (!key_before(heap[k], last)) break;
    heap[i] = heap[k];
    i = k;
  }
  if (*n) heap[i] = last;
  return top;
}

/* The names nodes wait for (unbound before the nodes), each with the
 * nodes that read it: waiting[first[w] .. first[w + 1]), one per reading. */
typedef struct {
  const char **names;
  int *slots;              /* hash index: name -> id + 1 */
  size_t cap, nnames;
  size_t *first, *waiting;
} wait_index;

static size_t wait_id(const wait_index *w, const char *name, bool *found) {
  size_t mask = w->cap - 1, k = (size_t)hash_str(name) & mask;
  for (; w->slots[k]; k = (k + 1) & mask)
    if (!strcmp(w->names[w->slots[k] - 1], name)) {
      *found = true;
      return (size_t)w->slots[k] - 1;
    }
  *found = false;
  return k; /* the free slot */
}

/* Every unbound input name of every node, with its readers. */
static void build_wait_index(kl_onnx_ctx *c, const Onnx__GraphProto *gp, wait_index *w,
                             size_t *pending) {
  size_t n = gp->n_node, reads = 0;
  for (size_t i = 0; i < n; i++) reads += gp->node[i]->n_input;
  w->cap = 2;
  while (w->cap < 2 * reads + 2) w->cap *= 2;
  w->names = malloc((reads + 1) * sizeof *w->names);
  w->slots = calloc(w->cap, sizeof *w->slots);
  w->first = calloc(reads + 2, sizeof *w->first);
  w->waiting = malloc((reads + 1) * sizeof *w->waiting);
  size_t *ids = malloc((reads + 1) * sizeof *ids), r = 0;
  if (!w->names || !w->slots || !w->first || !w->waiting || !ids) abort();
  w->nnames = 0;
  for (size_t i = 0; i < n; i++) {
    const Onnx__NodeProto *node = gp->node[i];
    for (size_t k = 0; k < node->n_input; k++, r++) {
      const char *in = node->input[k];
      ids[r] = SIZE_MAX;
      if (!in || !*in || lookup(c, in)) continue;
      bool found;
      size_t id = wait_id(w, in, &found);
      if (!found) {
        w->slots[id] = (int)w->nnames + 1;
        w->names[w->nnames] = in;
        id = w->nnames++;
      }
      ids[r] = id;
      w->first[id + 1]++;
      pending[i]++;
    }
  }
  for (size_t id = 0; id < w->nnames; id++) w->first[id + 1] += w->first[id];
  size_t *fill = malloc((w->nnames + 1) * sizeof *fill);
  if (!fill) abort();
  memcpy(fill, w->first, (w->nnames + 1) * sizeof *fill);
  r = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < gp->node[i]->n_input; k++, r++)
      if (ids[r] != SIZE_MAX) w->waiting[fill[ids[r]]++] = i;
  free(fill);
  free(ids);
}

/* Nodes in an order where producers come first (ONNX requires it, but we
 * accept any order), with dangling inputs and cycles reported. */
static int order_nodes(kl_onnx_ctx *c, const Onnx__GraphProto *gp, size_t *order) {
  size_t n = gp->n_node, done = 0, nheap = 0;
  bool *placed = calloc(n + 1, 1);
  size_t *pending = calloc(n + 1, sizeof *pending), *sweep = calloc(n + 1, sizeof *sweep);
  sweep_key *heap = malloc((n + 1) * sizeof *heap);
  if (!placed || !pending || !sweep || !heap) abort();
  wait_index wi;
  build_wait_index(c, gp, &wi, pending);
  int rc = 0;
  for (size_t i = 0; i < n; i++)
    if (!pending[i]) key_push(heap, &nheap, (sweep_key){sweep[i] = 1, i});
  while (nheap) {
    sweep_key at = key_pop(heap, &nheap);
    const Onnx__NodeProto *node = gp->node[at.node];
    for (size_t k = 0; k < node->n_output; k++) {
      const char *out = node->output[k];
      if (!out || !*out || lookup(c, out)) continue;
      bind_name(c, out, NULL); /* placeholder, removed below */
      c->vals[c->nvals - 1].const_checked = true;
      bool found;
      size_t id = wait_id(&wi, out, &found);
      for (size_t r = found ? wi.first[id] : 0; found && r < wi.first[id + 1]; r++) {
        size_t j = wi.waiting[r], s = j > at.node ? at.sweep : at.sweep + 1;
        if (s > sweep[j]) sweep[j] = s;
        if (--pending[j] == 0) key_push(heap, &nheap, (sweep_key){sweep[j], j});
      }
    }
    placed[at.node] = true;
    order[done++] = at.node;
  }
  free(pending), free(sweep), free(heap);
  free(wi.names), free(wi.slots), free(wi.first), free(wi.waiting);
  if (done < n) {
    for (size_t i = 0; i < n && !rc; i++) {
      if (placed[i]) continue;
      const Onnx__NodeProto *node = gp->node[i];
      for (size_t k = 0; k < node->n_input; k++) {
        const char *in = node->input[k];
        if (!in || !*in || lookup(c, in)) continue;
        bool produced = false;
        for (size_t j = 0; j < n && !produced; j++)
          for (size_t o = 0; o < gp->node[j]->n_output; o++)
            produced |= gp->node[j]->output[o] && !strcmp(gp->node[j]->output[o], in);
        c->node = node;
        rc = produced ? kl_onnx_fail(c, "is part of a cycle (through '%s')", in)
                      : kl_onnx_fail(c, "input '%s' is not produced by any node, initializer "
                                        "or graph input", in);
        break;
      }
    }
  }
  /* drop the placeholders */
  int w = 0;
  for (int i = 0; i < c->nvals; i++)
    if (c->vals[i].v || c->vals[i].is_seq) c->vals[w++] = c->vals[i];
  c->nvals = w;
  reindex(c);
  free(placed);
  return rc;
}

/* A 64-bit constant that an IR node reads (not one a converter consumed
 * while loading, such as a Slice bound) must be exact as a double: the
 * error names the ONNX node that reads it, whatever the device. */
static int check_exact_constants(kl_onnx_ctx *c, int first_node) {
  for (int i = first_node; i < c->g->nodes.len; i++) {
    const kl_node *nd = c->g->nodes.items[i];
    for (int k = 0; k < nd->ninputs; k++) {
      const kl_value *v = nd->inputs[k];
      int64_t x, at;
      if ((v->kind != KL_VAL_PARAM && v->kind != KL_VAL_CONST) || !v->data ||
          (v->dtype != KL_I64 && v->dtype != KL_U64) || (at = first_inexact(v, &x)) < 0)
        continue;
      kl_onnx_binding *b = binding_of(c, v);
      char num[32];
      if (v->dtype == KL_U64) snprintf(num, sizeof num, "%llu", (unsigned long long)x);
      else snprintf(num, sizeof num, "%lld", (long long)x);
      return kl_onnx_fail(c, "%s constant '%s' holds %s at element %lld, beyond 2^53: "
                             "an integer that large cannot be held exactly",
                          kl_dtype_name(v->dtype), b && *b->name ? b->name : v->name, num,
                          (long long)at);
    }
  }
  return 0;
}

static int convert_nodes(kl_onnx_ctx *c, const Onnx__GraphProto *gp) {
  size_t *order = calloc(gp->n_node + 1, sizeof *order);
  if (!order) abort();
  int rc = order_nodes(c, gp, order);
  for (size_t i = 0; i < gp->n_node && !rc; i++) {
    const Onnx__NodeProto *n = gp->node[order[i]];
    c->node = n;
    for (size_t k = 0; k < n->n_input && !rc; k++)
      if (n->input[k] && *n->input[k] && !lookup(c, n->input[k]))
        rc = kl_onnx_fail(c, "input '%s' is not defined", n->input[k]);
    if (rc) break;
    int first_node = c->g->nodes.len;
    rc = node_converter(c, n)->convert(c, n);
    if (!rc) rc = check_exact_constants(c, first_node);
    for (size_t k = 0; k < n->n_output && !rc; k++)
      if (n->output[k] && *n->output[k] && !lookup(c, n->output[k]))
        rc = kl_onnx_unsupported(c, "output %zu ('%s') is not supported by Kiln's converter", k,
                                 n->output[k]);
  }
  c->node = NULL;
  free(order);
  return rc;
}

/* value_info declares types of intermediate values; where it gives a
 * dtype and concrete dims, Kiln's inference must agree (a disagreement
 * means a wrong model or a wrong converter, and either deserves a loud
 * error naming the value).  Symbolic dims are not compared. */
static int check_value_info(kl_onnx_ctx *c, const Onnx__GraphProto *gp) {
  for (size_t i = 0; i < gp->n_value_info; i++) {
    const Onnx__ValueInfoProto *vi = gp->value_info[i];
    if (!vi->name || !vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
      continue;
    kl_onnx_binding *b = lookup(c, vi->name);
    if (!b || !b->v) continue;
    const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
    kl_dtype dt;
    if (tt->has_elem_type && kl_onnx_dtype(tt->elem_type, &dt) == 0 && dt != b->v->dtype)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "value '%s' is declared %s in value_info but computes to %s", vi->name,
                     kl_dtype_name(dt), kl_dtype_name(b->v->dtype));
    if (!tt->shape) continue;
    bool same = (int)tt->shape->n_dim == b->v->shape.rank;
    for (int d = 0; same && d < b->v->shape.rank; d++) {
      const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
      if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
        same = dim->dim_value == b->v->shape.dims[d];
    }
    if (!same) {
      char s[128];
      return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                     "value '%s' has rank %zu or dims in value_info that differ from the "
                     "computed %s%s", vi->name, tt->shape->n_dim, kl_dtype_name(b->v->dtype),
                     kl_shape_str(&b->v->shape, s, sizeof s));
    }
  }
  return 0;
}

static int mark_outputs(kl_onnx_ctx *c, const Onnx__GraphProto *gp) {
  if (gp->n_output == 0)
    return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "the graph has no outputs");
  for (size_t i = 0; i < gp->n_output; i++) {
    const Onnx__ValueInfoProto *vi = gp->output[i];
    const char *name = vi->name ? vi->name : "";
    kl_onnx_binding *b = lookup(c, name);
    if (!b)
      return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "graph output '%s' is not produced", name);
    if (b->is_seq) {
      kl_fail(c->err, (kl_loc){c->path, 0, 0},
              "graph output '%s' is a sequence; Kiln's outputs are tensors", name);
      c->err->unsupported = true;
      return -1;
    }
    for (size_t j = 0; j < i; j++)
      if (gp->output[j]->name && !strcmp(gp->output[j]->name, name))
        return kl_fail(c->err, (kl_loc){c->path, 0, 0}, "graph output '%s' is listed twice", name);
    kl_value *v = b->v;
    /* Two outputs may be the same IR value (Identity), or an output a graph
     * input or a weight: give it a copy so outputs stay distinct and keep
     * their names.  An output aliasing a value of another name takes its
     * own. */
    char want[256];
    if (v->is_output || v->kind != KL_VAL_NODE) {
      c->node = NULL;
      kl_shape one = {0};
      bool is_bool = v->dtype == KL_BOOL; /* x != false; x * 1 keeps -0 and NaN */
      double unit = is_bool ? 0 : 1;
      kl_value *z = kl_onnx_constant(c, v->dtype, &one, &unit, 1);
      kl_value *ins[2] = {v, z};
      if (!z || !(v = kl_onnx_emit(c, is_bool ? KL_OP_NE : KL_OP_MUL, ins, 2, NULL, 0)))
        return -1;
      kl_graph_rename_value(c->g, v, ir_name(c->g, name));
    } else if (strcmp(v->name, identifier(name, want, sizeof want))) {
      kl_graph_rename_value(c->g, v, ir_name(c->g, name));
    }
    if (strcmp(v->name, name)) v->label = kl_arena_strdup(&c->g->arena, name);
    /* The declared type, when given, must agree with what Kiln inferred. */
    kl_dtype dt;
    kl_shape s = {0};
    bool known;
    const char *unknown;
    if (vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
        value_type(c, vi, &dt, &s, &known, &unknown) == 0) {
      char a[128], bb[128];
      if (dt != v->dtype || (known && !kl_shape_equal(&s, &v->shape)))
        return kl_fail(c->err, (kl_loc){c->path, 0, 0},
                       "graph output '%s' is declared %s%s but computes to %s%s", name,
                       kl_dtype_name(dt), known ? kl_shape_str(&s, a, sizeof a) : "[?]",
                       kl_dtype_name(v->dtype), kl_shape_str(&v->shape, bb, sizeof bb));
    }
    if (kl_graph_mark_output(c->g, v, c->err)) return -1;
  }
  return 0;
}

static void reset_results(kl_onnx_options *opt, kl_error *err) {
  memset(err, 0, sizeof *err);
  if (opt) {
    opt->unsupported_only = false;
    opt->needs_const[0] = 0;
  }
}

/* The graph of model m (freed here); `file`, when given, is where m was
 * parsed from, mapped, with the raw_data taken out of it. */
static kl_graph *load_model(Onnx__ModelProto *m, const char *path, const kl_onnx_file *file,
                            kl_onnx_options *opt, kl_error *err) {
  kl_onnx_ctx c = {.path = path, .err = err, .model = m, .file = file};
  int rc = 0;
  if (!m->graph) rc = kl_fail(err, (kl_loc){path, 0, 0}, "the model has no graph");
  if (!rc) rc = model_opset(&c, m);
  if (!rc) {
    c.g = kl_graph_new(NULL);
    c.g->name = ir_name(c.g, m->graph->name && *m->graph->name ? m->graph->name : "model");
    rc = check_supported(&c, m->graph);
  }
  if (!rc) rc = add_initializers(&c, m->graph);
  if (!rc) rc = add_inputs(&c, m->graph, opt);
  if (!rc) rc = convert_nodes(&c, m->graph);
  if (!rc) rc = check_value_info(&c, m->graph);
  if (!rc) rc = mark_outputs(&c, m->graph);
  if (!rc && !c.g->train) kl_graph_drop_unread_params(c.g); /* consumed while loading */
  if (!rc) rc = kl_verify(c.g, err);
  if (rc && opt) {
    opt->unsupported_only = err->unsupported;
    snprintf(opt->needs_const, sizeof opt->needs_const, "%s",
             c.blocking_input ? c.blocking_input : "");
  }
  for (int i = 0; i < c.nvals; i++) kl_tensor_free(c.vals[i].konst);
  free(c.vals);
  free(c.by_name);
  free(c.by_value);
  onnx__model_proto__free_unpacked(m, NULL);
  if (rc) {
    kl_graph_free(c.g);
    return NULL;
  }
  return c.g;
}

kl_graph *kl_onnx_load_bytes(const unsigned char *data, size_t len, const char *path,
                             kl_onnx_options *opt, kl_error *err) {
  reset_results(opt, err);
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, data);
  if (!m) {
    kl_fail(err, (kl_loc){path, 0, 0}, "not an ONNX model (the protobuf does not parse)");
    return NULL;
  }
  return load_model(m, path, NULL, opt, err);
}

/* The file is mapped, and weights inside it stay there: the graph keeps
 * the mapping when a param points into it. */
kl_graph *kl_onnx_load(const char *path, kl_onnx_options *opt, kl_error *err) {
  reset_results(opt, err);
  kl_onnx_file file;
  Onnx__ModelProto *m = kl_onnx_unpack_file(path, &file, err);
  if (!m) return NULL;
  kl_graph *g = load_model(m, path, &file, opt, err);
  bool used = false;
  for (int i = 0; i < file.nspans; i++) used |= file.spans[i].has;
  if (g && used) {
    kl_graph_add_mapping(g, path, file.base, file.len);
    file.base = NULL;
  }
  kl_onnx_file_close(&file);
  return g;
}

int kl_onnx_read_signature(const char *path, kl_onnx_signature *sig, kl_error *err) {
  memset(sig, 0, sizeof *sig);
  kl_onnx_file file;
  Onnx__ModelProto *m = kl_onnx_unpack_file(path, &file, err);
  kl_onnx_file_close(&file);
  if (!m) return -1;
  const Onnx__GraphProto *gp = m->graph;
  if (!gp) {
    onnx__model_proto__free_unpacked(m, NULL);
    return kl_fail(err, (kl_loc){path, 0, 0}, "the model has no graph");
  }
  sig->inputs = calloc(gp->n_input + 1, sizeof *sig->inputs);
  sig->outputs = calloc(gp->n_output + 1, sizeof *sig->outputs);
  if (!sig->inputs || !sig->outputs) abort();
  for (size_t i = 0; i < gp->n_input; i++) {
    if (!gp->input[i]->name || is_initializer(gp, gp->input[i]->name)) continue;
    kl_onnx_io *io = &sig->inputs[sig->ninputs++];
    io_decl(gp->input[i], true, io);
    for (int d = 0; d < io->rank; d++) sig->nsymbolic += io->dim_names[d][0] != 0;
  }
  for (size_t i = 0; i < gp->n_output; i++) io_decl(gp->output[i], false, &sig->outputs[sig->noutputs++]);
  onnx__model_proto__free_unpacked(m, NULL);
  return 0;
}

void kl_onnx_signature_free(kl_onnx_signature *sig) {
  free(sig->inputs);
  free(sig->outputs);
  memset(sig, 0, sizeof *sig);
}

int kl_onnx_input_names(const char *path, char (*names)[256], int cap, kl_error *err) {
  kl_onnx_file file;
  Onnx__ModelProto *m = kl_onnx_unpack_file(path, &file, err);
  kl_onnx_file_close(&file);
  if (!m) return -1;
  if (!m->graph) {
    onnx__model_proto__free_unpacked(m, NULL);
    return kl_fail(err, (kl_loc){path, 0, 0}, "the model has no graph");
  }
  int n = 0;
  for (size_t i = 0; i < m->graph->n_input && n < cap; i++) {
    const char *name = m->graph->input[i]->name ? m->graph->input[i]->name : "";
    bool init = false;
    for (size_t j = 0; j < m->graph->n_initializer; j++)
      init |= m->graph->initializer[j]->name && !strcmp(m->graph->initializer[j]->name, name);
    if (!init) snprintf(names[n++], 256, "%s", name);
  }
  onnx__model_proto__free_unpacked(m, NULL);
  return n;
}

enum { MAX_SPECIALISED = 64 };

kl_graph *kl_onnx_load_for_inputs(const char *path, const char *const *names,
                                  kl_tensor *const *values, int n, bool *frozen,
                                  kl_onnx_options *opt, kl_error *err) {
  kl_shape_binding binds[MAX_SPECIALISED];
  kl_frozen_input fz[MAX_SPECIALISED];
  int nb = 0, nf = 0;
  if (n > MAX_SPECIALISED) n = MAX_SPECIALISED;
  for (int k = 0; k < n; k++) frozen[k] = false;
  for (int attempt = 0; attempt <= n + 1; attempt++) {
    opt->shapes = binds;
    opt->nshapes = nb;
    opt->frozen = fz;
    opt->nfrozen = nf;
    kl_graph *g = kl_onnx_load(path, opt, err);
    if (g) return g;
    if (opt->needs_const[0]) {
      int k = 0;
      while (k < n && strcmp(names[k], opt->needs_const)) k++;
      if (k == n || !values[k] || frozen[k]) return NULL;
      frozen[k] = true;
      fz[nf++] = (kl_frozen_input){names[k], values[k]};
      int w = 0; /* a frozen input is no longer an input to bind */
      for (int b = 0; b < nb; b++)
        if (strcmp(binds[b].input, names[k])) binds[w++] = binds[b];
      nb = w;
    } else if (strstr(err->msg, "--shape") && !strstr(err->msg, "no input named") && nb == 0) {
      for (int k = 0; k < n; k++)
        if (values[k] && !frozen[k]) binds[nb++] = (kl_shape_binding){names[k], values[k]->shape};
      if (!nb) return NULL;
    } else {
      return NULL;
    }
  }
  return NULL;
}
