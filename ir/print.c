/* print.c - the IR as text, in the .kl syntax so that it parses back. */
#include <stdlib.h>
#include <string.h>

#include "op_impl.h"

/* Shortest text that reads back as the same double. */
static void print_number(FILE *f, double v) {
  char buf[40];
  if (v != v) { fputs("nan", f); return; }
  if (v > 1.7976931348623157e308) { fputs("inf", f); return; }
  if (v < -1.7976931348623157e308) { fputs("-inf", f); return; }
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  fputs(buf, f);
}

static void print_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
    else if (*s == '\n') fputs("\\n", f);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static void print_type(FILE *f, const kl_value *v) {
  fprintf(f, "%s[", kl_dtype_name(v->dtype));
  for (int i = 0; i < v->shape.rank; i++)
    fprintf(f, "%s%lld", i ? ", " : "", (long long)v->shape.dims[i]);
  fputc(']', f);
}

static void print_attr(FILE *f, const kl_attr *a) {
  fprintf(f, "%s=", a->name);
  switch (a->kind) {
  case KL_ATTR_INT: fprintf(f, "%lld", (long long)a->i); break;
  case KL_ATTR_FLOAT: print_number(f, a->f); break;
  case KL_ATTR_STRING: print_string(f, a->s); break;
  case KL_ATTR_DTYPE: fputs(kl_dtype_name((kl_dtype)a->i), f); break;
  case KL_ATTR_INTS:
  case KL_ATTR_FLOATS:
    fputc('[', f);
    for (int i = 0; i < a->n; i++) {
      if (i) fputs(", ", f);
      if (a->kind == KL_ATTR_INTS) fprintf(f, "%lld", (long long)a->ints[i]);
      else print_number(f, a->floats[i]);
    }
    fputc(']', f);
    break;
  }
}

/* Small constants print their values so the text stays complete; large
 * ones (weights loaded from files) only say how big they are. */
enum { MAX_INLINE_VALUES = 256 };

bool kl_print_inlines(const kl_value *v) {
  bool contents = v->init.kind == KL_INIT_DATA || v->init.kind == KL_INIT_LOAD;
  return !contents || !v->data || kl_shape_numel(&v->shape) <= MAX_INLINE_VALUES;
}

static void print_init(FILE *f, const kl_value *v, const char *weights) {
  const kl_init *in = &v->init;
  if (weights && !kl_print_inlines(v)) { /* the caller writes it there */
    fputs(" = load(", f); print_string(f, weights);
    fputs(", key=", f); print_string(f, v->name);
    fputc(')', f);
    return;
  }
  if (weights && in->kind == KL_INIT_LOAD && v->data) { /* small: printed, self-contained */
    kl_value data = *v;
    data.init.kind = KL_INIT_DATA;
    print_init(f, &data, weights);
    return;
  }
  switch (in->kind) {
  case KL_INIT_NONE: break;
  case KL_INIT_ZEROS: fputs(" = zeros", f); break;
  case KL_INIT_ONES: fputs(" = ones", f); break;
  case KL_INIT_FULL: fputs(" = full(", f); print_number(f, in->a); fputc(')', f); break;
  case KL_INIT_RANDN:
    fputs(" = randn(", f); print_number(f, in->a);
    if (in->b != 0) { fputs(", mean=", f); print_number(f, in->b); }
    fprintf(f, ", seed=%llu)", (unsigned long long)in->seed);
    break;
  case KL_INIT_UNIFORM:
    fputs(" = uniform(", f); print_number(f, in->a); fputs(", ", f);
    print_number(f, in->b);
    fprintf(f, ", seed=%llu)", (unsigned long long)in->seed);
    break;
  case KL_INIT_LOAD:
    fputs(" = load(", f); print_string(f, in->path);
    if (in->key) { fputs(", key=", f); print_string(f, in->key); }
    fputc(')', f);
    break;
  case KL_INIT_DATA: {
    int64_t n = kl_shape_numel(&v->shape);
    if (n > MAX_INLINE_VALUES || !v->data) {
      fprintf(f, " = data(%lld bytes)", (long long)(n * (int64_t)kl_dtype_size(v->dtype)));
      break;
    }
    kl_tensor *t = kl_tensor_new(v->dtype, &v->shape);
    kl_tensor_from_raw(t, v->data);
    fputs(" = values([", f);
    for (int64_t i = 0; i < n; i++) {
      if (i) fputs(", ", f);
      print_number(f, t->data[i]);
    }
    fputs("])", f);
    kl_tensor_free(t);
    break;
  }
  }
}

static void print_settings(FILE *f, const kl_attr *attrs, int n) {
  fputc('(', f);
  for (int k = 0; k < n; k++) {
    if (k) fputs(", ", f);
    print_attr(f, &attrs[k]);
  }
  fputs(")\n", f);
}

static void print_train(FILE *f, const kl_train *t) {
  fprintf(f, "train {\n  loss = %s\n  optimizer = %s", t->loss, t->optimizer);
  print_settings(f, t->attrs, t->nattrs);
  if (t->schedule) {
    fprintf(f, "  schedule = %s", t->schedule);
    print_settings(f, t->schedule_attrs, t->nschedule_attrs);
  }
  if (t->clip) {
    fputs("  clip = ", f);
    print_number(f, t->clip);
    fputc('\n', f);
  }
  fputs("}\n", f);
}

void kl_print_graph(FILE *f, const kl_graph *g) { kl_print_graph_weights(f, g, NULL); }

void kl_print_graph_weights(FILE *f, const kl_graph *g, const char *weights) {
  fprintf(f, "model %s\n", g->name);
  for (int i = 0; i < g->inputs.len; i++) {
    fprintf(f, "input %s: ", g->inputs.items[i]->name);
    print_type(f, g->inputs.items[i]);
    fputc('\n', f);
  }
  for (int i = 0; i < g->params.len; i++) {
    const kl_value *v = g->params.items[i];
    fprintf(f, "%s %s: ", v->kind == KL_VAL_PARAM ? "param" : "const", v->name);
    print_type(f, v);
    print_init(f, v, weights);
    fputc('\n', f);
  }
  kl_node **order = malloc(((size_t)g->nodes.len + 1) * sizeof *order);
  if (!order) abort();
  if (kl_topo_order(g, order, NULL)) /* cyclic: print in creation order */
    memcpy(order, g->nodes.items, (size_t)g->nodes.len * sizeof *order);
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = order[i];
    fputs("let ", f);
    for (int k = 0; k < n->noutputs; k++)
      fprintf(f, "%s%s", k ? ", " : "", n->outputs[k]->name);
    fprintf(f, " = %s(", kl_ops[n->op].name);
    for (int k = 0; k < n->ninputs; k++)
      fprintf(f, "%s%s", k ? ", " : "", n->inputs[k]->name);
    for (int k = 0; k < n->nattrs; k++) {
      if (k || n->ninputs) fputs(", ", f);
      print_attr(f, &n->attrs[k]);
    }
    fputs(")  # ", f);
    for (int k = 0; k < n->noutputs; k++) {
      if (k) fputs(", ", f);
      print_type(f, n->outputs[k]);
    }
    if (n->after) fprintf(f, "; recomputed after %s", n->after->name); /* (text only) */
    fputc('\n', f);
  }
  free(order);
  for (int i = 0; i < g->outputs.len; i++)
    fprintf(f, "output %s\n", g->outputs.items[i]->name);
  if (g->train) print_train(f, g->train);
}
