/* driver.h - pieces shared by the kiln subcommands (internal to driver/). */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include "../codegen/codegen.h"
#include "../frontend/frontend.h"
#include "../runtime/kilnrt.h"
#include "../ir/ir.h"

/* Exit codes: */
enum {
  KILN_EXIT_OK = 0,
  KILN_EXIT_ERROR = 1, /* bad model, bad input file, run-time error */
  KILN_EXIT_USAGE = 2, /* bad command line */
  KILN_EXIT_INTERNAL = 3
};

/* Options every subcommand that reads a model accepts. */
typedef struct {
  kl_dim_override dims[32];
  int ndims;
  const char *weights; /* --weights FILE.safetensors */
  kl_shape_binding shapes[32]; /* --shape NAME=d0,d1,... (ONNX inputs) */
  int nshapes;
  /* --precision, --io-precision, --fp32-ops, --fp32-nodes: the precision
   * pass runs when any is given (prec.low is then set) */
  bool precision;
  kl_precision_options prec;
  const char *fp32_ops[64], *fp32_nodes[256];
  const char *dump_after; /* --dump-after=PASS|all (kiln compile) */
  bool train;             /* --train: compile the training step */
  /* --mem-limit and --no-fuse of the compile to come: a training step
   * over the limit recomputes values instead (passes/remat.c) */
  size_t mem_limit;
  bool no_fuse;
  /* an ONNX model's train block (driver/train_onnx.c) */
  const char *loss, *logits, *labels, *optimizer, *schedule;
  double clip;
  /* --data-parallel, --bucket-mb: the step sums its gradients over the
   * ranks of an MPI run (passes/train.c) */
  bool data_parallel;
  double bucket_mb;
} kiln_model_opts;

/* getopt_long values for the shared options. */
enum { OPT_DIM = 1000, OPT_WEIGHTS, OPT_SHAPE, OPT_PRECISION, OPT_IO_PRECISION, OPT_FP32_OPS,
       OPT_FP32_NODES, OPT_TRAIN, OPT_LOSS, OPT_LOGITS, OPT_LABELS, OPT_OPTIMIZER, OPT_SCHEDULE,
       OPT_CLIP, OPT_DATA_PARALLEL, OPT_BUCKET_MB };
#define KILN_MODEL_LONGOPTS                                                    \
  {"dim", required_argument, NULL, OPT_DIM},                                   \
  {"weights", required_argument, NULL, OPT_WEIGHTS},                           \
  {"shape", required_argument, NULL, OPT_SHAPE},                               \
  {"precision", required_argument, NULL, OPT_PRECISION},                       \
  {"io-precision", required_argument, NULL, OPT_IO_PRECISION},                 \
  {"fp32-ops", required_argument, NULL, OPT_FP32_OPS},                         \
  {"fp32-nodes", required_argument, NULL, OPT_FP32_NODES},                     \
  {"train", no_argument, NULL, OPT_TRAIN},                                     \
  {"loss", required_argument, NULL, OPT_LOSS},                                 \
  {"logits", required_argument, NULL, OPT_LOGITS},                             \
  {"labels", required_argument, NULL, OPT_LABELS},                             \
  {"optimizer", required_argument, NULL, OPT_OPTIMIZER},                       \
  {"schedule", required_argument, NULL, OPT_SCHEDULE},                         \
  {"clip", required_argument, NULL, OPT_CLIP},                                 \
  {"data-parallel", no_argument, NULL, OPT_DATA_PARALLEL},                     \
  {"bucket-mb", required_argument, NULL, OPT_BUCKET_MB}
