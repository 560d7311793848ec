/* cmd_compile.c - `kiln compile`: the IR as text, the generated sources,
 * a standalone program or a static library. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

static const char compile_help[] =
    "usage: kiln compile MODEL --emit=ir|cu|exe|lib [-o OUT] [options]\n"
    "Compile MODEL (.kl or .onnx).\n"
    "  --emit=ir             print the verified IR as text (.kl syntax) that parses\n"
    "                        back; constants too large to print go to\n"
    "                        OUT.safetensors beside -o OUT.kl (required then)\n"
    "  --emit=cu             write kernels.cu, model.c and NAME.h into folder OUT,\n"
    "                        and gpu_images.c with NVRTC's cubins and PTX\n"
    "  --emit=exe            build the standalone program OUT (run OUT --help); it\n"
    "                        reads .npy inputs\n"
    "  --pb-inputs           with --emit=exe: read ONNX .pb inputs too (links\n"
    "                        libkilnrt_pb and protobuf-c)\n"
    "  --emit=lib            build folder OUT: libkiln_NAME.a, NAME.h, the runtime's\n"
    "                        static libraries and kiln_NAME.pc for pkg-config\n"
    "                        (kiln_NAME_pb.pc adds krt_pb_read, pb/kilnrt_pb.h)\n"
    "  --arch LIST           GPU architectures, PTX for the last (default: the GPU\n"
    "                        here when there is one, else sm_80,sm_90,sm_100)\n"
    "  --no-nvrtc            skip the GPU images (host device only)\n"
    "  --Werror              NVRTC warnings are errors\n"
    "  --time                print the time of each phase on stderr, the rate at\n"
    "                        which weights.bin was written, and the peak memory\n"
    "  --mem-limit=SIZE      fail when the planned arena of intermediates exceeds SIZE\n"
    "                        bytes (K, M, G: KiB, MiB, GiB); a training step\n"
    "                        (--train) recomputes forward values in the backward\n"
    "                        pass first, until it fits (one line each on stderr)\n"
    "  --no-fuse             one kernel per node (the same pipeline, singleton groups)\n"
    "  --dump-after=PASS     print what a pass did, on standard output: train,\n"
    "                        bnfold, precision, remat, schedule, fold, fuse,\n"
    "                        memory, or all (in that order)\n"
    "  -o, --output OUT      the file (ir; default: standard output) or folder (cu)\n"
    "  --weights-file=WHERE  exe, lib: embed (the weights inside the program or\n"
    "                        library), FILE (in FILE, which the program maps when\n"
    "                        it starts: looked for in $KILN_WEIGHTS_DIR, beside\n"
    "                        the program, then where it was written; its size and\n"
    "                        CRC-32 are checked), or auto (the default: beside OUT\n"
    "                        as OUT.weights, or OUT/libkiln_NAME.weights, above\n"
    "                        64 MiB of weights; embedded below)\n"
    "  --name NAME           the compiled model's C name (a C identifier; default:\n"
    "                        the model's own): NAME.h, kiln_model_NAME(),\n"
    "                        libkiln_NAME.a, kiln_NAME.pc\n"
    "  -MD                   also write a make/ninja depfile: the outputs depend on\n"
    "                        the model, its external data and weights files\n"
    "  -MF FILE              the depfile's name (default: OUT.d)\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n";

enum { OPT_EMIT = 2100, OPT_ARCH, OPT_NO_NVRTC, OPT_WERROR, OPT_TIME, OPT_MEM_LIMIT, OPT_NO_FUSE,
       OPT_DUMP_AFTER, OPT_PB_INPUTS, OPT_NAME, OPT_WEIGHTS_FILE };

/* --weights-file=auto: above this, the weights go beside the artifact */
#define WEIGHTS_AUTO_BYTES ((size_t)64 << 20)

static size_t mem_limit; /* --mem-limit, for every kl_codegen below; 0: none */
static bool no_fuse;     /* --no-fuse */
static const char *dump_after; /* --dump-after */
static bool pb_inputs;   /* --pb-inputs */
static const char *c_name; /* --name; NULL: the model's */
static const char *weights_where; /* --weights-file: auto, embed or FILE */

