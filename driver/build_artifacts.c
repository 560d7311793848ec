/* build_artifacts.c - the two things `kiln compile` builds for users: a
 * standalone program (--emit=exe) and a static library with its header and
 * a pkg-config file (--emit=lib).  Both hold the host kernels (the host
 * device) and, when NVRTC is at hand, the GPU images; both link libkilnrt
 * statically and load libcuda only at run time, so they start on a machine
 * without a GPU or a driver.  Neither links protobuf-c unless asked: .pb
 * tensor files are libkilnrt_pb's (--pb-inputs, kiln_NAME_pb.pc). */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "driver.h"

const char *kiln_lib_dir(void) {
  static char dir[4200];
  const char *d = getenv("KILN_LIB_DIR");
  if (d && *d) return d;
  const char *p = kiln_installed_prefix();
  if (!p) return KILN_LIB_DIR;
  snprintf(dir, sizeof dir, "%s/%s", p, KILN_INSTALL_LIBDIR);
  return dir;
}

static const char *lib_dir(void) { return kiln_lib_dir(); }

static int shell(const char *cmd, const char *dir, const char *what) {
  kiln_progress("host compiler: %s", what);
  int st = system(cmd);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    kiln_report_build_log(dir, what);
    return -1;
  }
  return 0;
}

/* --weights-file: weights.bin copied to gpu->weights_file, and the
 * defines that make model.c map it at create instead of assembling it in
 * (its name, CRC-32 and the folder it was written to); "" otherwise. */
