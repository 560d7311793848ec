/* onnx_ops_sequence.c - ONNX sequence ops, unrolled while loading: a
 * sequence is a list of IR tensors whose length and positions are known at
 * compile time, so the IR itself only ever sees tensors. */
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"

enum { MAX_SEQ = 4096 };

/* A position input (optional, default `dflt`) in [0, slots); a negative
 * one counts from the back of the sequence (-1 is its last item, also for
 * an insertion, which has one slot more). */
static int position(kl_onnx_ctx *c, const Onnx__NodeProto *n, int k, int64_t dflt,
                    int64_t len, int64_t slots, int64_t *out) {
  int64_t p = dflt;
  if (kl_onnx_input(c, n, k)) {
    int64_t v[1];
    if (kl_onnx_const_ints(c, kl_onnx_input(c, n, k), "the position", v, 1) != 1)
      return kl_onnx_fail(c, "the position must be a single integer");
    p = v[0];
  }
  if (p < 0) p += len;
  if (p < 0 || p >= slots)
    return kl_onnx_fail(c, "position %lld is out of range for %lld slots", (long long)p,
                        (long long)slots);
  *out = p;
  return 0;
}

static int convert_empty(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_dtype dt = KL_F32;
  const Onnx__AttributeProto *a = kl_onnx_attr(n, "dtype");
  if (a && a->has_i && kl_onnx_dtype((int)a->i, &dt))
    return kl_onnx_unsupported(c, "sequence element type %lld", (long long)a->i);
  return kl_onnx_bind_seq(c, n, 0, NULL, 0, dt);
}

static int convert_construct(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  int nin = kl_onnx_ninputs(n);
  if (nin < 1 || nin > MAX_SEQ) return kl_onnx_fail(c, "takes 1 to %d tensors", MAX_SEQ);
  kl_value **items = malloc((size_t)nin * sizeof *items);
  if (!items) abort();
  int rc = 0;
  for (int k = 0; k < nin && !rc; k++)
    if (!(items[k] = kl_onnx_input(c, n, k))) rc = kl_onnx_fail(c, "input %d is not a tensor", k);
  if (!rc) rc = kl_onnx_bind_seq(c, n, 0, items, nin, items[0]->dtype);
  free(items);
  return rc;
}

static int convert_insert(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value **seq, *t = kl_onnx_input(c, n, 1);
  int len;
  kl_dtype dt;
  int64_t p;
  if (kl_onnx_input_seq(c, n, 0, &seq, &len, &dt)) return -1;
  if (!t) return kl_onnx_fail(c, "input 1 must be a tensor");
  if (len >= MAX_SEQ) return kl_onnx_fail(c, "sequence longer than %d", MAX_SEQ);
  if (position(c, n, 2, len, len, len + 1, &p)) return -1;
  kl_value **items = malloc((size_t)(len + 1) * sizeof *items);
  if (!items) abort();
  memcpy(items, seq, (size_t)p * sizeof *items);
  items[p] = t;
  memcpy(items + p + 1, seq + p, (size_t)(len - p) * sizeof *items);
  int rc = kl_onnx_bind_seq(c, n, 0, items, len + 1, dt);
  free(items);
  return rc;
}

static int convert_erase(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value **seq;
  int len;
  kl_dtype dt;
  int64_t p;
  if (kl_onnx_input_seq(c, n, 0, &seq, &len, &dt)) return -1;
  if (position(c, n, 1, len - 1, len, len, &p)) return -1;
  kl_value **items = malloc((size_t)len * sizeof *items);
  if (!items) abort();
  memcpy(items, seq, (size_t)p * sizeof *items);
  memcpy(items + p, seq + p + 1, (size_t)(len - p - 1) * sizeof *items);
  int rc = kl_onnx_bind_seq(c, n, 0, items, len - 1, dt);
  free(items);
  return rc;
}

/* An output that is exactly an existing value still needs a node of its
 * own (two names, one value would make the graph's outputs ambiguous). */
static kl_value *copy_of(kl_onnx_ctx *c, kl_value *v) {
  kl_value *zero = kl_onnx_scalar(c, v->dtype, 0);
  kl_value *ins[2] = {v, zero};
  return zero ? kl_onnx_emit(c, v->dtype == KL_BOOL ? KL_OP_NE : KL_OP_ADD, ins, 2, NULL, 0)
              : NULL;
}

