/* optable.c - the op table, built from ops.def. */
#include <string.h>

#include "op_impl.h"

const kl_op_info kl_ops[KL_OP_COUNT] = {
#define KL_OP(id, name, onnx, kind, min_in, max_in, nout, attrs)            \
  {name, onnx, kind, min_in, max_in, nout, kl_infer_##id, kl_eval_##id, attrs},
#include "ops.def"
#undef KL_OP
};

int kl_op_lookup(const char *name, kl_op *out) {
  for (int i = 0; i < KL_OP_COUNT; i++)
    if (strcmp(kl_ops[i].name, name) == 0) {
      *out = (kl_op)i;
      return 0;
    }
  return -1;
}