/* A make rule's word: spaces, '#' and '$' escaped as make and ninja read
 * them. */
static void dep_word(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == ' ' || *s == '#' || *s == '\\') fputc('\\', f);
    if (*s == '$') fputc('$', f);
    fputc(*s, f);
  }
}

/* -MD: "OUTPUTS: MODEL FILES..." - the model and every file its weights
 * were mapped from (an ONNX model's external data, load() and --weights
 * safetensors), so that a build system rebuilds when any changes. */
static int write_depfile(const char *path, const char *const *outs, int nouts, const char *model,
                         const kl_graph *g) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kiln compile: error: -MF %s: %s\n", path, strerror(errno));
    return -1;
  }
  for (int i = 0; i < nouts; i++) {
    if (i) fputc(' ', f);
    dep_word(f, outs[i]);
  }
  fputs(":", f);
  fputs(" ", f);
  dep_word(f, model);
  for (int i = 0; i < g->maps.len; i++) {
    if (!strcmp(g->maps.items[i].path, model)) continue;
    fputs(" \\\n  ", f);
    dep_word(f, g->maps.items[i].path);
  }
  fputs("\n", f);
  return fclose(f) ? -1 : 0;
}

/* OUT.kl -> OUT.safetensors (OUT.ir -> OUT.ir.safetensors): the constants
 * too large to print, beside the text that loads them. */
static void weights_path(const char *out, char *buf, size_t n) {
  size_t len = strlen(out);
  bool kl = len > 3 && !strcmp(out + len - 3, ".kl");
  snprintf(buf, n, "%.*s.safetensors", (int)(kl ? len - 3 : len), out);
}

/* The constants kl_print_graph cannot print into a .safetensors file,
 * stored as they are (the bytes are not copied). */
static int write_large_constants(const kl_graph *g, const char *path) {
  krt_tensor_set set = {calloc((size_t)g->params.len + 1, sizeof *set.items), 0};
  if (!set.items) abort();
  for (int i = 0; i < g->params.len; i++) {
    const kl_value *v = g->params.items[i];
    if (kl_print_inlines(v) || !v->data) continue;
    krt_named_tensor *t = &set.items[set.count++];
    t->name = (char *)v->name;
    t->tensor = (krt_tensor){.dtype = (krt_dtype)v->dtype, .rank = v->shape.rank,
                             .data = v->data};
    for (int d = 0; d < v->shape.rank; d++) t->tensor.dims[d] = v->shape.dims[d];
  }
  char msg[600];
  int rc = set.count && krt_safetensors_write(path, &set, msg, sizeof msg) ? -1 : 0;
  if (rc) fprintf(stderr, "kiln: error: %s\n", msg);
  free(set.items);
  return rc;
}

/* --emit=ir: text that parses back to the same graph.  Constants too large
 * to print go to OUT.safetensors, which the text load()s (a path relative
 * to its folder), so `kiln run OUT.kl` needs no flags; on standard output
 * there is no folder for them, and -o is required. */
/* -o's folder must exist and take files before any work is done (a
 * detector's compile is seconds; failing at its last link is not kind).
 * The folder of a program or an IR file, or the parent of an output
 * folder, which is made. */
static int output_unwritable(const char *emit, const char *out_path) {
  char dir[4096];
  bool folder = !strcmp(emit, "cu") || !strcmp(emit, "lib");
  snprintf(dir, sizeof dir, "%s", out_path);
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') dir[--n] = 0; /* "out/" names the folder out */
  struct stat st;
  if (folder && stat(dir, &st) == 0) {
    if (S_ISDIR(st.st_mode) && access(dir, W_OK | X_OK) == 0) return 0;
    fprintf(stderr, "kiln compile: error: -o %s: %s\n", out_path,
            S_ISDIR(st.st_mode) ? strerror(errno) : "exists and is not a folder");
    return -1;
  }
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK) != 0) {
    fprintf(stderr, "kiln compile: error: -o %s: the folder %s %s\n", out_path, dir,
            stat(dir, &st) != 0 ? "does not exist" : !S_ISDIR(st.st_mode) ? "is not a folder"
                                                                            : "is not writable");
    return -1;
  }
  return 0;
}

