/* fuzz_dsl.c - libFuzzer target: any bytes given to the .kl parser must end
 * in a graph or a located error, never a crash, a leak or a hang. */
#include <stddef.h>
#include <stdint.h>

#include "../../frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kl_parse_options opt = {.no_load = true};
  kl_error err;
  kl_graph *g = kl_parse_string((const char *)data, size, "fuzz.kl", &opt, &err);
  if (g) {
    /* Printing walks every node and attribute. */
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
      kl_print_graph(devnull, g);
      fclose(devnull);
    }
    kl_graph_free(g);
  } else if (err.loc.line < 0 || err.loc.col < 0) {
    __builtin_trap();
  }
  return 0;
}
