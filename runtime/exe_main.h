/* exe_main.h - how libkilnrt_pb gives krt_exe_main its .pb reader, so that
 * libkilnrt itself never refers to protobuf-c.  Private to runtime/, not
 * installed. */
#ifndef KILN_EXE_MAIN_H
#define KILN_EXE_MAIN_H

#include "kilnrt.h"

/* Reads one tensor file, as krt_npy_read. */
typedef int (*krt_tensor_reader)(const char *path, krt_tensor *out, char *errbuf,
                                 size_t errlen);

/* krt_exe_main with pb_read for .pb inputs; NULL refuses them with a
 * message saying how to read them. */
int krt_exe_main_with(const krt_model_api *api, krt_tensor_reader pb_read, int argc, char **argv);

#endif
