/* device_kernels.cu - kernels for test_device.c, written like a generated
 * kernels.cu (kiln_prelude.h, one KL_EMU_ENTRY per kernel) so that the same
 * file can be built for the GPU (NVRTC or nvcc -cubin) when a GPU run of the
 * device tests is wanted.  The host build is device_kernels_host.c. */
#include "kiln_prelude.h"

/* y = a * x + y, grid-stride loop: the plain-loop path of the emulator. */
KL_KERNEL void axpy(float a, const float *__restrict__ x, float *__restrict__ y, int n) {
  for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += (int)(blockDim.x * gridDim.x))
    y[i] = a * x[i] + y[i];
}
KL_EMU_ENTRY(axpy, KL_ARG(float, 0), KL_ARG(const float *, 1), KL_ARG(float *, 2),
             KL_ARG(int, 3));

/* Reverse each block's slice through dynamic shared memory: checks that the
 * launch's dyn_shared reaches the kernel and that barriers work. */
KL_KERNEL void block_reverse(const float *__restrict__ x, float *__restrict__ y) {
  KL_DYN_SHARED(float, s);
  unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * blockDim.x;
  s[t] = x[base + t];
  __syncthreads();
  y[base + t] = s[n - 1 - t];
}
KL_EMU_ENTRY(block_reverse, KL_ARG(const float *, 0), KL_ARG(float *, 1));