static int emit_ir(const kl_graph *g, const char *out_path) {
  int64_t nlarge = 0, bytes = 0;
  for (int i = 0; i < g->params.len; i++)
    if (!kl_print_inlines(g->params.items[i]) && g->params.items[i]->data) {
      nlarge++;
      bytes += kl_shape_numel(&g->params.items[i]->shape) *
               (int64_t)kl_dtype_size(g->params.items[i]->dtype);
    }
  char weights[4096];
  const char *ref = NULL;
  if (nlarge && !out_path) {
    fprintf(stderr, "kiln compile: --emit=ir: %lld constants (%lld bytes) are too large to print; "
                    "give -o FILE.kl, and they go to FILE.safetensors beside it\n",
            (long long)nlarge, (long long)bytes);
    return KILN_EXIT_USAGE;
  }
  if (out_path) { /* (small weights load()ed from elsewhere are printed) */
    weights_path(out_path, weights, sizeof weights);
    if (nlarge && write_large_constants(g, weights)) return KILN_EXIT_ERROR;
    ref = strrchr(weights, '/') ? strrchr(weights, '/') + 1 : weights;
  }
  FILE *f = out_path ? fopen(out_path, "w") : stdout;
  if (!f) {
    perror(out_path);
    return KILN_EXIT_ERROR;
  }
  kl_print_graph_weights(f, g, ref);
  int rc = (ferror(f) | (out_path ? fclose(f) : fflush(f))) ? KILN_EXIT_ERROR : KILN_EXIT_OK;
  if (rc) fprintf(stderr, "kiln: error: writing %s failed\n", out_path ? out_path : "stdout");
  else if (nlarge)
    fprintf(stderr, "kiln: wrote %s, and %lld constants (%lld bytes) to %s\n", out_path,
            (long long)nlarge, (long long)bytes, weights);
  return rc;
}

static int parse_archs(const char *list, int *sm, int cap) {
  int n = 0;
  for (const char *p = list; *p;) {
    int v;
    if (sscanf(p, "sm_%d", &v) != 1 || v < 50 || v > 200 || n == cap) return -1;
    sm[n++] = v;
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  return n;
}

/* Peak resident memory of this process image in KiB: VmHWM, since
 * getrusage's ru_maxrss keeps the high-water mark of whatever ran before
 * execve (a parent's pages, when it forked us); that where /proc is not. */
static long peak_rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  struct rusage self;
  if (kib < 0 && !getrusage(RUSAGE_SELF, &self)) kib = self.ru_maxrss;
  return kib;
}

/* --time: the peak memory of kiln itself, which should stay far below the
 * weights' size (they are streamed, not held), and of the largest host
 * compiler process it ran. */
static void print_max_rss(void) {
  struct rusage children;
  fprintf(stderr, "kiln: time: max RSS %.1f MiB", peak_rss_kib() / 1024.0);
  if (!getrusage(RUSAGE_CHILDREN, &children) && children.ru_maxrss)
    fprintf(stderr, " (host compiler %.1f MiB)", children.ru_maxrss / 1024.0);
  fprintf(stderr, "\n");
}

/* exe or lib: generated code built in a scratch folder (kept when
 * KILN_KEEP_BUILD is set). */