static int weights_beside(const char *dir, const kiln_gpu_opts *gpu, char *defines, size_t n) {
  defines[0] = 0;
  if (!gpu->weights_file) return 0;
  const char *file = gpu->weights_file, *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
  char bin[4200], folder[4200], abs[4096];
  snprintf(bin, sizeof bin, "%s/weights.bin", dir);
  snprintf(folder, sizeof folder, "%.*s", base > file ? (int)(base - file - 1) : 1, base > file ? file : ".");
  if (!folder[0]) snprintf(folder, sizeof folder, "/");
  if (!*base || strpbrk(file, "\"'\n")) {
    fprintf(stderr, "kiln: error: --weights-file=%s: a file name without quotes, backslashes or "
                    "newlines\n", file);
    return -1;
  }
  if (!realpath(folder, abs)) {
    fprintf(stderr, "kiln: error: --weights-file=%s: %s: %s\n", file, folder, strerror(errno));
    return -1;
  }
  int fd = open(bin, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    fprintf(stderr, "kiln: error: %s: %s\n", bin, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  void *p = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (p == MAP_FAILED) {
    fprintf(stderr, "kiln: error: cannot map %s: %s\n", bin, strerror(errno));
    return -1;
  }
  uint32_t crc = krt_crc32(p, (size_t)st.st_size);
  if (p) munmap(p, (size_t)st.st_size);
  if (kiln_copy_file(bin, file)) return -1;
  char qbase[2200], qabs[4300];
  kiln_shell_quote(qbase, sizeof qbase, base);
  kiln_shell_quote(qabs, sizeof qabs, abs);
  snprintf(defines, n, "-DKILN_WEIGHTS_EXTERNAL='\"'%s'\"' -DKILN_WEIGHTS_CRC=0x%08xu "
                       "-DKILN_WEIGHTS_COMPILED_DIR='\"'%s'\"'", qbase, crc, qabs);
  fprintf(stderr, "kiln: the weights (%lld bytes) are in %s, which the program maps when it starts\n",
          (long long)st.st_size, file);
  return 0;
}

/* Sources and, when NVRTC is there, GPU images into dir; *gpu says which. */
static int write_all_sources(const kl_codegen_result *cg, const char *dir,
                             const kiln_gpu_opts *gpu, bool *images) {
  *images = false;
  if (kiln_write_sources(cg, dir, gpu->timing)) return -1;
  char why[300];
  if (!gpu->nvrtc || !cg->nkernels) return 0;
  if (!kl_nvrtc_available(why, sizeof why)) {
    fprintf(stderr, "kiln: %s: no GPU images built in (the host device still works)\n", why);
    return 0;
  }
  if (kiln_gpu_images(cg, dir, gpu->sm, gpu->nsm, gpu->werror, gpu->timing)) return -1;
  *images = true;
  return 0;
}

/* The flags every compile of generated code takes; -fno-math-errno keeps
 * the math functions free of errno, as on a GPU. */
static void common_flags(char *buf, size_t n, const char *qdir, bool images, const char *weights) {
  char qrt[4200];
  kiln_shell_quote(qrt, sizeof qrt, kiln_runtime_dir());
  snprintf(buf, n,
           "-std=gnu11 -O2 -fno-math-errno -fPIC -DKILN_HOST_KERNELS %s -I%s -I%s/emu "
           "-DKILN_WEIGHTS_FILE='\"'%s/weights.bin'\"' %s",
           images ? "-DKILN_GPU_IMAGES" : "", qrt, qrt, qdir, weights);
}

int kiln_build_exe(const kl_codegen_result *cg, const char *prefix, const char *dir,
                   const char *out, const kiln_gpu_opts *gpu, bool pb) {
  bool images;
  char weights[9000];
  if (write_all_sources(cg, dir, gpu, &images) || weights_beside(dir, gpu, weights, sizeof weights))
    return -1;
  char path[4200];
  snprintf(path, sizeof path, "%s/main.c", dir);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kiln: error: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  /* a data-parallel step's program joins its ranks through MPI */
  bool mpi = cg->data_parallel;
  fprintf(f, "/* main.c - generated by kiln: the command line of model '%s'. */\n"
             "#include \"%s\"\n%s%s\n"
             "int main(int argc, char **argv) { return krt_exe_main%s(kiln_model_%s(), argc, argv); }\n",
          prefix, cg->header, pb ? "#include \"pb/kilnrt_pb.h\"\n" : "", mpi ? "#include \"mpi/kilnrt_mpi.h\"\n" : "",
          mpi ? "_mpi" : pb ? "_pb" : "", prefix);
  if (fclose(f)) return -1;
  char qdir[4200], qout[4200], qlib[4200], flags[24000], cmd[131072];
  kiln_shell_quote(qdir, sizeof qdir, dir);
  kiln_shell_quote(qout, sizeof qout, out);
  kiln_shell_quote(qlib, sizeof qlib, lib_dir());
  common_flags(flags, sizeof flags, qdir, images, weights);
  snprintf(cmd, sizeof cmd,
           /* the static libraries by file name: an installed libdir holds
            * libkilnrt.so too, which -lkilnrt would take */
           "%s %s -x c %s/kernels.cu -x c %s/model.c %s%s %s/main.c -L%s %s %s -l:libkilnrt.a -l:libkiln_emu.a %s "
           "%s %s -o %s >%s/build.log 2>&1",
           kiln_c_compiler(), flags, qdir, qdir, images ? qdir : "", images ? "/gpu_images.c" : "", qdir,
           qlib, pb ? "-l:libkilnrt_pb.a" : "", mpi ? "-l:libkilnrt_mpi.a" : "", KILN_RT_LIBS, pb ? KILN_PB_LIBS : "",
           mpi ? KILN_MPI_LIBS : "", qout, qdir);
  return shell(cmd, dir, "building the program");
}

int kiln_build_lib(const kl_codegen_result *cg, const char *prefix, const char *dir,
                   const char *out_dir, const kiln_gpu_opts *gpu) {
  bool images;
  char weights[9000];
  if (write_all_sources(cg, dir, gpu, &images)) return -1;
  if ((mkdir(out_dir, 0777) && errno != EEXIST)) {
    fprintf(stderr, "kiln: error: cannot create folder %s: %s\n", out_dir, strerror(errno));
    return -1;
  }
  char abs_out[4096];
  if (!realpath(out_dir, abs_out)) {
    fprintf(stderr, "kiln: error: %s: %s\n", out_dir, strerror(errno));
    return -1;
  }
  char qdir[4200], qout[4200], flags[24000], cmd[131072];
  kiln_shell_quote(qdir, sizeof qdir, dir);
  kiln_shell_quote(qout, sizeof qout, abs_out);
  if (weights_beside(dir, gpu, weights, sizeof weights)) return -1;
  common_flags(flags, sizeof flags, qdir, images, weights);
  /* Everything but kiln_model_<prefix> is hidden, then made local in one
   * relocatable object, so that several compiled models (each with its k0,
   * k1, ... kernels) link into one program. */
  char gpu_step[9000] = "true", qrt[4200];
  kiln_shell_quote(qrt, sizeof qrt, kiln_runtime_dir());
  if (images)
    snprintf(gpu_step, sizeof gpu_step,
             "%s -fPIC -fvisibility=hidden -I%s -I%s/emu -c gpu_images.c -o gpu_images.o "
             ">>build.log 2>&1", kiln_c_compiler(), qrt, qrt);
  snprintf(cmd, sizeof cmd,
           "cd %s && %s %s -fvisibility=hidden -DKILN_NO_GENERIC_ENTRY -c -x c kernels.cu -o kernels.o "
           ">build.log 2>&1 && %s %s -fvisibility=hidden -DKILN_NO_GENERIC_ENTRY -c model.c -o model.o "
           ">>build.log 2>&1 && %s && ld -r -o all.o kernels.o model.o %s >>build.log 2>&1 && "
           "objcopy --localize-hidden all.o >>build.log 2>&1 && rm -f %s/libkiln_%s.a && "
           "ar rcs %s/libkiln_%s.a all.o >>build.log 2>&1",
           qdir, kiln_c_compiler(), flags, kiln_c_compiler(), flags, gpu_step, images ? "gpu_images.o" : "",
           qout, prefix, qout, prefix);
  if (shell(cmd, dir, "building the library")) return -1;
  /* The headers and the runtime beside it: the folder is all a user needs.
   * kilnrt.h stands alone; pb/ holds the optional .pb reader. */
  char from[4200], to[4200];
  snprintf(to, sizeof to, "%s/pb", abs_out);
  if (mkdir(to, 0777) && errno != EEXIST) {
    fprintf(stderr, "kiln: error: cannot create folder %s: %s\n", to, strerror(errno));
    return -1;
  }
  /* where each comes from: the generated sources (""), the runtime's
   * sources ("rt"), kiln's build folder (NULL) */
  const char *const copies[][2] = {{"", cg->header},
                                          {"rt", "kilnrt.h"},
                                          {"rt", "pb/kilnrt_pb.h"},
                                          {NULL, "libkilnrt.a"},
                                          {NULL, "libkiln_emu.a"},
                                          {NULL, "libkilnrt_pb.a"}};
  for (size_t i = 0; i < sizeof copies / sizeof *copies; i++) {
    const char *src_dir = !copies[i][0] ? lib_dir() : *copies[i][0] ? kiln_runtime_dir() : dir;
    snprintf(from, sizeof from, "%s/%s", src_dir, copies[i][1]);
    snprintf(to, sizeof to, "%s/%s", abs_out, copies[i][1]);
    if (kiln_copy_file(from, to)) return -1;
  }
  snprintf(to, sizeof to, "%s/kiln_%s.pc", abs_out, prefix);
  FILE *pc = fopen(to, "w");
  if (!pc) {
    fprintf(stderr, "kiln: error: cannot write %s: %s\n", to, strerror(errno));
    return -1;
  }
  /* ${pcfiledir}: the folder may move (pkg-config fills in where it lies) */
  fprintf(pc, "prefix=${pcfiledir}\n\nName: kiln_%s\nDescription: the model '%s', compiled by kiln\n"
              "Version: %s\nCflags: -I${prefix}\n"
              "Libs: -L${prefix} -lkiln_%s -lkilnrt -lkiln_emu %s\n",
          prefix, prefix, KILN_VERSION, prefix, KILN_RT_LIBS);
  if (fclose(pc)) return -1;
  /* For a program that reads .pb files: pkg-config puts these Libs before
   * the required package's, as libkilnrt_pb needs libkilnrt after it. */
  snprintf(to, sizeof to, "%s/kiln_%s_pb.pc", abs_out, prefix);
  if (!(pc = fopen(to, "w"))) {
    fprintf(stderr, "kiln: error: cannot write %s: %s\n", to, strerror(errno));
    return -1;
  }
  fprintf(pc, "prefix=${pcfiledir}\n\nName: kiln_%s_pb\nDescription: the model '%s' and the ONNX .pb "
              "tensor reader (pb/kilnrt_pb.h)\nVersion: %s\nRequires: kiln_%s = %s\n"
              "Cflags: -I${prefix}/pb\nLibs: -L${prefix} -lkilnrt_pb %s\n",
          prefix, prefix, KILN_VERSION, prefix, KILN_VERSION, KILN_PB_LIBS);
  return fclose(pc) ? -1 : 0;
}
