/* Statistics a backend reports: per request, per batch, per response. */
#include "host.h"

#include <string.h>

/* ------------------------------------------------------------------ statistics */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, const bool success,
    const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns,
    const uint64_t exec_end_ns) {
  HOST_NOT_NULL(instance, "instance");
  HOST_NOT_NULL(request, "request");
  if (host_deferred == &instance->deferred) {
    const uint64_t t[4] = {exec_start_ns, compute_start_ns, compute_end_ns, exec_end_ns};
    host_defer_statistics(host_deferred, request, success, t);
    return NULL;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(
      host_bridge.statistics, "OOiKKKK", instance->owner, request->py, (int)success,
      (unsigned long long)exec_start_ns, (unsigned long long)compute_start_ns,
      (unsigned long long)compute_end_ns, (unsigned long long)exec_end_ns);
  TRITONSERVER_Error* error = host_checked(result, "TRITONBACKEND_ModelInstanceReportStatistics");
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance* instance, const uint64_t batch_size, const uint64_t exec_start_ns,
    const uint64_t compute_start_ns, const uint64_t compute_end_ns, const uint64_t exec_end_ns) {
  HOST_NOT_NULL(instance, "instance");
  if (host_deferred == &instance->deferred) {
    const uint64_t t[4] = {exec_start_ns, compute_start_ns, compute_end_ns, exec_end_ns};
    host_defer_batch(host_deferred, batch_size, t);
    return NULL;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(
      host_bridge.batch, "OKKKKK", instance->owner, (unsigned long long)batch_size,
      (unsigned long long)exec_start_ns, (unsigned long long)compute_start_ns,
      (unsigned long long)compute_end_ns, (unsigned long long)exec_end_ns);
  TRITONSERVER_Error* error =
      host_checked(result, "TRITONBACKEND_ModelInstanceReportBatchStatistics");
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsNew(
    TRITONBACKEND_ModelInstanceResponseStatistics** response_statistics) {
  HOST_NOT_NULL(response_statistics, "response_statistics");
  *response_statistics = calloc(1, sizeof(**response_statistics));
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsDelete(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics) {
  free(response_statistics);
  return NULL;
}

#define RESPONSE_STATISTIC(SET, FIELD, TYPE)                                             \
  HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatistics##SET(    \
      TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, TYPE value) {  \
    HOST_NOT_NULL(response_statistics, "response_statistics");                           \
    response_statistics->FIELD = value;                                                  \
    return NULL;                                                                         \
  }

RESPONSE_STATISTIC(SetModelInstance, instance, TRITONBACKEND_ModelInstance*)
RESPONSE_STATISTIC(SetResponseFactory, factory, TRITONBACKEND_ResponseFactory*)
RESPONSE_STATISTIC(SetResponseStart, response_start, uint64_t)
RESPONSE_STATISTIC(SetComputeOutputStart, compute_output_start, uint64_t)
RESPONSE_STATISTIC(SetResponseEnd, response_end, uint64_t)
RESPONSE_STATISTIC(SetError, error, TRITONSERVER_Error*)

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportResponseStatistics(
    TRITONBACKEND_ModelInstanceResponseStatistics* s) {
  HOST_NOT_NULL(s, "response_statistics");
  HOST_NOT_NULL(s->instance, "its model instance");
  HOST_NOT_NULL(s->factory, "its response factory");
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(
      host_bridge.response_statistics, "OOKKKi", s->instance->owner, s->factory->request->py,
      (unsigned long long)s->response_start, (unsigned long long)s->compute_output_start,
      (unsigned long long)s->response_end, s->error == NULL);
  TRITONSERVER_Error* error =
      host_checked(result, "TRITONBACKEND_ModelInstanceReportResponseStatistics");
  PyGILState_Release(gil);
  return error;
}
