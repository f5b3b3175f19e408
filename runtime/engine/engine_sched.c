/*
 * engine_sched.c — stage-3 prefetch along the order of gathers recorded in
 * a step (the trace): which units to all-gather ahead of their use, when a
 * step departs from the trace, and the trace's end of step. Every decision
 * depends only on the trace, on sizes and on the order of calls, never on
 * timing, so every rank issues the same collectives.
 *
 * Only steady units are prefetched: those gathered in each of the last
 * ZS__PREFETCH_STEADY completed steps (fewer while fewer steps have run, so
 * the second step prefetches as before). A unit that is not steady (a
 * branch taken on some steps) is skipped in the trace: not prefetched, and
 * its gather, or its absence, is no departure; it is gathered on use. So a
 * model whose path changes from step to step pays for a wrong guess once,
 * and a model with a stable order behaves as it always did. The trace is
 * the last step's order (recorded at every step's end).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_sched.h"
#include "runtime/engine/engine_unit.h"

/* Steps a unit must have been gathered in, in a row, to be prefetched. */
#define ZS__PREFETCH_STEADY 2

static int zs__steady(const zs_model* m, int unit) {
  /* a unit some ranks may not use is gathered at its use only */
  if (m->units[unit].allow_unused) return 0;
  const int need = m->trace_steps < ZS__PREFETCH_STEADY ? m->trace_steps
                                                        : ZS__PREFETCH_STEADY;
  return m->units[unit].streak >= need;
}

/* Size in elements a prefetch of `unit` would add (itself and the owners
 * of its ties that are not gathered). */
size_t zs__prefetch_cost(const zs_model* m, int unit) {
  const zs__unit* u = &m->units[unit];
  size_t cost = u->gather_refs == 0 ? u->layout.padded : 0;
  for (int k = 0; k < u->nowners; k++)
    if (m->units[u->owners[k]].gather_refs == 0)
      cost += m->units[u->owners[k]].layout.padded;
  return cost;
}

/* All-gathers a prefetch of `unit` would start (itself and the owners of
 * its ties that are not gathered), each counting against prefetch_depth. */
int zs__prefetch_count(const zs_model* m, int unit) {
  const zs__unit* u = &m->units[unit];
  int n = u->gather_refs == 0;
  for (int k = 0; k < u->nowners; k++) n += m->units[u->owners[k]].gather_refs == 0;
  return n;
}

zs_status zs__prefetch_one(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  zs_status st = zs__hold(m, unit);
  if (st != ZS_OK) return st;
  u->prefetch_hold = 1;
  m->prefetches++;
  m->prefetch_gathers++;
  /* Owners of its ties come along, each as its own prefetch. */
  for (int k = 0; k < u->nowners && st == ZS_OK; k++) {
    zs__unit* o = &m->units[u->owners[k]];
    if (o->gather_refs > 0) continue;
    st = zs__hold(m, u->owners[k]);
    if (st == ZS_OK) {
      o->prefetch_hold = 1;
      m->prefetches++;
      m->prefetch_gathers++;
    }
  }
  return st;
}

/* Parameter shards on NVMe: reads the shards of the next units of the
 * trace that are not gathered into free buffers, ahead of their
 * all-gathers (ZeRO-Infinity's read-ahead). Each buffer a read-ahead takes
 * stays until its unit is used, so this stops at the first unit that
 * finds none. */
static void zs__param_trace_read_ahead(zs_model* m) {
  if (m->nvme_params == NULL) return;
  for (int j = m->trace_pos; j < m->trace_len; j++) {
    const int v = m->trace[j];
    if (m->units[v].gather_refs > 0) continue;
    if (!zs__param_read_ahead(m, v)) break;
  }
}

/* Issues all-gathers for the next units of the trace that are not
 * gathered, while fewer than prefetch_depth prefetches are unused and the
 * live-elements limit allows; then reads ahead (above). Units that are
 * not steady may be gathered on use while the prefetched ones are held, in
 * or out of the trace: the limit keeps room for them (zs__live_room). */
zs_status zs__prefetch_issue(zs_model* m) {
  const int depth = m->ctx->config.prefetch_depth;
  if (!m->gathers || !m->trace_valid || !m->trace_ok)
    return ZS_OK;
  for (int j = m->trace_pos; j < m->trace_len && m->prefetches < depth; j++) {
    const int v = m->trace[j];
    if (m->units[v].gather_refs > 0 || !zs__steady(m, v)) continue;
    const size_t cost = zs__prefetch_cost(m, v);
    if (m->max_live_elems > 0 &&
        m->live_elems + zs__live_room(m) + cost > m->max_live_elems)
      break;
    /* never more than `depth` prefetched all-gathers, ties included */
    if (m->prefetches + zs__prefetch_count(m, v) > depth) break;
    zs_status st = zs__prefetch_one(m, v);
    if (st != ZS_OK) return st;
  }
  zs__param_trace_read_ahead(m);
  return ZS_OK;
}

zs_status zs__prefetch_drain(zs_model* m) {
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (u->prefetch_hold) {
      u->prefetch_hold = 0;
      m->prefetches--;
      zs__drop(m, i);
    }
    if (u->forward_hold) {
      u->forward_hold = 0;
      zs__drop(m, i);
    }
  }
  return ZS_OK;
}

static zs_status zs__grow_ints(int** arr, int* cap, int need) {
  if (need <= *cap) return ZS_OK;
  int ncap = *cap == 0 ? 64 : 2 * *cap;
  while (ncap < need) ncap *= 2;
  int* p = (int*)realloc(*arr, (size_t)ncap * sizeof(int));
  if (p == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "gather trace");
  *arr = p;
  *cap = ncap;
  return ZS_OK;
}

