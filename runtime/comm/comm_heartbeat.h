/*
 * comm_heartbeat.h — liveness of the other ranks, apart from MPI: each rank
 * sends a heartbeat (with what it is doing) to the rank before it in a
 * ring, over a TCP connection of their own, from a thread of its own; the
 * rank that stops hearing from the rank after it (silent for the timeout:
 * stopped, or hung outside the library; or its connection closed without
 * a goodbye: its process ended) passes the news down the ring, so every
 * surviving rank learns which rank it is within the timeout plus one hop
 * per rank. A wait that learns it fails (comm_wait.c) instead of waiting
 * for the collective timeout. docs/running.md says why this channel.
 */
#ifndef ZS_RUNTIME_COMM_HEARTBEAT_H_
#define ZS_RUNTIME_COMM_HEARTBEAT_H_

#include <stddef.h>
#include <stdint.h>

#include "runtime/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__heartbeat zs__heartbeat;

/* What each rank publishes to the others before they connect: where its
 * listening socket is (IPv4, network byte order), its host's name, and
 * whether it could listen at all. */
typedef struct zs__hb_record {
  uint32_t addr;
  uint16_t port;
  uint16_t ok;
  uint32_t pid;
  uint32_t pad;
  char host[64];
} zs__hb_record;

/* Opens this rank's listening socket (any address, a free port) and fills
 * *mine: the address its host name resolves to (ZS_HEARTBEAT_ADDR, an IPv4
 * address, overrides it), or loopback. Errors: COMM naming the call that
 * failed (mine->ok is 0 then, so the others learn of it too). */
zs_status zs__hb_listen(int rank, int world, double timeout_s,
                        zs__heartbeat** out, zs__hb_record* mine);

/* After every rank's record is known (all: world records): connects to the
 * rank before this one (it watches this rank), accepts the rank after
 * (this one watches it), and starts the heartbeat thread. Ranks on this
 * host are reached over loopback. Waits at most 60 s for the peers.
 * Errors: COMM (a peer could not listen, or did not connect). */
zs_status zs__hb_start(zs__heartbeat* hb, const zs__hb_record* all);

/* How much a failed zs__hb_start says about the cause: 2 when this rank
 * could not reach the rank before it (its own view of the network), 1 when
 * the rank after it never came (a symptom of that rank's failure), 0 when
 * it did not fail. The setup reports the failure with the most. */
int zs__hb_blame(const zs__heartbeat* hb);

/* Stops the thread and tells the watching rank this one leaves on purpose
 * (it stops watching), then closes everything. NULL: nothing. */
void zs__hb_destroy(zs__heartbeat* hb);

/* The rank known to be lost (silent or gone; with `waiting`, for a wait
 * of a collective, also one that left the context with zs_context_destroy
 * more than a few seconds ago), with its host and pid, why, and what it
 * was last heard doing in `why` (cap bytes), or -1. Any thread. */
int zs__hb_lost(zs__heartbeat* hb, int waiting, char* why, size_t cap);

/* Calls fn(arg, rank, why) once when a rank is lost (silent or gone, as
 * zs__hb_lost says without `waiting`): from the thread that finds it (the
 * heartbeat thread, or a wait's), outside hb's lock, or at once when one
 * is lost already. One listener (a later call replaces it; fn NULL: none);
 * none after zs__hb_destroy, so arg must outlive hb or be removed first.
 * The device communicator's watchdog (comm_nccl.c) listens. */
void zs__hb_on_lost(zs__heartbeat* hb,
                    void (*fn)(void* arg, int rank, const char* why),
                    void* arg);

/* What this rank does, sent with each heartbeat (cheap: a lock and a
 * copy; NULL hb: nothing). zs__hb_call: a public call `fn` (a static
 * string) began, on `unit` (a unit's name, or NULL); zs__hb_wait: it waits
 * for `what` (NULL: no longer); zs__hb_return: the call returned to the
 * caller's code. */
void zs__hb_call(zs__heartbeat* hb, const char* fn, const char* unit);
void zs__hb_wait(zs__heartbeat* hb, const char* what);
void zs__hb_return(zs__heartbeat* hb);

#ifdef __cplusplus
}
#endif

#endif  // ZS_RUNTIME_COMM_HEARTBEAT_H_
