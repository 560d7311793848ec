/* mma_kernels.cu - kiln_prelude.h's warp matrix multiply-add (kl_mma_*) in
 * a kernel as the code generator writes them: operands staged in shared
 * memory, two k steps of 16 from tiles wider than one step (ld 40), C
 * written back through kl_mma_row / kl_mma_col.  test_mma.c runs it on the
 * host with one lane a warp and with a GPU's 32 (whose product gathers the
 * PTX register layout by shuffles); nvrtc_check compiles it for sm_90 (the
 * mma instruction) and sm_75 (the shuffles). */
#include "kiln_prelude.h"

#define MMA_LD 40
#define MMA_KERNEL(S, T)                                                                      \
  KL_KERNEL void mma_##S(const T *__restrict__ a, const T *__restrict__ b,                    \
                         const float *__restrict__ c0, float *__restrict__ c) {               \
    KL_SHARED(kl_mma_stage, as, [16 * MMA_LD]);                                               \
    KL_SHARED(kl_mma_stage, bs, [8 * MMA_LD]);                                                \
    const int lane = (int)(threadIdx.x & 31);                                                 \
    if (lane >= KL_LANES) return;                                                             \
    for (int t = lane; t < 16 * MMA_LD; t += KL_LANES) as[t] = kl_mma_stage_##S(a[t]);        \
    for (int t = lane; t < 8 * MMA_LD; t += KL_LANES) bs[t] = kl_mma_stage_##S(b[t]);         \
    __syncwarp(0xffffffffu);                                                                  \
    kl_mma_c acc;                                                                             \
    for (int i = 0; i < KL_MMA_C; i++) acc.c[i] = c0[kl_mma_row(lane, i) * 8 + kl_mma_col(lane, i)]; \
    for (int k0 = 0; k0 < 32; k0 += 16) {                                                     \
      kl_mma_a fa;                                                                            \
      kl_mma_b fb;                                                                            \
      kl_mma_load_a_##S(&fa, as + k0, MMA_LD, lane);                                          \
      kl_mma_load_b_##S(&fb, bs + k0, MMA_LD, lane);                                          \
      kl_mma_##S(&acc, &fa, &fb);                                                             \
    }                                                                                         \
    for (int i = 0; i < KL_MMA_C; i++) c[kl_mma_row(lane, i) * 8 + kl_mma_col(lane, i)] = acc.c[i]; \
  }                                                                                           \
  KL_EMU_ENTRY(mma_##S, KL_ARG(const T *, 0), KL_ARG(const T *, 1), KL_ARG(const float *, 2),  \
               KL_ARG(float *, 3));

MMA_KERNEL(f16, __half)
MMA_KERNEL(bf16, __nv_bfloat16)
