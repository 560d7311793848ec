/* onnx_tensor.h - ONNX TensorProto contents for libkilnrt_pb (.pb tensor
 * files) and the ONNX frontend (initializers, Constant values).  Internal
 * to Kiln: it exposes protobuf-c's generated types, so compiled programs
 * use krt_pb_read from kilnrt_pb.h instead. */
#ifndef KILN_ONNX_TENSOR_H
#define KILN_ONNX_TENSOR_H

#include "../kilnrt.h"
#include "onnx.pb-c.h"

/* ONNX TensorProto.DataType -> krt_dtype; -1 when Kiln has no such type. */
int krt_onnx_dtype(int onnx_type, krt_dtype *out);
const char *krt_onnx_type_name(int onnx_type);

/* The dtype, rank and dims of t, checked (supported dtype, rank within
 * KRT_MAX_RANK, element count within KRT_MAX_NUMEL).  Returns 0; -1 with a
 * message in err; -2 for a data type Kiln does not support. */
int krt_onnx_tensor_header(const Onnx__TensorProto *t, krt_tensor *out, char *err, size_t errlen);

/* The bytes held inside the message (raw_data or the typed fields) for the
 * header `h` filled by krt_onnx_tensor_header: *data is malloc'd.  External
 * data is the caller's business (it needs the model's folder). */
int krt_onnx_tensor_payload(const Onnx__TensorProto *t, const krt_tensor *h, void **data,
                            char *err, size_t errlen);

#endif
