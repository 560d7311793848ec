/* kilnrt_pb.h - libkilnrt_pb: ONNX TensorProto (.pb) tensor files, the
 * format of the inputs and outputs in ONNX's test data.  The one part of the
 * runtime that needs protobuf-c, so it is a library of its own: a program
 * links it (-lkilnrt_pb before -lkilnrt, and protobuf-c) only when it reads
 * .pb files.  One public header for the runtime/pb/ folder. */
#ifndef KRT_KILNRT_PB_H
#define KRT_KILNRT_PB_H

#include "../kilnrt.h"

/* A .pb file holding one TensorProto: raw_data or the typed fields, every
 * dtype of krt_dtype; external data is refused.  0, or -1 with a message
 * naming the file in errbuf, as the readers of kilnrt.h. */
int krt_pb_read(const char *path, krt_tensor *out, char *errbuf, size_t errlen);

/* krt_exe_main for a program that reads .pb inputs as well as .npy ones
 * (kiln compile --emit=exe --pb-inputs): --inputs-dir then takes an ONNX
 * test's input_K.pb before input_K.npy. */
int krt_exe_main_pb(const krt_model_api *api, int argc, char **argv);

#endif /* KRT_KILNRT_PB_H */
