/* exe_main_pb.c - the standalone program's command line with .pb inputs:
 * krt_exe_main given krt_pb_read. */
#include "../exe_main.h"
#include "kilnrt_pb.h"

int krt_exe_main_pb(const krt_model_api *api, int argc, char **argv) {
  return krt_exe_main_with(api, krt_pb_read, argc, argv);
}
