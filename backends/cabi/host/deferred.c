/* What the thread running TRITONBACKEND_ModelInstanceExecute reports, kept until the
 * execute returns: statistics, batch statistics, metric increments, and the requests whose
 * last holder let go.  The host then hands them to Python in one call, under the GIL it
 * takes back anyway, instead of taking the GIL once per report.  Any other thread (a
 * backend's own) reports at once. */
#include "host.h"

#include <string.h>

_Thread_local Deferred* host_deferred;

#define GROW(ARRAY, COUNT, CAPACITY)                                          \
  do {                                                                        \
    if ((COUNT) == (CAPACITY)) {                                              \
      (CAPACITY) = (CAPACITY) ? 2 * (CAPACITY) : 16;                          \
      (ARRAY) = realloc((ARRAY), (CAPACITY) * sizeof(*(ARRAY)));              \
    }                                                                         \
  } while (0)

void host_defer_statistics(Deferred* d, HostRequest* request, bool success, const uint64_t t[4]) {
  GROW(d->stats, d->stat_count, d->stat_capacity);
  DeferredStatistics* s = &d->stats[d->stat_count++];
  s->request = request;
  s->success = success;
  memcpy(s->t, t, sizeof(s->t)); /* the request lives until the drain: Python holds it */
}

void host_defer_batch(Deferred* d, uint64_t size, const uint64_t t[4]) {
  GROW(d->batches, d->batch_count, d->batch_capacity);
  DeferredBatch* b = &d->batches[d->batch_count++];
  b->size = size;
  memcpy(b->t, t, sizeof(b->t));
}

void host_defer_increment(Deferred* d, TRITONSERVER_Metric* metric, double value) {
  for (size_t k = 0; k < d->metric_count; k++)
    if (d->metrics[k].metric == metric) {
      d->metrics[k].amount += value;
      return;
    }
  GROW(d->metrics, d->metric_count, d->metric_capacity);
  d->metrics[d->metric_count].metric = metric;
  d->metrics[d->metric_count++].amount = value;
}

void host_defer_gone(Deferred* d, HostRequest* request) {
  GROW(d->gone, d->gone_count, d->gone_capacity);
  d->gone[d->gone_count++] = request;
}

/* Hand what was kept to the bridge (GIL held).  Returns 0, or -1 with a Python error set. */
int host_drain(Deferred* d, PyObject* owner) {
  int status = 0;
  if (d->stat_count || d->batch_count || d->metric_count) {
    PyObject* stats = PyList_New(d->stat_count);
    PyObject* batches = PyList_New(d->batch_count);
    PyObject* metrics = PyList_New(d->metric_count);
    for (size_t k = 0; stats && k < d->stat_count; k++) {
      DeferredStatistics* s = &d->stats[k];
      PyList_SET_ITEM(stats, k,
                      Py_BuildValue("(OiKKKK)", s->request->py, (int)s->success,
                                    (unsigned long long)s->t[0], (unsigned long long)s->t[1],
                                    (unsigned long long)s->t[2], (unsigned long long)s->t[3]));
    }
    for (size_t k = 0; batches && k < d->batch_count; k++) {
      DeferredBatch* b = &d->batches[k];
      PyList_SET_ITEM(batches, k,
                      Py_BuildValue("(KKKKK)", (unsigned long long)b->size,
                                    (unsigned long long)b->t[0], (unsigned long long)b->t[1],
                                    (unsigned long long)b->t[2], (unsigned long long)b->t[3]));
    }
    for (size_t k = 0; metrics && k < d->metric_count; k++)
      PyList_SET_ITEM(metrics, k,
                      Py_BuildValue("(Od)", d->metrics[k].metric->py, d->metrics[k].amount));
    PyObject* result =
        stats && batches && metrics
            ? PyObject_CallFunctionObjArgs(host_bridge.drain, owner, stats, batches, metrics, NULL)
            : NULL;
    if (result == NULL) status = -1;
    Py_XDECREF(result);
    Py_XDECREF(stats);
    Py_XDECREF(batches);
    Py_XDECREF(metrics);
  }
  d->stat_count = d->batch_count = d->metric_count = 0;
  for (size_t k = 0; k < d->gone_count; k++) Py_DECREF((PyObject*)d->gone[k]);
  d->gone_count = 0;
  return status;
}

void host_deferred_free(Deferred* d) {
  free(d->stats);
  free(d->batches);
  free(d->metrics);
  free(d->gone);
  memset(d, 0, sizeof(*d));
}