#define KILN_MODEL_HELP                                                        \
  "  --dim NAME=V          set a `dim` of a .kl model, or bind the symbolic dim\n" \
  "                        NAME of an ONNX model's inputs (repeatable)\n"     \
  "  --weights FILE        replace params/consts with the tensors of a "       \
  ".safetensors file\n"                                                       \
  "  --shape NAME=D0,D1,.. bind the shape of an ONNX input with symbolic dims\n" \
  "  --precision=P         fp32 (default), fp16 or bf16.  In P: matmul, gemm,\n" \
  "                        conv2d, conv_transpose2d and the elementwise and\n" \
  "                        data movement ops around them (batch_norm, relu,\n" \
  "                        add, reshape...).  In fp32: softmax, log_softmax,\n" \
  "                        layer_norm, rms_norm, the reductions (reduce_*,\n"  \
  "                        argmax/argmin, cumsum, topk), avg and global pools,\n" \
  "                        exp, log, pow, reciprocal, rsqrt, softplus, tan,\n" \
  "                        asin, acos, sinh, cosh, asinh, acosh, atanh, det,\n" \
  "                        grid_sample, the losses, --fp32-ops, --fp32-nodes,\n" \
  "                        and any node with a weight or float attribute P\n"  \
  "                        cannot hold (beyond its range; a scale or epsilon\n" \
  "                        flushing to 0).  kiln inspect --precision=P says\n" \
  "                        which and why.  Inference batch norms after a conv\n" \
  "                        or GEMM are folded into its weights first, in fp32\n" \
  "  --io-precision=P      inputs and outputs in P (default: as declared)\n"   \
  "  --fp32-ops OP,...     keep these ops in fp32 too (repeatable)\n"          \
  "  --fp32-nodes NAME,... keep these nodes in fp32 (repeatable)\n"             \
  "  --train               the training step of the model's train block:\n"   \
  "                        forward, backward and optimizer update in one\n"   \
  "                        compiled step (docs/DSL.md, Training)\n"          \
  "  --loss=L --logits NAME --labels NAME   an ONNX model's loss: L is\n"    \
  "                        cross_entropy (labels: class indices) or mse\n"     \
  "  --optimizer SPEC      ONNX: adam(lr=1e-3) (default), adamw(...), sgd(...)\n" \
  "  --schedule SPEC       ONNX: constant(), step(step_size=N), cosine(...)\n"  \
  "  --clip X              ONNX: global-norm gradient clipping\n"             \
  "  --data-parallel       with --train: sum the gradients over the ranks of\n" \
  "                        an MPI run (mpirun -np N; docs/SCALING.md), each\n" \
  "                        bucket's exchange started as soon as it is ready\n" \
  "  --bucket-mb N         gradient bucket size (default 25; implies\n"     \
  "                        --data-parallel)\n"

/* Handle a shared option; -1 (message printed) on a bad value. */
/* Names are cut out of `arg` in place (argv outlives the options). */
int kiln_model_opt(kiln_model_opts *o, int opt, char *arg);
/* In a subcommand's getopt loop, for any option it does not handle itself:
 * one of the shared options (0, or -1 after printing why its value is
 * bad), or an unknown one (-1 after printing `help`). */
int kiln_model_opt_or_usage(kiln_model_opts *o, int opt, char *arg, const char *help);
/* Whether `path` holds an ONNX model: named .onnx, or protobuf by its
 * first bytes whatever its name (.kl text has no control characters). */
bool kiln_is_onnx(const char *path);
/* A loading error of an ONNX model, with a note when it was taken for ONNX
 * by its content (a .kl file with a stray control character). */
void kiln_print_onnx_error(const char *path, const kl_error *err);
/* Read a model (.kl or .onnx), apply --weights and the precision options;
 * NULL after printing the error. */
kl_graph *kiln_load_model(const char *path, const kiln_model_opts *o);
/* The passes that rewrite the graph (passes/pipeline.c: bnfold, and
 * precision when the options ask for it); kiln_load_model calls them.  -1 after printing
 * the error. */
int kiln_apply_precision(kl_graph *g, const kiln_model_opts *o);
/* An ONNX model's train block from --loss, --logits, --labels,
 * --optimizer, --schedule, --clip (driver/train_onnx.c); -1 after printing
 * the error. */
int kiln_onnx_train_block(kl_graph *g, const kiln_model_opts *o);

