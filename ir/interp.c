/* interp.c - the reference interpreter: the oracle every compiled program and
 * every pass is checked against.  Values are float64 and rounded to their
 * dtype after each op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kilnrt.h"
#include "op_impl.h"

kl_tensor *kl_tensor_new(kl_dtype t, const kl_shape *s) {
  kl_tensor *x = calloc(1, sizeof *x);
  if (!x) abort();
  x->dtype = t;
  x->shape = *s;
  x->numel = kl_shape_numel(s);
  x->data = calloc((size_t)(x->numel ? x->numel : 1), sizeof(double));
  if (!x->data) {
    fprintf(stderr, "kiln: out of memory for a tensor of %lld elements\n",
            (long long)x->numel);
    exit(3);
  }
  return x;
}

void kl_tensor_free(kl_tensor *t) {
  if (!t) return;
  free(t->data);
  free(t);
}

double kl_raw_get(kl_dtype t, const void *raw, int64_t i, bool *inexact) {
  const unsigned char *p = raw;
  switch (t) {
  case KL_F32: { float x; memcpy(&x, p + 4 * i, 4); return x; }
  case KL_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return krt_f16_to_f32(h); }
  case KL_BF16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return krt_bf16_to_f32(h); }
  case KL_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
  case KL_I8: return (int8_t)p[i];
  case KL_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); return x; }
  case KL_I64: {
    int64_t x;
    memcpy(&x, p + 8 * i, 8);
    if ((x > KL_MAX_EXACT_I64 || x < -KL_MAX_EXACT_I64) && inexact) *inexact = true;
    return (double)x;
  }
  case KL_BOOL: return p[i] != 0;
  case KL_U8: return p[i];
  case KL_I16: { int16_t x; memcpy(&x, p + 2 * i, 2); return x; }
  case KL_U16: { uint16_t x; memcpy(&x, p + 2 * i, 2); return x; }
  case KL_U32: { uint32_t x; memcpy(&x, p + 4 * i, 4); return x; }
  case KL_U64: {
    uint64_t x;
    memcpy(&x, p + 8 * i, 8);
    if (x > (uint64_t)KL_MAX_EXACT_I64 && inexact) *inexact = true;
    return (double)x;
  }
  case KL_U4: case KL_U2: return p[i];
  case KL_I4: case KL_I2: return (int8_t)p[i];
  case KL_F8E4M3FN: case KL_F8E4M3FNUZ: case KL_F8E5M2: case KL_F8E5M2FNUZ:
  case KL_F4E2M1: case KL_F8E8M0:
    return krt_small_float_to_f32((krt_dtype)t, p[i]);
  default: return 0;
  }
}

void kl_raw_set(kl_dtype t, void *raw, int64_t i, double v) {
  unsigned char *p = raw;
  v = kl_dtype_round(t, v);
  switch (t) {
  case KL_F32: { float x = (float)v; memcpy(p + 4 * i, &x, 4); break; }
  case KL_F16: { uint16_t h = krt_f32_to_f16((float)v); memcpy(p + 2 * i, &h, 2); break; }
  case KL_BF16: { uint16_t h = krt_f32_to_bf16((float)v); memcpy(p + 2 * i, &h, 2); break; }
  case KL_F64: memcpy(p + 8 * i, &v, 8); break;
  case KL_I8: p[i] = (unsigned char)(int8_t)v; break;
  case KL_I32: { int32_t x = (int32_t)v; memcpy(p + 4 * i, &x, 4); break; }
  /* 2^63 (INT64_MAX rounded to a double) saturates, as in kl_to_i64 */
  case KL_I64: { int64_t x = kl_to_i64(v); memcpy(p + 8 * i, &x, 8); break; }
  case KL_BOOL: p[i] = v != 0; break;
  case KL_U8: p[i] = (unsigned char)v; break;
  case KL_I16: { int16_t x = (int16_t)v; memcpy(p + 2 * i, &x, 2); break; }
  case KL_U16: { uint16_t x = (uint16_t)v; memcpy(p + 2 * i, &x, 2); break; }
  case KL_U32: { uint32_t x = (uint32_t)v; memcpy(p + 4 * i, &x, 4); break; }
  case KL_U64: {
    uint64_t x = v >= 0x1p64 ? UINT64_MAX : (uint64_t)v;
    memcpy(p + 8 * i, &x, 8);
    break;
  }
  case KL_U4: case KL_U2: p[i] = (unsigned char)v; break;
  case KL_I4: case KL_I2: p[i] = (unsigned char)(int8_t)v; break;
  case KL_F8E4M3FN: case KL_F8E4M3FNUZ: case KL_F8E5M2: case KL_F8E5M2FNUZ:
  case KL_F4E2M1: case KL_F8E8M0: /* v is rounded: the code is exact */
    p[i] = krt_f32_to_small_float((krt_dtype)t, (float)v, 0, KRT_ROUND_DOWN);
    break;
  default: break;
  }
}

