/* emu_kernels_host.c - the host build of emu_kernels.cu: build systems take
 * a .cu file for CUDA, so the host C compiler gets it through this file. */
#include "emu_kernels.cu"