/* How to compile a loaded graph. */
typedef struct {
  const char *prefix;     /* C identifier for the model's symbols */
  size_t mem_limit;       /* --mem-limit; 0: none */
  bool no_fuse;           /* --no-fuse */
  const char *dump_after; /* --dump-after; NULL: none */
} kiln_compile_opts;
/* The planning passes (passes/pipeline.c), then the code generator, into
 * *cg; -1 after printing the error. */
int kiln_generate(const kl_graph *g, const kiln_compile_opts *co, kl_codegen_result *cg);
/* The GPU architecture whose cut-offs (codegen/cutoffs.c) the passes use:
 * the first --arch of kiln compile, the GPU a run, bench or train step
 * meets; 0 (the default row) else. */
extern int kiln_cutoff_sm;
/* Set kiln_cutoff_sm from the device of that kind, opened and closed. */
void kiln_cutoffs_for_device(krt_device_kind kind);
/* The same with the error in *err, not printed. */
int kiln_generate_err(const kl_graph *g, const kiln_compile_opts *co, kl_codegen_result *cg,
                      kl_error *err);

/* Replace params/consts with the tensors of a .safetensors file; -1 after
 * printing the error. */
int kiln_apply_weights(kl_graph *g, const char *path);

/* Tensor files (.npy, or ONNX TensorProto .pb) <-> interpreter tensors;
 * errors printed, NULL returned. */
kl_tensor *kiln_read_tensor(const char *path);
int kiln_write_tensor(const char *path, const kl_tensor *t);
kl_tensor *kiln_random_tensor(const kl_value *decl, uint64_t seed);
/* The value of a training step's scalar input decl when none is given
 * (a step that takes its update); false for any other input. */
bool kiln_train_scalar(const kl_graph *g, const kl_value *decl, double *value);
void kiln_print_summary(FILE *f, const char *label, const kl_tensor *t);

/* Write kernels.cu, model.c, model.h and weights.bin into dir; the
 * weights are streamed from where they lie (the graph that cg was made
 * from must still be alive).  With `timing`, the time and rate of writing
 * the weights on stderr. */
int kiln_write_sources(const kl_codegen_result *cg, const char *dir, bool timing);
/* The memory plan as an SVG picture (memplan_svg.c); -1 after printing the
 * error. */
int kiln_write_memplan_svg(const kl_codegen_result *cg, const char *model, const char *path);
/* The graph for Graphviz, fusion groups as clusters (inspect_dot.c); -1
 * after printing the error. */
int kiln_write_dot(const kl_graph *g, const kl_codegen_result *cg, const char *path);
/* --mem-limit=SIZE: bytes, or K/M/G (1024-based); -1 after printing why. */
int kiln_parse_mem_limit(const char *cmd, const char *arg, size_t *out);
/* NVRTC for sm[0..nsm) plus PTX for the last, into dir/gpu_images.c. */
int kiln_gpu_images(const kl_codegen_result *cg, const char *dir, const int *sm, int nsm,
                    bool werror, bool timing);
/* Build them into a shared object and load the model (dlclose the handle
 * when done): host kernels always, GPU images too when gpu_sm is a GPU's
 * compute capability (x 10; 0: none): its cubin and its PTX; NULL after
 * printing the error. */
void *kiln_build_host(const kl_codegen_result *cg, const char *dir, int gpu_sm,
                      const krt_model_api **api);

/* Where runtime/ (kilnrt.h, emu/, pb/) is: KILN_RUNTIME_DIR when set (a kiln
 * moved away from its source tree), else the source tree it was built in. */
/* Where the static libraries of the runtime lie: KILN_LIB_DIR (the
 * environment's, else the build folder), or PREFIX/LIBDIR for an installed
 * kiln. */
const char *kiln_lib_dir(void);
/* Copy a file whole; -1 after printing which copy failed and why. */
int kiln_copy_file(const char *from, const char *to);
/* Progress on stderr for a compile over a second: kiln_progress_begin at
 * the start (main), then one line per phase ("kiln: [2.3 s] NVRTC: sm_90
 * of 41 kernels"), printed only once a second has gone by. */