static int build_artifact(const kl_graph *g, const char *emit, const char *out,
                          const kiln_gpu_opts *gpu) {
  kl_codegen_result cg;
  kiln_compile_opts co = {.prefix = c_name ? c_name : g->name, .mem_limit = mem_limit,
                          .no_fuse = no_fuse, .dump_after = dump_after};
  double t0 = krt_now_ms();
  if (kiln_generate(g, &co, &cg)) return KILN_EXIT_ERROR;
  if (gpu->timing)
    fprintf(stderr, "kiln: time: passes %.1f ms\nkiln: time: codegen %.1f ms\n", cg.passes_ms,
            krt_now_ms() - t0 - cg.passes_ms);
  bool exe = !strcmp(emit, "exe");
  char beside[4200];
  kiln_gpu_opts with_weights = *gpu;
  if (!strcmp(weights_where, "auto")) {
    if (cg.param_bytes > WEIGHTS_AUTO_BYTES) {
      if (exe) snprintf(beside, sizeof beside, "%s.weights", out);
      else snprintf(beside, sizeof beside, "%s/libkiln_%s.weights", out, co.prefix);
      with_weights.weights_file = beside;
    }
  } else if (strcmp(weights_where, "embed")) {
    with_weights.weights_file = weights_where;
  }
  gpu = &with_weights;
  char dir[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int rc = KILN_EXIT_ERROR;
  if (!mkdtemp(dir)) {
    fprintf(stderr, "kiln: error: cannot make a build folder under %s: %s\n",
            tmp && *tmp ? tmp : "/tmp", strerror(errno));
  } else {
    t0 = krt_now_ms();
    if (!(exe ? kiln_build_exe(&cg, co.prefix, dir, out, gpu, pb_inputs)
              : kiln_build_lib(&cg, co.prefix, dir, out, gpu))) {
      rc = KILN_EXIT_OK;
      if (gpu->timing) fprintf(stderr, "kiln: time: host compiler %.1f ms\n", krt_now_ms() - t0);
      fprintf(stderr, "kiln: wrote %s%s (%d kernels, %d GEMM calls; arena %zu bytes, weights %zu "
                      "bytes)\n", out, exe ? "" : "/", cg.nkernels, cg.ngemms, cg.arena_bytes,
              cg.param_bytes);
    }
    kiln_remove_build_dir(dir);
  }
  kl_codegen_result_free(&cg);
  return rc;
}

int kiln_cmd_compile(int argc, char **argv) {
  static const struct option longopts[] = {
      {"emit", required_argument, NULL, OPT_EMIT},
      {"arch", required_argument, NULL, OPT_ARCH},
      {"no-nvrtc", no_argument, NULL, OPT_NO_NVRTC},
      {"Werror", no_argument, NULL, OPT_WERROR},
      {"time", no_argument, NULL, OPT_TIME},
      {"mem-limit", required_argument, NULL, OPT_MEM_LIMIT},
      {"no-fuse", no_argument, NULL, OPT_NO_FUSE},
      {"dump-after", required_argument, NULL, OPT_DUMP_AFTER},
      {"pb-inputs", no_argument, NULL, OPT_PB_INPUTS},
      {"name", required_argument, NULL, OPT_NAME},
      {"weights-file", required_argument, NULL, OPT_WEIGHTS_FILE},
      {"output", required_argument, NULL, 'o'},
      {"help", no_argument, NULL, 'h'},
      KILN_MODEL_LONGOPTS,
      {0}};
  kiln_model_opts mo = {0};
  mem_limit = 0;
  no_fuse = false;
  dump_after = NULL;
  pb_inputs = false;
  c_name = NULL;
  weights_where = "auto";
  const char *emit = NULL, *out_path = NULL, *depfile = NULL;
  /* -MD and -MF FILE, as compilers spell them (getopt would read -MD as
   * -M D): taken out of argv first */
  bool md = false;
  int kept = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-MD")) md = true;
    else if (!strcmp(argv[i], "-MF")) {
      if (i + 1 == argc) {
        fprintf(stderr, "kiln compile: -MF needs a FILE\n");
        return KILN_EXIT_USAGE;
      }
      depfile = argv[++i];
    } else argv[kept++] = argv[i];
  }
  argc = kept;
  /* cubins for the Ampere, Hopper and Blackwell data-centre families (an
   * sm_86/sm_89 card runs sm_80's), PTX for the newest, for what comes next */
  int sm[8] = {80, 90, 100}, nsm = 3;
  bool nvrtc = true, werror = false, timing = false, arch_given = false;
  int c;
  while ((c = getopt_long(argc, argv, "ho:", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(compile_help, stdout); return KILN_EXIT_OK;
    case 'o': out_path = optarg; break;
    case OPT_EMIT: emit = optarg; break;
    case OPT_ARCH:
      arch_given = true;
      if ((nsm = parse_archs(optarg, sm, 8)) < 1) {
        fprintf(stderr, "kiln compile: --arch takes sm_XX[,sm_YY...], got '%s'\n", optarg);
        return KILN_EXIT_USAGE;
      }
      break;
    case OPT_NO_NVRTC: nvrtc = false; break;
    case OPT_WERROR: werror = true; break;
    case OPT_TIME: timing = true; break;
    case OPT_NO_FUSE: no_fuse = true; break;
    case OPT_DUMP_AFTER:
      if (!kl_pipeline_has_pass(optarg)) {
        fprintf(stderr, "kiln compile: --dump-after=%s: choose bnfold, precision, "
                        "remat, schedule, fold, fuse, memory or all\n", optarg);
        return KILN_EXIT_USAGE;
      }
      dump_after = mo.dump_after = optarg;
      break;
    case OPT_PB_INPUTS: pb_inputs = true; break;
    case OPT_WEIGHTS_FILE:
      if (!*optarg) {
        fprintf(stderr, "kiln compile: --weights-file takes auto, embed or a FILE\n");
        return KILN_EXIT_USAGE;
      }
      weights_where = optarg;
      break;
    case OPT_NAME: {
      bool ident = (optarg[0] == '_' || (optarg[0] | 32) >= 'a') && (optarg[0] | 32) <= 'z';
      for (const char *q = optarg; *q && ident; q++)
        ident = *q == '_' || ((*q | 32) >= 'a' && (*q | 32) <= 'z') || (*q >= '0' && *q <= '9');
      if (!ident || strlen(optarg) > 100) {
        fprintf(stderr, "kiln compile: --name takes a C identifier, got '%s'\n", optarg);
        return KILN_EXIT_USAGE;
      }
      c_name = optarg;
      break;
    }
    case OPT_MEM_LIMIT:
      if (kiln_parse_mem_limit("compile", optarg, &mem_limit)) return KILN_EXIT_USAGE;
      break;
    default:
      if (kiln_model_opt_or_usage(&mo, c, optarg, compile_help)) return KILN_EXIT_USAGE;
      break;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln compile: expected one MODEL file\n%s", compile_help);
    return KILN_EXIT_USAGE;
  }
  if (!emit || (strcmp(emit, "ir") && strcmp(emit, "cu") && strcmp(emit, "exe") &&
                strcmp(emit, "lib"))) {
    fprintf(stderr, "kiln compile: --emit=%s: choose ir, cu, exe or lib\n", emit ? emit : "(none)");
    return KILN_EXIT_USAGE;
  }
  if (pb_inputs && strcmp(emit, "exe")) {
    fprintf(stderr, "kiln compile: --pb-inputs is for --emit=exe (a library's kiln_NAME_pb.pc "
                    "links the .pb reader)\n");
    return KILN_EXIT_USAGE;
  }
  if (strcmp(weights_where, "auto") && strcmp(emit, "exe") && strcmp(emit, "lib")) {
    fprintf(stderr, "kiln compile: --weights-file is for --emit=exe and --emit=lib (--emit=cu "
                    "writes weights.bin beside model.c)\n");
    return KILN_EXIT_USAGE;
  }
  if (strcmp(emit, "ir") && !out_path) {
    fprintf(stderr, "kiln compile: --emit=%s needs -o %s\n", emit,
            strcmp(emit, "exe") ? "FOLDER" : "PROGRAM");
    return KILN_EXIT_USAGE;
  }
  /* no --arch: the GPU here, when there is one (its cubin and PTX); else
   * the defaults, for whatever GPU the program meets */
  if (!arch_given && nvrtc && strcmp(emit, "ir")) {
    krt_device *gpu_here = NULL;
    char why[256];
    if (!krt_device_open(KRT_DEVICE_CUDA, &gpu_here, why, sizeof why) && krt_device_sm(gpu_here) > 0)
      sm[0] = krt_device_sm(gpu_here), nsm = 1;
    krt_device_close(gpu_here);
  }
  kiln_cutoff_sm = nvrtc && strcmp(emit, "ir") ? sm[0] : 0;
  if ((md || depfile) && !out_path) {
    fprintf(stderr, "kiln compile: -MD/-MF need -o OUT (the depfile's target)\n");
    return KILN_EXIT_USAGE;
  }
  if (out_path && output_unwritable(emit, out_path)) return KILN_EXIT_ERROR;
  double t0 = krt_now_ms();
  mo.mem_limit = mem_limit, mo.no_fuse = no_fuse;
  kl_graph *g = kiln_load_model(argv[optind], &mo);
  if (timing && g) fprintf(stderr, "kiln: time: front end %.1f ms\n", krt_now_ms() - t0);
  int rc = KILN_EXIT_ERROR;
  kiln_gpu_opts gpu = {sm, nsm, nvrtc, werror, timing, NULL};
  if (g && (!strcmp(emit, "exe") || !strcmp(emit, "lib"))) {
    rc = build_artifact(g, emit, out_path, &gpu);
  } else if (g && !strcmp(emit, "cu")) {
    kl_codegen_result cg;
    kiln_compile_opts co = {.prefix = c_name ? c_name : g->name, .mem_limit = mem_limit, .no_fuse = no_fuse,
                            .dump_after = dump_after};
    t0 = krt_now_ms();
    int cg_rc = kiln_generate(g, &co, &cg);
    if (timing && !cg_rc)
      fprintf(stderr, "kiln: time: passes %.1f ms\nkiln: time: codegen %.1f ms\n", cg.passes_ms,
              krt_now_ms() - t0 - cg.passes_ms);
    if (!cg_rc) {
      if ((mkdir(out_path, 0777) == 0 || errno == EEXIST) && !kiln_write_sources(&cg, out_path, timing)) {
        rc = KILN_EXIT_OK;
        char why[300];
        if (nvrtc && cg.nkernels && !kl_nvrtc_available(why, sizeof why))
          fprintf(stderr, "kiln: %s: no GPU images written (the host device still works)\n", why);
        else if (nvrtc && cg.nkernels && kiln_gpu_images(&cg, out_path, sm, nsm, werror, timing))
          rc = KILN_EXIT_ERROR;
        fprintf(stderr, "kiln: wrote %s/kernels.cu (%d kernels), model.c (%d GEMM calls), %s; "
                        "arena %zu bytes (lower bound %zu, naive sum %zu), weights %zu bytes\n",
                out_path, cg.nkernels, cg.ngemms, cg.header, cg.arena_bytes, cg.arena_lower_bound,
                cg.naive_bytes, cg.param_bytes);
      } else if (rc) {
        fprintf(stderr, "kiln: error: cannot create folder %s: %s\n", out_path, strerror(errno));
      }
      kl_codegen_result_free(&cg);
    }
  } else if (g) {
    rc = emit_ir(g, out_path && strcmp(out_path, "-") == 0 ? NULL : out_path); /* -o -: stdout */
  }
  if (rc == KILN_EXIT_OK && (md || depfile)) {
    char dflt[4200], first[4200], second[4200];
    const char *name = c_name ? c_name : g->name;
    snprintf(dflt, sizeof dflt, "%s.d", out_path);
    const char *outs[2] = {first, second};
    int nouts = 1;
    if (!strcmp(emit, "lib")) {
      snprintf(first, sizeof first, "%s/libkiln_%s.a", out_path, name);
      snprintf(second, sizeof second, "%s/%s.h", out_path, name);
      nouts = 2;
    } else if (!strcmp(emit, "cu")) {
      snprintf(first, sizeof first, "%s/kernels.cu", out_path);
    } else {
      snprintf(first, sizeof first, "%s", out_path);
    }
    if (write_depfile(depfile ? depfile : dflt, outs, nouts, argv[optind], g)) rc = KILN_EXIT_ERROR;
  }
  kl_graph_free(g);
  if (timing) print_max_rss();
  return rc;
}