static int convert_at(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value **seq;
  int len;
  kl_dtype dt;
  int64_t p;
  if (kl_onnx_input_seq(c, n, 0, &seq, &len, &dt)) return -1;
  if (!kl_onnx_input(c, n, 1)) return kl_onnx_fail(c, "the position is required");
  if (position(c, n, 1, 0, len, len, &p)) return -1;
  kl_value *y = copy_of(c, seq[p]);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_length(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value **seq;
  int len;
  kl_dtype dt;
  if (kl_onnx_input_seq(c, n, 0, &seq, &len, &dt)) return -1;
  kl_value *y = kl_onnx_scalar(c, KL_I64, len);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_concat_from(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value **seq;
  int len;
  kl_dtype dt;
  if (kl_onnx_input_seq(c, n, 0, &seq, &len, &dt)) return -1;
  if (len < 1) return kl_onnx_fail(c, "cannot concatenate an empty sequence");
  int64_t axis = kl_onnx_attr_int(n, "axis", 0);
  bool new_axis = kl_onnx_attr_int(n, "new_axis", 0) != 0;
  kl_value **items = malloc((size_t)len * sizeof *items);
  if (!items) abort();
  int rc = 0;
  for (int i = 0; i < len && !rc; i++) {
    items[i] = seq[i];
    if (new_axis) { /* stack: unsqueeze each item at axis first */
      int r = seq[i]->shape.rank + 1;
      int64_t ax = axis < 0 ? axis + r : axis;
      kl_attr a = kl_ais("axes", &ax, 1);
      if (!(items[i] = kl_onnx_emit(c, KL_OP_UNSQUEEZE, &seq[i], 1, &a, 1))) rc = -1;
    }
  }
  kl_value *y = NULL;
  if (!rc) {
    kl_attr a = kl_ai("axis", axis);
    y = len == 1 ? copy_of(c, items[0]) : kl_onnx_emit(c, KL_OP_CONCAT, items, len, &a, 1);
  }
  free(items);
  return y ? kl_onnx_bind(c, n, 0, y) : -1;
}

static int convert_split_to(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  kl_value *x = kl_onnx_input(c, n, 0);
  if (!x) return kl_onnx_fail(c, "input 0 is missing");
  int r = x->shape.rank;
  int64_t axis = kl_onnx_attr_int(n, "axis", 0);
  if (axis < -r || axis >= r) return kl_onnx_fail(c, "axis %lld is out of range", (long long)axis);
  if (axis < 0) axis += r;
  int64_t dim = x->shape.dims[axis], sizes[MAX_SEQ];
  int count = 0;
  bool keep = true;
  kl_value *split = kl_onnx_input(c, n, 1);
  if (split) {
    const kl_tensor *t = kl_onnx_const(c, split, "split");
    if (!t) return -1;
    if (t->shape.rank == 0) { /* one chunk size; the last chunk may be short */
      int64_t each = (int64_t)t->data[0];
      if (each <= 0) return kl_onnx_fail(c, "split size must be positive");
      for (int64_t done = 0; done < dim && count < MAX_SEQ; done += each)
        sizes[count++] = dim - done < each ? dim - done : each;
    } else {
      if (t->numel > MAX_SEQ) return kl_onnx_fail(c, "too many chunks");
      for (int64_t i = 0; i < t->numel; i++) sizes[count++] = (int64_t)t->data[i];
    }
  } else { /* chunks of one, squeezed unless keepdims = 0 says otherwise */
    if (dim > MAX_SEQ) return kl_onnx_fail(c, "too many chunks");
    for (int64_t i = 0; i < dim; i++) sizes[count++] = 1;
    keep = kl_onnx_attr_int(n, "keepdims", 1) != 0;
  }
  kl_value **items = malloc((size_t)(count + 1) * sizeof *items);
  if (!items) abort();
  int rc = 0;
  if (count == 1) {
    items[0] = copy_of(c, x);
    rc = items[0] ? 0 : -1;
  } else {
    kl_attr a[2] = {kl_ai("axis", axis), kl_ais("sizes", sizes, count)};
    kl_node *s = kl_onnx_emit_node(c, KL_OP_SPLIT, &x, 1, a, 2, count);
    if (!s) rc = -1;
    for (int i = 0; !rc && i < count; i++) items[i] = s->outputs[i];
  }
  for (int i = 0; !rc && !keep && i < count; i++) {
    kl_attr a = kl_ais("axes", &axis, 1);
    if (!(items[i] = kl_onnx_emit(c, KL_OP_SQUEEZE, &items[i], 1, &a, 1))) rc = -1;
  }
  if (!rc) rc = kl_onnx_bind_seq(c, n, 0, items, count, x->dtype);
  free(items);
  return rc;
}

const kl_onnx_op kl_onnx_ops_sequence[] = {
    {"SequenceEmpty", 11, convert_empty},
    {"SequenceConstruct", 11, convert_construct},
    {"SequenceInsert", 11, convert_insert},
    {"SequenceErase", 11, convert_erase},
    {"SequenceAt", 11, convert_at},
    {"SequenceLength", 11, convert_length},
    {"ConcatFromSequence", 11, convert_concat_from},
    {"SplitToSequence", 11, convert_split_to},
    {NULL, 0, NULL},
};