void kiln_progress_begin(void);
void kiln_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* PREFIX of an installed kiln (PREFIX/bin/kiln beside
 * PREFIX/include/kiln/kilnrt.h), or NULL in its build folder. */
const char *kiln_installed_prefix(void);
const char *kiln_runtime_dir(void);
/* The C compiler for generated code: KILN_CC, else cc. */
const char *kiln_c_compiler(void);
/* The prelude NVRTC compiles kernels.cu against (runtime/emu's
 * kiln_prelude.h), malloc'ed; NULL when it cannot be read. */
char *kiln_read_prelude(void);
/* "kiln: error: WHAT failed" and the head of dir/build.log, on stderr. */
void kiln_report_build_log(const char *dir, const char *what);
/* rm -rf a scratch build folder, unless KILN_KEEP_BUILD is set (then say
 * where it is). */
void kiln_remove_build_dir(const char *dir);
/* s quoted for /bin/sh, into out (n bytes). */
void kiln_shell_quote(char *out, size_t n, const char *s);

/* GPU images for the artifacts: NVRTC for sm[0..nsm) plus PTX. */
typedef struct {
  const int *sm;
  int nsm;
  bool nvrtc, werror, timing;
  /* the weights in a file of their own at this path, mapped at create
   * (kiln compile --weights-file); NULL: assembled into the artifact */
  const char *weights_file;
} kiln_gpu_opts;
/* A standalone program at `out`, built in the scratch folder `dir`; with
 * `pb`, it reads .pb inputs too (libkilnrt_pb and protobuf-c linked). */
int kiln_build_exe(const kl_codegen_result *cg, const char *prefix, const char *dir,
                   const char *out, const kiln_gpu_opts *gpu, bool pb);
/* libkiln_<prefix>.a, model.h, kilnrt.h, the runtime's static libraries
 * and kiln_<prefix>.pc in folder out_dir, built in `dir`; libkilnrt_pb.a,
 * pb/kilnrt_pb.h and kiln_<prefix>_pb.pc beside them for a program that
 * reads .pb files. */
int kiln_build_lib(const kl_codegen_result *cg, const char *prefix, const char *dir,
                   const char *out_dir, const kiln_gpu_opts *gpu);

/* Where a run's inputs come from (kiln run, kiln check): --input NAME=FILE,
 * --inputs-dir DIR (input_K.pb or .npy), else seeded random values. */
typedef struct {
  const char *name, *path;
} kiln_named_file;
typedef struct {
  const kiln_named_file *files;
  int nfiles;
  const char *dir;
  uint64_t seed;
} kiln_input_opts;
/* --input NAME=FILE into files[*nfiles] (arg is cut in place); -1 after
 * printing why not. */
int kiln_input_file_opt(const char *cmd, char *arg, kiln_named_file *files, int *nfiles,
                        int cap);
/* Read a model for a run on these inputs, applying the shared options.  An
 * ONNX model without --shape is compiled for the given files' shapes, and
 * an input that decides a shape is frozen to its value.  When `in` is not
 * NULL, *in receives g->inputs.len tensors, read or seeded random (said on
 * stderr).  NULL after printing the error. */
kl_graph *kiln_load_for_run(const char *path, const kiln_model_opts *mo, const kiln_input_opts *io,
                            kl_tensor ***in);
/* Compile g for a device (host, cuda or auto) in a temporary folder and run
 * it on in[] (g's input order); out[] receives g->outputs.len new tensors,
 * device_name the device's name.  -1 after printing the error. */
int kiln_run_compiled(const kl_graph *g, krt_device_kind kind, const kiln_compile_opts *co,
                      kl_tensor **in, kl_tensor **out, char *device_name, size_t n);

int kiln_cmd_run(int argc, char **argv);
int kiln_cmd_compile(int argc, char **argv);
int kiln_cmd_inspect(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
int kiln_cmd_profile(int argc, char **argv);
int kiln_cmd_check(int argc, char **argv);
int kiln_cmd_train(int argc, char **argv);

#endif
