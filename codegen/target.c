/* target.c - what the kernels of this code generator can do, as the
 * passes see it: the fusion pass, the GEMM pass and the memory plan read
 * these numbers instead of asking the templates. */
#include "codegen_impl.h"

const kl_target kl_cg_target = {
    /* bounds a kernel's size (and NVRTC's time on it) */
    .max_group_nodes = 16,
    .max_kernel_args = KL_MAX_GROUP_IO,
    /* The longest dot product (input channels per group x window) a direct
     * convolution takes; longer ones go to im2col + cuBLAS, whose tiled
     * GEMM reuses each loaded value many times where the direct kernel
     * relies on the caches.  A guess, not yet a measurement: no GPU has
     * run it. */
    .direct_conv_max_k = 1152,
    /* The longest dot product a GEMM computed inside an elementwise kernel
     * takes.  A guess from the roofline, not a measurement: a thread per
     * output reads a row of A (the same address across a warp) and a
     * column of B (adjacent across it), about half the FP32 peak; cuBLAS's
     * tiles do better, and once K passes ~128 the GEMM's time outweighs
     * the store and load of the result that fusing saves. */
    .direct_matmul_max_k = 128,
    /* two blocks for each of an H100's or H200's 132 multiprocessors: with
     * fewer tiles, one output a thread spreads wider (an H200 ran the
     * small cnn example 3x faster that way) */
    .tile_min_blocks = 264,
    /* kiln_prelude.h's kl_mma_*: the mma instruction from sm_80, shuffles
     * before it, plain loops on the host device */
    .tensor_cores = 1,
    /* no bound on size but the cut-off table's */
    .direct_conv_max_macs = INT64_MAX,
    .direct_matmul_max_macs = INT64_MAX,
    .direct_conv_min_outputs_per_k = 0,
    /* a warp an output below 8 outputs per unit of K, a guess: an H200
     * ran ResNet-18's deep layers (16K down to 2K outputs, K 576 to 4608,
     * 28 down to 0.4 outputs per unit of K) latency-bound at one output a
     * thread, but no GPU has run the split kernel yet; below 16, se_net's
     * convolutions before a global pool would leave the pool's kernel
     * (17 -> 19 launches) for no measured gain */
    .direct_conv_split_below = 8,
    /* emit_attention.c: the tiled kernel takes any number of keys (the
     * cut-off table may lower this); the warp-per-row kernel, for post-
     * softmax chains that are not only casts, holds 32 scores a lane and
     * the probabilities in shared memory; wider heads make the two
     * products the work, where cuBLAS's tiling pays more than the traffic
     * saved */
    .attention_max_keys = INT64_MAX,
    .attention_mma_max_keys = INT64_MAX,
    .attention_row_max_keys = 1024,
    .attention_max_head = 256,
    .attention_max_chain = KL_MAX_CHAIN,
    /* cuBLASLt's epilogues (and the host BLAS wrapper's) */
    .gemm_bias = true,
    .gemm_residual = true,
    .gemm_relu = true,
    .scalar = kl_cg_is_elementwise,
    .scratch = kl_cg_node_scratch,
};

int kl_cg_node_scratch(const kl_node *n, size_t *bytes, int max) {
  const kl_cg_template *t = kl_cg_find_template(n);
  size_t own[KL_CG_MAX_SCRATCH];
  int count = t && t->scratch ? t->scratch(n, own) : 0;
  for (int i = 0; i < count && i < max; i++) bytes[i] = own[i];
  return count < max ? count : max;
}
