/* main.c - the kiln command: dispatch to subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char main_help[] =
    "usage: kiln COMMAND [options]\n"
    "Kiln, an ahead-of-time graph compiler.\n"
    "commands:\n"
    "  run MODEL        evaluate a model (interpreter, or compiled: --device)\n"
    "  compile MODEL    compile a model (--emit=ir|cu|exe|lib; --train: its\n"
    "                   training step)\n"
    "  train MODEL      compile the training step and train (--data DIR)\n"
    "  inspect MODEL    inputs, outputs, parameters and op counts\n"
    "  bench MODEL      compile fused and unfused, run both, compare\n"
    "  profile MODEL    time each kernel and GEMM, bandwidth against a copy\n"
    "  check MODEL      compiled model against the interpreter; names the first\n"
    "                   node that diverges\n"
    "  help             show this help\n"
    "`kiln COMMAND --help` describes each command.\n"
    "exit codes: 0 success, 1 error in the model or its inputs, 2 bad command\n"
    "line, 3 internal error or out of memory (check: 1 when outputs differ, 2 on\n"
    "any error).\n";

int main(int argc, char **argv) {
#ifdef KILN_TEST_BREAK_OP
  /* kiln_test_break only (tests/cli/test_check.sh): codegen writes a wrong
   * kernel for this op, the bug `kiln check` must find. */
  const char *broken = getenv("KILN_TEST_BREAK_OP");
  if (broken && *broken) kl_cg_test_break_op = broken;
  const char *scale = getenv("KILN_TEST_BREAK_SCALE"); /* instead: times this factor */
  if (scale && *scale) kl_cg_test_break_scale = strtod(scale, NULL);
  kl_cg_test_hide_nvrtc = getenv("KILN_TEST_HIDE_NVRTC") != NULL;
#endif
  if (argc < 2) {
    fputs(main_help, stderr);
    return KILN_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    fputs(main_help, stdout);
    return KILN_EXIT_OK;
  }
  if (!strcmp(cmd, "--version")) {
    printf("kiln %s (CUDA toolkit %s)\nruntime headers: %s\nruntime libraries: %s\n", KILN_VERSION,
           KILN_CUDA_TOOLKIT, kiln_runtime_dir(), kiln_lib_dir());
    return KILN_EXIT_OK;
  }
  kiln_progress_begin();
  /* Each subcommand parses argv[1..] so getopt sees its name as argv[0]. */
  if (!strcmp(cmd, "run")) return kiln_cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "compile")) return kiln_cmd_compile(argc - 1, argv + 1);
  if (!strcmp(cmd, "inspect")) return kiln_cmd_inspect(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return kiln_cmd_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "profile")) return kiln_cmd_profile(argc - 1, argv + 1);
  if (!strcmp(cmd, "check")) return kiln_cmd_check(argc - 1, argv + 1);
  if (!strcmp(cmd, "train")) return kiln_cmd_train(argc - 1, argv + 1);
  fprintf(stderr, "kiln: unknown command '%s'\n%s", cmd, main_help);
  return KILN_EXIT_USAGE;
}
