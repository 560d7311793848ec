/* app.c - a program that calls a compiled model, as examples/make,
 * examples/meson and examples/cmake build it (each compiles the model at
 * build time): runs the MLP (examples/mlp.kl, compiled as `mlp`) on the
 * samples of X.npy, f32[32, 784], and writes its probabilities to OUT.npy.
 * Built with -DWITH_CNN it links a second model, the CNN, and runs it too.
 *
 *   app X.npy OUT.npy */
#include <stdio.h>
#include <stdlib.h>

#include "mlp.h" /* mlp_INPUT_x, kiln_model_mlp(), ... */
#ifdef WITH_CNN
#include "cnn.h"
#endif

/* Create the model on dev, run it once, destroy it; 0 or 1 (said why). */
static int run_once(const krt_model_api *m, krt_device *dev, const void **in, void **out) {
  void *model = NULL;
  char err[1024];
  int rc = m->create(dev, &model, err, sizeof err) || m->run(model, in, out, err, sizeof err);
  if (rc) fprintf(stderr, "app: %s: %s\n", m->model_name, err);
  if (model) m->destroy(model);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: app X.npy OUT.npy\n");
    return 2;
  }
  char err[1024];
  krt_device *dev = NULL;
  krt_tensor x;
  if (krt_npy_read(argv[1], &x, err, sizeof err) || krt_device_open(KRT_DEVICE_AUTO, &dev, err, sizeof err)) {
    fprintf(stderr, "app: %s\n", err);
    return 1;
  }
  const krt_model_api *mlp = kiln_model_mlp();
  const krt_io_desc *od = &mlp->outputs[mlp_OUTPUT_probs];
  krt_tensor probs = {od->dtype, od->rank, {0}, NULL};
  for (int d = 0; d < od->rank; d++) probs.dims[d] = od->dims[d];
  probs.data = malloc((size_t)krt_tensor_numel(&probs) * krt_dtype_size(probs.dtype));
  /* the labels feed only the training loss: inference passes NULL */
  const void *in[mlp_NUM_INPUTS] = {NULL};
  void *out[mlp_NUM_OUTPUTS] = {NULL};
  in[mlp_INPUT_x] = x.data;
  out[mlp_OUTPUT_probs] = probs.data;
  int rc = !probs.data || run_once(mlp, dev, in, out) || krt_npy_write(argv[2], &probs, err, sizeof err);
  if (!rc) printf("app: ran %s on %s\n", mlp->model_name, krt_device_name(dev));
#ifdef WITH_CNN
  /* the second model, on zeros: both link into one program */
  const krt_model_api *cnn = kiln_model_cnn();
  void *cin[cnn_NUM_INPUTS + 1], *cout[cnn_NUM_OUTPUTS + 1];
  for (int i = 0; i < cnn->ninputs; i++) cin[i] = calloc(1, 4 << 20);
  for (int i = 0; i < cnn->noutputs; i++) cout[i] = calloc(1, 4 << 20);
  if (!rc && !(rc = run_once(cnn, dev, (const void **)cin, cout))) printf("app: ran %s\n", cnn->model_name);
  for (int i = 0; i < cnn->ninputs; i++) free(cin[i]);
  for (int i = 0; i < cnn->noutputs; i++) free(cout[i]);
#endif
  krt_tensor_free(&x);
  krt_tensor_free(&probs);
  krt_device_close(dev);
  return rc;
}
