/*
 * comm_local.h — the communicator of one process (comm_local.c).
 */
#ifndef ZS_RUNTIME_COMM_LOCAL_H_
#define ZS_RUNTIME_COMM_LOCAL_H_

#include "runtime/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The communicator of one process without MPI (comm_local.c): world size
 * 1, every collective a copy done at once. Errors: OUT_OF_MEMORY. */
zs_status zs__comm_local_create(zs__comm** out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_LOCAL_H_ */
