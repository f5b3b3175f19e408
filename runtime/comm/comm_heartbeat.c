/*
 * comm_heartbeat.c — heartbeats between ranks over TCP, in a ring
 * (comm_heartbeat.h). Rank r sends to rank r-1 (its watcher) every
 * interval and watches rank r+1. Messages are text lines:
 *   "B <what it is doing>"     a heartbeat
 *   "D <rank> <why>"           that rank is lost (passed down the ring)
 *   "Q"                        this rank leaves on purpose (context
 *                              destroyed): stop watching it
 *   "L <rank>"                 that rank left (passed down the ring): a
 *                              collective still waiting on it a few
 *                              seconds later never completes
 * The thread never calls MPI, so neither a stuck collective nor a dead
 * peer inside MPI can stop it; it wakes once per interval, so it costs
 * nothing measurable (tools/zs bench overlap runs with it on and off).
 */
#define _GNU_SOURCE
#include "runtime/comm/comm_heartbeat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ZS__HB_LINE 400 /* bytes of one message, newline included */
/* A rank that left (zs_context_destroy) is lost for a wait still going on
 * this long after the news (its last collectives may still be completing
 * on the others when it leaves) */
#define ZS__HB_LEAVE_GRACE_S 3.0

struct zs__heartbeat {
  int rank, world;
  int watched;  /* rank + 1: this rank hears its heartbeats */
  int watcher;  /* rank - 1: this rank sends it heartbeats */
  double timeout_s, interval_s;
  int listen_fd, out_fd, in_fd;
  int wake[2];  /* a pipe: destroy wakes the thread */
  pthread_t thread;
  int thread_on;
  pthread_mutex_t lock;
  /* this rank's activity (main thread writes, heartbeat thread reads) */
  char fn[48];
  char unit[64];
  char waiting[160];
  int in_call;
  double since;   /* when the call began or returned */
  /* what is known of the watched rank (heartbeat thread only) */
  char peer_doing[ZS__HB_LINE];
  double peer_last;
  int peer_left;  /* it said "Q" */
  char inbuf[2 * ZS__HB_LINE];
  size_t inlen;
  /* the lost rank (set once; read by any thread under lock) */
  int lost;       /* atomic read outside the lock; -1: none */
  char lost_why[ZS__HB_LINE + 200];
  int left;       /* the first rank known to have left, or -1 (lock) */
  double left_at; /* when this rank heard of it */
  int blame;      /* zs__hb_blame */
  zs__hb_record* peers; /* every rank's record (hosts, pids), from start */
  /* zs__hb_on_lost's listener (lock) */
  void (*on_lost)(void* arg, int rank, const char* why);
  void* on_lost_arg;
};

static int zs__hb_cloexec_socket(void) {
  return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
}

zs_status zs__hb_listen(int rank, int world, double timeout_s,
                        zs__heartbeat** out, zs__hb_record* mine) {
  memset(mine, 0, sizeof *mine);
  *out = NULL;
  zs__heartbeat* hb = (zs__heartbeat*)calloc(1, sizeof *hb);
  if (hb == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "heartbeat");
  hb->rank = rank;
  hb->world = world;
  hb->watched = (rank + 1) % world;
  hb->watcher = (rank + world - 1) % world;
  hb->timeout_s = timeout_s;
  hb->interval_s = timeout_s / 5 < 1.0 ? timeout_s / 5 : 1.0;
  hb->listen_fd = hb->out_fd = hb->in_fd = hb->wake[0] = hb->wake[1] = -1;
  hb->lost = hb->left = -1;
  pthread_mutex_init(&hb->lock, NULL);
  *out = hb;
  gethostname(mine->host, sizeof mine->host - 1);
  mine->pid = (uint32_t)getpid();
  /* where the others reach this rank: ZS_HEARTBEAT_ADDR, else the host
   * name's first IPv4 address, else loopback (one host) */
  struct in_addr a;
  a.s_addr = htonl(INADDR_LOOPBACK);
  const char* env = getenv("ZS_HEARTBEAT_ADDR");
  if (env != NULL && *env != '\0') {
    if (inet_pton(AF_INET, env, &a) != 1)
      return zs__error(ZS_ERR_INVALID_ARGUMENT, "ZS_HEARTBEAT_ADDR='%s' is "
                       "not an IPv4 address", env);
  } else {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(mine->host, NULL, &hints, &res) == 0 && res != NULL) {
      a = ((struct sockaddr_in*)res->ai_addr)->sin_addr;
      freeaddrinfo(res);
    }
  }
  mine->addr = a.s_addr;
  hb->listen_fd = zs__hb_cloexec_socket();
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  if (hb->listen_fd < 0 || bind(hb->listen_fd, (struct sockaddr*)&sa, sizeof sa) != 0 ||
      listen(hb->listen_fd, 4) != 0 ||
      getsockname(hb->listen_fd, (struct sockaddr*)&sa, &len) != 0)
    return zs__error(ZS_ERR_COMM, "heartbeat: cannot listen on a TCP port: %s",
                     strerror(errno));
  mine->port = sa.sin_port;
  mine->ok = 1;
  return ZS_OK;
}

