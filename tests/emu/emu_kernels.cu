/* emu_kernels.cu - test kernels for the host device, written the way the code
 * generator writes kernels.cu: CUDA C through kiln_prelude.h, one
 * KL_EMU_ENTRY after each kernel.  The same file must compile
 *   - with NVRTC for sm_90 without warnings (nvrtc_check), and
 *   - with the host C compiler against kiln_emu.h (emu_kernels_host.c),
 * and the host build must match the plain C references in test_emu.c. */
#include "kiln_prelude.h"

/* ---- 1. vector add, grid-stride loop: no barriers, runs as a plain loop */
KL_KERNEL void vec_add(const float *__restrict__ a, const float *__restrict__ b,
                       float *__restrict__ c, int n) {
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += (int)(blockDim.x * gridDim.x))
    c[i] = a[i] + b[i];
}
KL_EMU_ENTRY(vec_add, KL_ARG(const float *, 0), KL_ARG(const float *, 1),
             KL_ARG(float *, 2), KL_ARG(int, 3));

/* ---- 2. block sum: shared-memory tree with __syncthreads (256 threads) */
KL_KERNEL void block_sum(const float *__restrict__ x, float *__restrict__ out, int n) {
  KL_SHARED(float, buf, [256]);
  unsigned t = threadIdx.x;
  int i = (int)(blockIdx.x * blockDim.x + t);
  buf[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}
KL_EMU_ENTRY(block_sum, KL_ARG(const float *, 0), KL_ARG(float *, 1), KL_ARG(int, 2));

/* ---- 3. warp-shuffle sum: lanes reduce with __shfl_down_sync, warp sums
 * meet in shared memory, the first warp reduces them, one atomicAdd per
 * block.  A shared helper with its own KL_SHARED is called once per block. */
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

__device__ float block_sum_shfl(float v) {
  KL_SHARED(float, partial, [32]);
  unsigned lane = threadIdx.x % 32, wid = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[wid] = v;
  __syncthreads();
  unsigned nwarps = (blockDim.x + 31) / 32;
  v = threadIdx.x < nwarps ? partial[lane] : 0.0f;
  if (wid == 0) v = warp_sum(v);
  return v;
}

KL_KERNEL void shfl_sum(const float *__restrict__ x, float *__restrict__ total, int n) {
  float v = 0.0f;
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += (int)(blockDim.x * gridDim.x))
    v += x[i];
  v = block_sum_shfl(v);
  if (threadIdx.x == 0) atomicAdd(total, v);
}
KL_EMU_ENTRY(shfl_sum, KL_ARG(const float *, 0), KL_ARG(float *, 1), KL_ARG(int, 2));

/* ---- 4. transpose through a 32x33 tile, 2-D blocks of 32x8 */
KL_KERNEL void transpose(const float *__restrict__ in, float *__restrict__ out,
                         int rows, int cols) {
  KL_SHARED(float, tile, [32][33]);
  int bx = (int)(blockIdx.x * 32), by = (int)(blockIdx.y * 32);
  int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  for (int j = ty; j < 32; j += (int)blockDim.y)
    if (by + j < rows && bx + tx < cols) tile[j][tx] = in[(by + j) * cols + bx + tx];
  __syncthreads();
  for (int j = ty; j < 32; j += (int)blockDim.y)
    if (bx + j < cols && by + tx < rows) out[(bx + j) * rows + by + tx] = tile[tx][j];
}
KL_EMU_ENTRY(transpose, KL_ARG(const float *, 0), KL_ARG(float *, 1), KL_ARG(int, 2),
             KL_ARG(int, 3));

