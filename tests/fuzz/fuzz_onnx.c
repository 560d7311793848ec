/* fuzz_onnx.c - libFuzzer target: any bytes given to the ONNX loader must
 * end in a graph or an error, never a crash, a leak or a hang.  External
 * data resolves against a path that has no neighbours to read. */
#include <stddef.h>
#include <stdint.h>

#include "../../frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kl_onnx_options opt = {0};
  kl_error err;
  kl_graph *g = kl_onnx_load_bytes(data, size, "/nonexistent-kiln-fuzz/model.onnx", &opt, &err);
  kl_graph_free(g);
  return 0;
}