int kl_tensor_from_raw(kl_tensor *t, const void *raw) {
  bool inexact = false;
  for (int64_t i = 0; i < t->numel; i++) t->data[i] = kl_raw_get(t->dtype, raw, i, &inexact);
  return inexact ? -1 : 0;
}

void kl_tensor_to_raw(const kl_tensor *t, void *raw) {
  for (int64_t i = 0; i < t->numel; i++) kl_raw_set(t->dtype, raw, i, t->data[i]);
}

/* The next element of a seeded init, rounded to v's dtype. */
static double init_draw(const kl_value *v, kl_rng *rng) {
  double x = 0;
  switch (v->init.kind) {
  case KL_INIT_ONES: x = 1; break;
  case KL_INIT_FULL: x = v->init.a; break;
  case KL_INIT_RANDN: x = v->init.b + v->init.a * kl_rng_normal(rng); break;
  case KL_INIT_UNIFORM: x = v->init.a + (v->init.b - v->init.a) * kl_rng_uniform(rng); break;
  default: break;
  }
  return kl_dtype_round(v->dtype, x);
}

void kl_init_fill_raw(const kl_value *v, kl_rng *rng, int64_t n, void *raw) {
  for (int64_t i = 0; i < n; i++) kl_raw_set(v->dtype, raw, i, init_draw(v, rng));
}

int kl_value_materialize(const kl_value *v, kl_tensor **out, kl_error *err) {
  kl_tensor *t = kl_tensor_new(v->dtype, &v->shape);
  kl_rng rng;
  kl_rng_seed(&rng, v->init.seed);
  for (int64_t i = 0; i < t->numel; i++) t->data[i] = init_draw(v, &rng);
  if (v->init.kind == KL_INIT_LOAD || v->init.kind == KL_INIT_DATA) {
    if (!v->data) {
      kl_tensor_free(t);
      return kl_fail(err, v->loc, "'%s' has no contents: its weights were not loaded",
                     v->name);
    }
    if (kl_tensor_from_raw(t, v->data)) {
      kl_tensor_free(t);
      return kl_fail(err, v->loc, "%s constant '%s' holds a value beyond 2^53, which "
                     "cannot be held exactly", kl_dtype_name(v->dtype), v->name);
    }
  }
  *out = t;
  return 0;
}

static int check_input(const kl_value *decl, const kl_tensor *t, kl_error *err) {
  if (!t)
    return kl_fail(err, decl->loc, "input '%s' was not given", decl->name);
  if (t->dtype != decl->dtype || !kl_shape_equal(&t->shape, &decl->shape)) {
    char a[128], b[128];
    return kl_fail(err, decl->loc, "input '%s' must be %s%s, got %s%s", decl->name,
                   kl_dtype_name(decl->dtype), kl_shape_str(&decl->shape, a, sizeof a),
                   kl_dtype_name(t->dtype), kl_shape_str(&t->shape, b, sizeof b));
  }
  return 0;
}

static kl_tensor *tensor_copy(const kl_tensor *t) {
  kl_tensor *c = kl_tensor_new(t->dtype, &t->shape);
  memcpy(c->data, t->data, (size_t)t->numel * sizeof(double));
  return c;
}

/* Mark the nodes that the outputs depend on; the rest (a training loss, dead
 * code) is not evaluated. */