void zs__trace_end_step(zs_model* m) {
  /* This step's order becomes the trace, and each unit's streak of steps
   * that gathered it goes on or ends. */
  if (zs__grow_ints(&m->trace, &m->trace_cap, m->seen_len) == ZS_OK) {
    if (m->seen_len > 0)
      memcpy(m->trace, m->seen, (size_t)m->seen_len * sizeof(int));
    m->trace_len = m->seen_len;
    m->trace_valid = m->seen_len > 0;
  }
  if (m->seen_len > 0) {
    for (int i = 0; i < m->nunits; i++) {
      zs__unit* u = &m->units[i];
      u->streak = u->seen_this_step ? (u->streak < (1 << 20) ? u->streak + 1
                                                              : u->streak)
                                    : 0;
    }
    if (m->trace_steps < ZS__PREFETCH_STEADY) m->trace_steps++;
    /* Room the live limit keeps for units gathered on use: the largest
     * total of units that were not steady held at once in one of the last
     * ZS__RESERVE_WINDOW steps (a branch taken on some steps, a nested
     * branch). Without this room such a branch, gathered beside a
     * prefetched unit, put the gathered peak up to 1.7x over the limit
     * (or, with zs__live_make_room, freed a prefetched unit to gather it
     * again each time it came). A rarer branch finds the room made when
     * it comes (zs__live_make_room). */
    m->unsteady_peaks[m->steps_traced % ZS__RESERVE_WINDOW] = m->unsteady_step_peak;
    m->steps_traced++;
    m->unsteady_step_peak = m->unsteady_live;
    m->unsteady_elems = 0;
    for (int k = 0; k < ZS__RESERVE_WINDOW; k++)
      if (m->unsteady_peaks[k] > m->unsteady_elems)
        m->unsteady_elems = m->unsteady_peaks[k];
  }
  for (int i = 0; i < m->nunits; i++) m->units[i].seen_this_step = 0;
  m->seen_len = 0;
  m->trace_pos = 0;
  m->trace_ok = 1;
}

void zs__trace_drop_step(zs_model* m) {
  for (int i = 0; i < m->nunits; i++) m->units[i].seen_this_step = 0;
  m->seen_len = 0;
  m->trace_pos = 0;
  m->trace_ok = 1;
}

/* Whether `owner` owns one of `unit`'s tied tensors. */
static int zs__is_owner(const zs_model* m, int unit, int owner) {
  for (int k = 0; k < m->units[unit].nowners; k++)
    if (m->units[unit].owners[k] == owner) return 1;
  return 0;
}

void zs__unsteady_note(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (!u->policy.gather_on_use || u->allow_unused || u->unsteady_held > 0 ||
      zs__steady(m, unit))
    return;
  u->unsteady_held = u->layout.padded;
  m->unsteady_live += u->unsteady_held;
  if (m->unsteady_live > m->unsteady_step_peak)
    m->unsteady_step_peak = m->unsteady_live;
}

/* Elements the live limit keeps free for units gathered on use: the room
 * (unsteady_elems) less what such units hold now. */
size_t zs__live_room(const zs_model* m) {
  return m->unsteady_elems > m->unsteady_live
             ? m->unsteady_elems - m->unsteady_live
             : 0;
}

/* Frees the prefetches not yet used (their holds go), but those of `keep`
 * and of its tie owners; keep -1: all. */
static void zs__prefetches_free(zs_model* m, int keep) {
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->prefetch_hold || (keep >= 0 && (i == keep || zs__is_owner(m, keep, i))))
      continue;
    u->prefetch_hold = 0;
    m->prefetches--;
    zs__drop(m, i);
  }
}

void zs__live_make_room(zs_model* m, int unit) {
  if (m->max_live_elems == 0 || m->prefetches == 0 || m->units[unit].allow_unused)
    return;
  if (m->live_elems + zs__prefetch_cost(m, unit) <= m->max_live_elems) return;
  zs__log(ZS_LOG_INFO,
          "gather of unit '%s' would take the gathered parameters over "
          "max_live_elements (%zu): the units prefetched and not yet used "
          "are freed (gathered again when used)", m->units[unit].name,
          m->max_live_elems);
  zs__prefetches_free(m, unit);
}

/* Follows the trace with the user's gather of `unit`; a gather out of
 * order ends prefetching for this step (unused prefetches are dropped). */
zs_status zs__trace_follow(zs_model* m, int unit) {
  zs_status st = zs__grow_ints(&m->seen, &m->seen_cap, m->seen_len + 1);
  if (st != ZS_OK) return st;
  m->seen[m->seen_len++] = unit;
  m->units[unit].seen_this_step = 1;
  if (!m->trace_valid || !m->trace_ok) return ZS_OK;
  /* an unsteady unit is gathered on use, wherever it comes */
  if (!zs__steady(m, unit)) return ZS_OK;
  /* unsteady units of the trace are passed over: they may not come */
  while (m->trace_pos < m->trace_len && !zs__steady(m, m->trace[m->trace_pos]))
    m->trace_pos++;
  if (m->trace_pos < m->trace_len && m->trace[m->trace_pos] == unit) {
    m->trace_pos++;
    return ZS_OK;
  }
  zs__log(ZS_LOG_INFO,
          "gather of unit '%s' departs from the recorded order at position "
          "%d: prefetch stops for this step and the order is recorded again",
          m->units[unit].name, m->trace_pos);
  m->trace_ok = 0;
  zs__prefetches_free(m, -1);
  return ZS_OK;
}
