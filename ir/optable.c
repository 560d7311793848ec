/* optable.c - the op table, built from ops.def. */
#include <string.h>

#include "op_impl.h"

const char kl_op_cuda_custom[] = "<custom>";

/* The row's last two columns: ALLOW/DENY/FOLLOW/KEEP name a
 * kl_precision_class; NONE and CUSTOM are the `cuda` column's words. */
#define NONE NULL
#define CUSTOM kl_op_cuda_custom
const kl_op_info kl_ops[KL_OP_COUNT] = {
#define KL_OP(id, name, onnx, kind, min_in, max_in, nout, attrs, prec, cuda) \
  {name, onnx, kind, min_in, max_in, nout, kl_infer_##id, kl_eval_##id, attrs,     \
   KL_PREC_##prec, cuda},
#include "ops.def"
#undef KL_OP
};
#undef NONE
#undef CUSTOM

int kl_op_lookup(const char *name, kl_op *out) {
  for (int i = 0; i < KL_OP_COUNT; i++)
    if (strcmp(kl_ops[i].name, name) == 0) {
      *out = (kl_op)i;
      return 0;
    }
  return -1;
}

int kl_op_lookup_onnx(const char *onnx_type, kl_op *out) {
  for (int i = 0; i < KL_OP_COUNT; i++)
    if (kl_ops[i].onnx && strcmp(kl_ops[i].onnx, onnx_type) == 0) {
      *out = (kl_op)i;
      return 0;
    }
  return -1;
}