/* Waits until fd is ready for `events` or deadline (zs__now seconds);
 * 1 ready, 0 not. */
static int zs__hb_poll(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - zs__now();
    if (left <= 0) return 0;
    struct pollfd p = {fd, events, 0};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r > 0) return 1;
    if (r < 0 && errno != EINTR) return 0;
  }
}

/* Sends one line, never blocking (a watcher that stopped reading must not
 * stop this rank): a full buffer drops it. */
static void zs__hb_send(int fd, const char* line) {
  if (fd < 0) return;
  (void)send(fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void zs__hb_set_lost(zs__heartbeat* hb, int rank, const char* why) {
  int first = 0;
  void (*fn)(void*, int, const char*) = NULL;
  void* arg = NULL;
  pthread_mutex_lock(&hb->lock);
  if (hb->lost < 0) {
    snprintf(hb->lost_why, sizeof hb->lost_why, "%s", why);
    __atomic_store_n(&hb->lost, rank, __ATOMIC_RELEASE);
    first = 1;
    fn = hb->on_lost;
    arg = hb->on_lost_arg;
  }
  pthread_mutex_unlock(&hb->lock);
  if (fn != NULL) fn(arg, rank, why);
  /* down the ring, unless the next one down is the lost rank itself */
  if (first && hb->watcher != rank && hb->watcher != hb->rank) {
    char line[ZS__HB_LINE + 220];
    snprintf(line, sizeof line, "D %d %s\n", rank, why);
    zs__hb_send(hb->out_fd, line);
  }
}

/* What the watched rank was last heard doing, for the messages. */
static void zs__hb_peer_said(const zs__heartbeat* hb, char* buf, size_t cap,
                             double now) {
  if (hb->peer_doing[0] == '\0')
    snprintf(buf, cap, "nothing heard from it yet");
  else
    snprintf(buf, cap, "last heard %.1f s ago, when it was %s",
             now - hb->peer_last, hb->peer_doing);
}

/* A rank left: noted once, and passed down the ring. */
static void zs__hb_set_left(zs__heartbeat* hb, int rank, double now) {
  int first = 0;
  pthread_mutex_lock(&hb->lock);
  if (hb->left < 0) {
    hb->left = rank;
    hb->left_at = now;
    first = 1;
  }
  pthread_mutex_unlock(&hb->lock);
  if (first && hb->watcher != rank && hb->watcher != hb->rank) {
    char line[32];
    snprintf(line, sizeof line, "L %d\n", rank);
    zs__hb_send(hb->out_fd, line);
  }
}

static void zs__hb_line(zs__heartbeat* hb, char* line, double now) {
  if (line[0] == 'B') {
    hb->peer_last = now;
    snprintf(hb->peer_doing, sizeof hb->peer_doing, "%s",
             line[1] == ' ' ? line + 2 : "");
  } else if (line[0] == 'Q') {
    hb->peer_left = 1;
    zs__hb_set_left(hb, hb->watched, now);
  } else if (line[0] == 'L') {
    long r = strtol(line + 1, NULL, 10);
    if (r >= 0 && r < hb->world) zs__hb_set_left(hb, (int)r, now);
  } else if (line[0] == 'D') {
    char* rest = NULL;
    long r = strtol(line + 1, &rest, 10);
    if (rest != NULL && rest != line + 1 && r >= 0 && r < hb->world)
      zs__hb_set_lost(hb, (int)r, *rest == ' ' ? rest + 1 : rest);
  }
}

/* This rank's activity as a heartbeat line. */
static void zs__hb_beat(zs__heartbeat* hb, char* line, size_t cap, double now) {
  pthread_mutex_lock(&hb->lock);
  const double dt = hb->fn[0] != '\0' ? now - hb->since : 0.0;
  char unit[80] = "";
  if (hb->unit[0] != '\0') snprintf(unit, sizeof unit, " (unit '%s')", hb->unit);
  if (hb->fn[0] == '\0')
    snprintf(line, cap, "B in its own code (no ZeroShard call yet)\n");
  else if (hb->in_call && hb->waiting[0] != '\0')
    snprintf(line, cap, "B in %s%s for %.1f s, waiting in %s\n", hb->fn, unit,
             dt, hb->waiting);
  else if (hb->in_call)
    snprintf(line, cap, "B in %s%s for %.1f s\n", hb->fn, unit, dt);
  else
    snprintf(line, cap, "B in its own code for %.1f s since %s%s returned\n",
             dt, hb->fn, unit);
  pthread_mutex_unlock(&hb->lock);
}

static void* zs__hb_main(void* arg) {
  zs__heartbeat* hb = (zs__heartbeat*)arg;
  double next = 0.0;
  hb->peer_last = zs__now();
  for (;;) {
    double now = zs__now();
    if (now >= next) {
      char line[ZS__HB_LINE];
      zs__hb_beat(hb, line, sizeof line, now);
      zs__hb_send(hb->out_fd, line);
      next = now + hb->interval_s;
    }
    struct pollfd p[2] = {{hb->wake[0], POLLIN, 0},
                          {hb->peer_left ? -1 : hb->in_fd, POLLIN, 0}};
    int r = poll(p, 2, (int)((next - now) * 1000) + 1);
    if (r < 0 && errno != EINTR) break;
    if (p[0].revents != 0) break; /* destroy */
    now = zs__now();
    char said[ZS__HB_LINE + 40], why[ZS__HB_LINE + 160];
    if (p[1].revents != 0) {
      ssize_t n = recv(hb->in_fd, hb->inbuf + hb->inlen,
                       sizeof hb->inbuf - 1 - hb->inlen, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        if (!hb->peer_left && hb->lost < 0) {
          zs__hb_peer_said(hb, said, sizeof said, now);
          snprintf(why, sizeof why, "(host %s, pid %u) is gone: its "
                   "process ended (its heartbeat connection closed without a "
                   "goodbye; %s)", hb->peers[hb->watched].host,
                   hb->peers[hb->watched].pid, said);
          zs__hb_set_lost(hb, hb->watched, why);
        }
        hb->peer_left = 1; /* nothing more to read */
      } else if (n > 0) {
        hb->inlen += (size_t)n;
        hb->inbuf[hb->inlen] = '\0';
        char* start = hb->inbuf;
        for (char* nl; (nl = strchr(start, '\n')) != NULL; start = nl + 1) {
          *nl = '\0';
          zs__hb_line(hb, start, now);
        }
        hb->inlen -= (size_t)(start - hb->inbuf);
        memmove(hb->inbuf, start, hb->inlen);
        if (hb->inlen >= sizeof hb->inbuf - 1) hb->inlen = 0; /* garbage */
      }
    }
    if (!hb->peer_left && hb->lost < 0 && now - hb->peer_last > hb->timeout_s) {
      zs__hb_peer_said(hb, said, sizeof said, now);
      snprintf(why, sizeof why, "(host %s, pid %u) sent no heartbeat for "
               "%.0f s (heartbeat_timeout_s): it is stopped, or hung outside "
               "ZeroShard's calls (%s)", hb->peers[hb->watched].host,
               hb->peers[hb->watched].pid, now - hb->peer_last, said);
      zs__hb_set_lost(hb, hb->watched, why);
    }
  }
  return NULL;
}

/* connect() that gives up at deadline (a blocking one may wait minutes
 * for an address that drops packets). 0, or -1 with errno set. */
static int zs__hb_connect(int fd, const struct sockaddr_in* sa,
                          double deadline) {
  const int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return -1;
  int rc = connect(fd, (const struct sockaddr*)sa, sizeof *sa);
  if (rc != 0 && errno == EINPROGRESS) {
    if (!zs__hb_poll(fd, POLLOUT, deadline)) {
      errno = ETIMEDOUT;
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
    rc = err == 0 ? 0 : -1;
    if (err != 0) errno = err;
  }
  if (rc == 0 && fcntl(fd, F_SETFL, fl) != 0) return -1;
  return rc;
}

int zs__hb_blame(const zs__heartbeat* hb) { return hb != NULL ? hb->blame : 0; }

zs_status zs__hb_start(zs__heartbeat* hb, const zs__hb_record* all) {
  for (int r = 0; r < hb->world; r++)
    if (!all[r].ok)
      return zs__error(ZS_ERR_COMM, "heartbeat: rank %d (host %s) could not "
                       "listen", r, all[r].host);
  hb->peers = (zs__hb_record*)malloc((size_t)hb->world * sizeof *all);
  if (hb->peers == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "heartbeat");
  memcpy(hb->peers, all, (size_t)hb->world * sizeof *all);
  const double deadline = zs__now() + 60.0;
  hb->blame = 2; /* until this rank reached the rank before it */
  /* out: to the watcher (loopback when it is on this host) */
  const zs__hb_record* w = &all[hb->watcher];
  char me[64];
  memset(me, 0, sizeof me);
  gethostname(me, sizeof me - 1);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = w->port;
  sa.sin_addr.s_addr = strcmp(w->host, me) == 0 ? htonl(INADDR_LOOPBACK) : w->addr;
  hb->out_fd = zs__hb_cloexec_socket();
  if (hb->out_fd < 0)
    return zs__error(ZS_ERR_COMM, "heartbeat: socket: %s", strerror(errno));
  int one = 1;
  (void)setsockopt(hb->out_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int rc = -1;
  for (;;) {
    rc = zs__hb_connect(hb->out_fd, &sa, deadline);
    if (rc == 0 || (errno != ECONNREFUSED && errno != EINTR) ||
        zs__now() >= deadline)
      break;
    usleep(100000); /* refused: a fresh socket, once more */
    close(hb->out_fd);
    hb->out_fd = zs__hb_cloexec_socket();
    if (hb->out_fd < 0) break;
  }
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  if (rc != 0)
    return zs__error(ZS_ERR_COMM, "heartbeat: cannot connect to rank %d at "
                     "%s:%u (host %s): %s (set ZS_HEARTBEAT_ADDR to an "
                     "address the other hosts reach, or heartbeat_timeout_s "
                     "to 0)", hb->watcher, ip, ntohs(w->port), w->host,
                     strerror(errno));
  char hello[32];
  snprintf(hello, sizeof hello, "H %d\n", hb->rank);
  if (send(hb->out_fd, hello, strlen(hello), MSG_NOSIGNAL) < 0)
    return zs__error(ZS_ERR_COMM, "heartbeat: send to rank %d: %s",
                     hb->watcher, strerror(errno));
  hb->blame = 1; /* from here on: the rank after this one never came */
  /* in: from the watched rank (the port listens on every address: a
   * connection that does not say "H <watched rank>" at once is closed) */
  char got[32] = "";
  for (;;) {
    if (!zs__hb_poll(hb->listen_fd, POLLIN, deadline))
      return zs__error(ZS_ERR_COMM, "heartbeat: rank %d (host %s) did not "
                       "connect within 60 s%s%s%s", hb->watched,
                       all[hb->watched].host, got[0] ? " (a connection said '" : "",
                       got, got[0] ? "')" : "");
    hb->in_fd = accept4(hb->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (hb->in_fd < 0) continue;
    size_t n = 0;
    const double hello_by = zs__now() + 5.0 < deadline ? zs__now() + 5.0 : deadline;
    while (n < sizeof got - 1 && (n == 0 || got[n - 1] != '\n') &&
           zs__hb_poll(hb->in_fd, POLLIN, hello_by)) {
      ssize_t k = recv(hb->in_fd, got + n, 1, 0);
      if (k <= 0) break;
      n += (size_t)k;
    }
    got[n] = '\0';
    int from = -1;
    if (sscanf(got, "H %d", &from) == 1 && from == hb->watched) break;
    close(hb->in_fd);
    hb->in_fd = -1;
  }
  close(hb->listen_fd);
  hb->listen_fd = -1;
  if (pipe2(hb->wake, O_CLOEXEC) != 0)
    return zs__error(ZS_ERR_COMM, "heartbeat: pipe: %s", strerror(errno));
  if (pthread_create(&hb->thread, NULL, zs__hb_main, hb) != 0)
    return zs__error(ZS_ERR_COMM, "heartbeat: cannot start its thread");
  hb->thread_on = 1;
  hb->blame = 0;
  return ZS_OK;
}

void zs__hb_destroy(zs__heartbeat* hb) {
  if (hb == NULL) return;
  if (hb->thread_on) {
    (void)write(hb->wake[1], "x", 1);
    pthread_join(hb->thread, NULL);
  }
  zs__hb_send(hb->out_fd, "Q\n");
  int* fds[] = {&hb->listen_fd, &hb->out_fd, &hb->in_fd, &hb->wake[0],
                &hb->wake[1]};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
    if (*fds[i] >= 0) close(*fds[i]);
  pthread_mutex_destroy(&hb->lock);
  free(hb->peers);
  free(hb);
}

void zs__hb_on_lost(zs__heartbeat* hb,
                    void (*fn)(void* arg, int rank, const char* why),
                    void* arg) {
  if (hb == NULL) return;
  pthread_mutex_lock(&hb->lock);
  hb->on_lost = fn;
  hb->on_lost_arg = arg;
  const int r = hb->lost;
  char why[sizeof hb->lost_why];
  snprintf(why, sizeof why, "%s", hb->lost_why);
  pthread_mutex_unlock(&hb->lock);
  if (r >= 0 && fn != NULL) fn(arg, r, why); /* (lost already) */
}

int zs__hb_lost(zs__heartbeat* hb, int waiting, char* why, size_t cap) {
  if (hb == NULL) return -1;
  if (__atomic_load_n(&hb->lost, __ATOMIC_ACQUIRE) >= 0) {
    pthread_mutex_lock(&hb->lock);
    snprintf(why, cap, "%s", hb->lost_why);
    const int r = hb->lost;
    pthread_mutex_unlock(&hb->lock);
    return r;
  }
  int r = -1;
  if (!waiting) return -1;
  pthread_mutex_lock(&hb->lock);
  const double grace = ZS__HB_LEAVE_GRACE_S > 2 * hb->interval_s
                           ? ZS__HB_LEAVE_GRACE_S : 2 * hb->interval_s;
  const double ago = zs__now() - hb->left_at;
  if (hb->left >= 0 && ago > grace) {
    r = hb->left;
    snprintf(why, cap, "(host %s, pid %u) left the context "
             "(zs_context_destroy) %.0f s ago, so it joins no collective any "
             "more: the ranks' calls differ (one ended early)",
             hb->peers[r].host, hb->peers[r].pid, ago);
  }
  pthread_mutex_unlock(&hb->lock);
  return r;
}

void zs__hb_call(zs__heartbeat* hb, const char* fn, const char* unit) {
  if (hb == NULL) return;
  const double now = zs__now();
  pthread_mutex_lock(&hb->lock);
  snprintf(hb->fn, sizeof hb->fn, "%s", fn);
  snprintf(hb->unit, sizeof hb->unit, "%s", unit != NULL ? unit : "");
  hb->waiting[0] = '\0';
  hb->in_call = 1;
  hb->since = now;
  pthread_mutex_unlock(&hb->lock);
}

void zs__hb_wait(zs__heartbeat* hb, const char* what) {
  if (hb == NULL) return;
  pthread_mutex_lock(&hb->lock);
  snprintf(hb->waiting, sizeof hb->waiting, "%s", what != NULL ? what : "");
  pthread_mutex_unlock(&hb->lock);
}

void zs__hb_return(zs__heartbeat* hb) {
  if (hb == NULL) return;
  const double now = zs__now();
  pthread_mutex_lock(&hb->lock);
  hb->in_call = 0;
  hb->waiting[0] = '\0';
  hb->since = now;
  pthread_mutex_unlock(&hb->lock);
}