/* ---- 5. softmax, one block per row: shared max, then shared sum */
__device__ float block_reduce(float v, int is_max) {
  KL_SHARED(float, red, [32]);
  unsigned lane = threadIdx.x % 32, wid = threadIdx.x / 32;
  for (int off = 16; off > 0; off >>= 1) {
    float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  if (lane == 0) red[wid] = v;
  __syncthreads();
  unsigned nwarps = (blockDim.x + 31) / 32;
  v = lane < nwarps ? red[lane] : (is_max ? -KL_INF : 0.0f);
  for (int off = 16; off > 0; off >>= 1) {
    float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads(); /* red is reused by the next call */
  return v;
}

KL_KERNEL void softmax_rows(const float *__restrict__ x, float *__restrict__ y, int cols) {
  const float *row = x + (size_t)blockIdx.x * (size_t)cols;
  float *yrow = y + (size_t)blockIdx.x * (size_t)cols;
  float m = -KL_INF;
  for (int j = (int)threadIdx.x; j < cols; j += (int)blockDim.x) m = fmaxf(m, row[j]);
  m = block_reduce(m, 1);
  float s = 0.0f;
  for (int j = (int)threadIdx.x; j < cols; j += (int)blockDim.x) s += expf(row[j] - m);
  s = block_reduce(s, 0);
  for (int j = (int)threadIdx.x; j < cols; j += (int)blockDim.x) yrow[j] = expf(row[j] - m) / s;
}
KL_EMU_ENTRY(softmax_rows, KL_ARG(const float *, 0), KL_ARG(float *, 1), KL_ARG(int, 2));

/* ---- 6. fp16 / bf16 round trips */
KL_KERNEL void half_roundtrip(const float *__restrict__ x, __half *__restrict__ h,
                              __nv_bfloat16 *__restrict__ b, float *__restrict__ hf,
                              float *__restrict__ bf, int n) {
  int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  h[i] = __float2half(x[i]);
  b[i] = __float2bfloat16(x[i]);
  hf[i] = __half2float(h[i]);
  bf[i] = __bfloat162float(b[i]);
}
KL_EMU_ENTRY(half_roundtrip, KL_ARG(const float *, 0), KL_ARG(__half *, 1),
             KL_ARG(__nv_bfloat16 *, 2), KL_ARG(float *, 3), KL_ARG(float *, 4),
             KL_ARG(int, 5));

/* ---- 7. 3-D grid of 3-D blocks: every thread writes its global linear id;
 * atomicMax keeps the largest, atomicAdd counts threads */
KL_KERNEL void grid3d(int *__restrict__ out, int *__restrict__ maxid, int *__restrict__ count) {
  unsigned gx = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned gy = blockIdx.y * blockDim.y + threadIdx.y;
  unsigned gz = blockIdx.z * blockDim.z + threadIdx.z;
  unsigned nx = gridDim.x * blockDim.x, ny = gridDim.y * blockDim.y;
  int id = (int)((gz * ny + gy) * nx + gx);
  out[id] = id;
  atomicMax(maxid, id);
  atomicAdd(count, 1);
}
KL_EMU_ENTRY(grid3d, KL_ARG(int *, 0), KL_ARG(int *, 1), KL_ARG(int *, 2));

/* ---- 8. warp corners: inclusive scan with __shfl_up_sync, width-8
 * segments with __shfl_sync/__shfl_down_sync, ballot, any/all,
 * __syncthreads_count/_or; whole warps only (a shuffle that names a lane
 * which does not exist is undefined on a GPU) */
KL_KERNEL void warp_ops(const int *__restrict__ x, int *__restrict__ out) {
  unsigned t = threadIdx.x, lane = t % 32;
  int v = x[t];
  int scan = v;
  for (int d = 1; d < 32; d <<= 1) {
    int o = __shfl_up_sync(0xffffffffu, scan, d);
    if ((int)lane >= d) scan += o;
  }
  int seg_first = __shfl_sync(0xffffffffu, v, 0, 8);
  int seg_down = __shfl_down_sync(0xffffffffu, v, 3, 8);
  int bfly = __shfl_xor_sync(0xffffffffu, v, 5, 16);
  unsigned ballot = __ballot_sync(0xffffffffu, v % 3 == 0);
  int any = __any_sync(0xffffffffu, v > 70);
  int all = __all_sync(0xffffffffu, v >= 0);
  int cnt = __syncthreads_count(v % 2 == 0);
  int orr = __syncthreads_or(v == 42);
  int *o = out + t * 8;
  o[0] = scan;
  o[1] = seg_first;
  o[2] = seg_down;
  o[3] = bfly;
  o[4] = (int)ballot;
  o[5] = any;
  o[6] = all;
  o[7] = cnt * 2 + orr;
}
KL_EMU_ENTRY(warp_ops, KL_ARG(const int *, 0), KL_ARG(int *, 1));

/* ---- 9. dynamic shared memory, and threads that exit before a barrier
 * (they count as arrived, as on sm_70+): reverse the live part of a block */
KL_KERNEL void reverse_tail(const float *__restrict__ x, float *__restrict__ y, int skip) {
  KL_DYN_SHARED(float, s);
  int t = (int)threadIdx.x, n = (int)blockDim.x;
  if (t < skip) return;
  s[t] = x[blockIdx.x * blockDim.x + (unsigned)t];
  __syncthreads();
  y[blockIdx.x * blockDim.x + (unsigned)t] = s[n - 1 - t + skip];
}
KL_EMU_ENTRY(reverse_tail, KL_ARG(const float *, 0), KL_ARG(float *, 1), KL_ARG(int, 2));

/* ---- 10. a divergent barrier: in every warp the low half waits at
 * __syncthreads while the high half waits in a full-warp shuffle; this
 * cannot finish (on a GPU it is undefined) and must be reported */
KL_KERNEL void divergent(float *__restrict__ y) {
  float v = (float)threadIdx.x;
  if (threadIdx.x % 32 < 16)
    __syncthreads();
  else
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  y[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
KL_EMU_ENTRY(divergent, KL_ARG(float *, 0));

/* ---- 11. nothing at all, to time launches; and a barrier-only kernel, to
 * time fiber switches */
KL_KERNEL void empty(void) {}
KL_EMU_ENTRY0(empty);

KL_KERNEL void barriers(int rounds) {
  for (int r = 0; r < rounds; r++) __syncthreads();
}
KL_EMU_ENTRY(barriers, KL_ARG(int, 0));
