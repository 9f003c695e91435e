/* What the thread running TRITONBACKEND_ModelInstanceExecute reports, kept until the
 * execute returns: statistics, batch statistics, metric increments, and the requests whose
 * last holder let go.  The host then hands them to the instance's Python level under the
 * GIL it takes back anyway, instead of taking the GIL once per report.  Any other thread (a
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

/* a method call with ``count`` new references as arguments after the object; 0 or -1 */
static int call_method(PyObject* name, PyObject* self, PyObject** args, size_t count) {
  int made = 1;
  for (size_t k = 1; k <= count; k++) made = made && args[k] != NULL;
  args[0] = self;
  PyObject* result = made ? PyObject_VectorcallMethod(name, args, count + 1, NULL) : NULL;
  for (size_t k = 1; k <= count; k++) Py_XDECREF(args[k]);
  Py_XDECREF(result);
  return result == NULL ? -1 : 0;
}

/* Hand what was kept to the instance's Python level (GIL held): each report as the
 * ModelInstance methods a Python backend calls.  0, or -1 with a Python error set. */
int host_drain(Deferred* d, PyObject* owner) {
  static PyObject *report_statistics, *report_batch_statistics, *increment;
  if (report_statistics == NULL) {
    report_statistics = PyUnicode_InternFromString("report_statistics");
    report_batch_statistics = PyUnicode_InternFromString("report_batch_statistics");
    increment = PyUnicode_InternFromString("increment");
  }
  int status = 0;
  for (size_t k = 0; status == 0 && k < d->stat_count; k++) {
    DeferredStatistics* s = &d->stats[k];
    Py_INCREF(s->request->py);
    PyObject* args[7] = {NULL, s->request->py, PyBool_FromLong(s->success),
                         PyLong_FromUnsignedLongLong(s->t[0]), PyLong_FromUnsignedLongLong(s->t[1]),
                         PyLong_FromUnsignedLongLong(s->t[2]), PyLong_FromUnsignedLongLong(s->t[3])};
    status = call_method(report_statistics, owner, args, 6);
  }
  for (size_t k = 0; status == 0 && k < d->batch_count; k++) {
    DeferredBatch* b = &d->batches[k];
    PyObject* args[6] = {NULL, PyLong_FromUnsignedLongLong(b->size),
                         PyLong_FromUnsignedLongLong(b->t[0]), PyLong_FromUnsignedLongLong(b->t[1]),
                         PyLong_FromUnsignedLongLong(b->t[2]), PyLong_FromUnsignedLongLong(b->t[3])};
    status = call_method(report_batch_statistics, owner, args, 5);
  }
  for (size_t k = 0; status == 0 && k < d->metric_count; k++) {
    PyObject* args[2] = {NULL, PyFloat_FromDouble(d->metrics[k].amount)};
    status = call_method(increment, d->metrics[k].metric->py, args, 1);
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
