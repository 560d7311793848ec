/* device_kernels_host.c - the host build of device_kernels.cu (build systems
 * hand .cu files to a CUDA compiler, so the C compiler gets it through this
 * file). */
#include "device_kernels.cu"
