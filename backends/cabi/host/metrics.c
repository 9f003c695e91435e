/* Custom metrics (TRITONSERVER_MetricFamily, TRITONSERVER_Metric): counters and gauges
 * kept by the bridge's metric objects, served on the Prometheus endpoint. */
#include "host.h"

#include <string.h>

/* ------------------------------------------------------------------ custom metrics */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily** family,
                                                             const TRITONSERVER_MetricKind kind,
                                                             const char* name,
                                                             const char* description) {
  HOST_NOT_NULL(family, "family");
  HOST_NOT_NULL(name, "name");
  if (kind != TRITONSERVER_METRIC_KIND_COUNTER && kind != TRITONSERVER_METRIC_KIND_GAUGE)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONSERVER_MetricFamilyNew: metric family '%s': only counters and "
                      "gauges are supported",
                      name);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* py = PyObject_CallFunction(host_bridge.metric_family, "iss", (int)kind, name,
                                       description ? description : "");
  TRITONSERVER_Error* error = NULL;
  if (py == NULL) {
    error = host_python_error("TRITONSERVER_MetricFamilyNew");
  } else {
    TRITONSERVER_MetricFamily* made = malloc(sizeof(*made));
    made->kind = kind;
    made->py = py;
    *family = made;
  }
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily* family) {
  if (family == NULL) return NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(family->py);
  PyGILState_Release(gil);
  free(family);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_GetMetricFamilyKind(TRITONSERVER_MetricFamily* family,
                                                                 TRITONSERVER_MetricKind* kind) {
  HOST_NOT_NULL(family, "family");
  *kind = family->kind;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricArgsNew(TRITONSERVER_MetricArgs** args) {
  HOST_NOT_NULL(args, "args");
  *args = calloc(1, sizeof(**args));
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricArgsSetHistogram(TRITONSERVER_MetricArgs* args,
                                                                    const double* buckets,
                                                                    const uint64_t buckets_count) {
  (void)args;
  (void)buckets;
  (void)buckets_count;
  return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "TRITONSERVER_MetricArgsSetHistogram: histogram metrics are not supported");
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricArgsDelete(TRITONSERVER_MetricArgs* args) {
  free(args);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricNew(TRITONSERVER_Metric** metric,
                                                       TRITONSERVER_MetricFamily* family,
                                                       const TRITONSERVER_Parameter** labels,
                                                       const uint64_t label_count) {
  HOST_NOT_NULL(metric, "metric");
  HOST_NOT_NULL(family, "family");
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* error = NULL;
  PyObject* dict = PyDict_New();
  for (uint64_t i = 0; i < label_count && dict != NULL; i++) {
    const TRITONSERVER_Parameter* label = labels[i];
    if (label == NULL || label->type != TRITONSERVER_PARAMETER_STRING) {
      error = host_error(TRITONSERVER_ERROR_INVALID_ARG,
                         "TRITONSERVER_MetricNew: label %llu is not a string parameter",
                         (unsigned long long)i);
      break;
    }
    PyObject* value = PyUnicode_FromString(label->string_value);
    if (value == NULL || PyDict_SetItemString(dict, label->name, value) < 0) {
      Py_XDECREF(value);
      error = host_python_error("TRITONSERVER_MetricNew");
      break;
    }
    Py_DECREF(value);
  }
  if (error == NULL) {
    PyObject* py = PyObject_CallFunctionObjArgs(host_bridge.metric, family->py, dict, NULL);
    if (py == NULL) {
      error = host_python_error("TRITONSERVER_MetricNew");
    } else {
      TRITONSERVER_Metric* made = calloc(1, sizeof(*made));
      made->family = family;
      made->py = py;
      pthread_mutex_init(&made->lock, NULL);
      *metric = made;
    }
  }
  Py_XDECREF(dict);
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricNewWithArgs(
    TRITONSERVER_Metric** metric, TRITONSERVER_MetricFamily* family,
    const TRITONSERVER_Parameter** labels, const uint64_t label_count,
    const TRITONSERVER_MetricArgs* args) {
  if (args != NULL && args->histogram)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONSERVER_MetricNewWithArgs: histogram metrics are not supported");
  return TRITONSERVER_MetricNew(metric, family, labels, label_count);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricDelete(TRITONSERVER_Metric* metric) {
  if (metric == NULL) return NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(metric->py);
  PyGILState_Release(gil);
  pthread_mutex_destroy(&metric->lock);
  free(metric);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricValue(TRITONSERVER_Metric* metric,
                                                         double* value) {
  HOST_NOT_NULL(metric, "metric");
  HOST_NOT_NULL(value, "value");
  pthread_mutex_lock(&metric->lock);
  *value = metric->value;
  pthread_mutex_unlock(&metric->lock);
  return NULL;
}

static TRITONSERVER_Error* metric_op(TRITONSERVER_Metric* metric, const char* op, double value,
                                     const char* where) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(host_bridge.metric_op, "Osd", metric->py, op, value);
  TRITONSERVER_Error* error = host_checked(result, where);
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricIncrement(TRITONSERVER_Metric* metric,
                                                             double value) {
  HOST_NOT_NULL(metric, "metric");
  if (metric->family->kind == TRITONSERVER_METRIC_KIND_COUNTER && value < 0)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "TRITONSERVER_MetricIncrement: a counter cannot decrease");
  TRITONSERVER_Error* error = NULL;
  if (host_deferred != NULL)
    host_defer_increment(host_deferred, metric, value);
  else
    error = metric_op(metric, "inc", value, "TRITONSERVER_MetricIncrement");
  if (error == NULL) {
    pthread_mutex_lock(&metric->lock);
    metric->value += value;
    pthread_mutex_unlock(&metric->lock);
  }
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricSet(TRITONSERVER_Metric* metric, double value) {
  HOST_NOT_NULL(metric, "metric");
  TRITONSERVER_Error* error = metric_op(metric, "set", value, "TRITONSERVER_MetricSet");
  if (error == NULL) {
    pthread_mutex_lock(&metric->lock);
    metric->value = value;
    pthread_mutex_unlock(&metric->lock);
  }
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricObserve(TRITONSERVER_Metric* metric,
                                                           double value) {
  (void)metric;
  (void)value;
  return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "TRITONSERVER_MetricObserve: histogram metrics are not supported");
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_GetMetricKind(TRITONSERVER_Metric* metric,
                                                           TRITONSERVER_MetricKind* kind) {
  HOST_NOT_NULL(metric, "metric");
  *kind = metric->family->kind;
  return NULL;
}