static void mark_live(const kl_graph *g, kl_node **order, bool *live) {
  for (int i = 0; i < g->outputs.len; i++)
    if (g->outputs.items[i]->producer) live[g->outputs.items[i]->producer->id] = true;
  for (int i = g->nodes.len - 1; i >= 0; i--) {
    const kl_node *n = order[i];
    if (!live[n->id]) continue;
    for (int k = 0; k < n->ninputs; k++)
      if (n->inputs[k]->producer) live[n->inputs[k]->producer->id] = true;
  }
}

int kl_interpret(const kl_graph *g, kl_tensor **inputs, kl_tensor **outputs,
                 kl_error *err) {
  int nv = g->values.len, nn = g->nodes.len, rc = 0;
  kl_tensor **val = calloc((size_t)nv + 1, sizeof *val);
  kl_node **order = calloc((size_t)nn + 1, sizeof *order);
  bool *live = calloc((size_t)nn + 1, sizeof *live);
  int *last_use = calloc((size_t)nv + 1, sizeof *last_use);
  bool *owned = calloc((size_t)nv + 1, sizeof *owned);
  if (!val || !order || !live || !last_use || !owned) abort();
  for (int i = 0; i < g->outputs.len; i++) outputs[i] = NULL;
  if ((rc = kl_topo_order(g, order, err))) goto done;
  mark_live(g, order, live);
  for (int i = 0; i < g->inputs.len; i++) {
    if ((rc = check_input(g->inputs.items[i], inputs[i], err))) goto done;
    val[g->inputs.items[i]->id] = inputs[i];
  }
  /* Only params that a live node or an output reads: a constant that only
   * fed compile-time shape folding (a slice end of INT64_MAX) is never
   * needed, and may not even be representable. */
  bool *read = calloc((size_t)nv + 1, sizeof *read);
  if (!read) abort();
  for (int i = 0; i < nn; i++)
    if (live[order[i]->id])
      for (int k = 0; k < order[i]->ninputs; k++) read[order[i]->inputs[k]->id] = true;
  for (int i = 0; i < g->outputs.len; i++) read[g->outputs.items[i]->id] = true;
  for (int i = 0; i < g->params.len; i++) {
    const kl_value *p = g->params.items[i];
    if (!read[p->id]) continue;
    if ((rc = kl_value_materialize(p, &val[p->id], err))) { free(read); goto done; }
    owned[p->id] = true;
  }
  free(read);
  /* Free each intermediate after its last reader, so the oracle's memory
   * stays near the graph's live set. */
  for (int i = 0; i < nn; i++)
    for (int k = 0; k < order[i]->ninputs; k++)
      last_use[order[i]->inputs[k]->id] = i;
  for (int i = 0; i < g->outputs.len; i++) last_use[g->outputs.items[i]->id] = nn;

  for (int i = 0; i < nn && !rc; i++) {
    const kl_node *n = order[i];
    if (!live[n->id]) continue;
    kl_tensor *in[64], *out[64];
    if (n->ninputs > 64 || n->noutputs > 64) {
      rc = kl_node_fail(n, err, "more than 64 inputs or outputs");
      break;
    }
    for (int k = 0; k < n->ninputs; k++) in[k] = val[n->inputs[k]->id];
    for (int k = 0; k < n->noutputs; k++) {
      kl_value *o = n->outputs[k];
      out[k] = val[o->id] = kl_tensor_new(o->dtype, &o->shape);
      owned[o->id] = true;
    }
    if ((rc = kl_ops[n->op].eval(n, in, out, err))) break;
    for (int k = 0; k < n->noutputs; k++)
      for (int64_t j = 0; j < out[k]->numel; j++)
        out[k]->data[j] = kl_dtype_round(out[k]->dtype, out[k]->data[j]);
    for (int k = 0; k < n->ninputs; k++) {
      int id = n->inputs[k]->id;
      if (last_use[id] == i && owned[id]) {
        kl_tensor_free(val[id]);
        val[id] = NULL;
        owned[id] = false;
      }
    }
  }
  if (!rc)
    for (int i = 0; i < g->outputs.len; i++)
      outputs[i] = tensor_copy(val[g->outputs.items[i]->id]);
done:
  for (int i = 0; i < nv; i++)
    if (owned[i]) kl_tensor_free(val[i]);
  free(val); free(order); free(live); free(last_use); free(owned);
  return rc;
}
