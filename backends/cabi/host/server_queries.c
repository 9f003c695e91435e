/* What a backend asks of the server (TRITONSERVER_Server*): whether a model is ready, its
 * config, metadata and properties.  The worker asks the broker (the bridge's query:
 * backends/cabi/server_calls.py), which answers as Triton would, on the worker's channel. */
#include <string.h>

#include "host.h"

/* {"ready", "decoupled", "max_batch_size", "version", "config", "metadata"} of a served
 * model, or Triton's error for one that is not (GIL not held) */
TRITONSERVER_Error* host_query_model(const char* model_name, int64_t model_version,
                                     PyObject** facts) {
  if (host_bridge.query == NULL)
    return host_error(TRITONSERVER_ERROR_UNAVAILABLE, "the server cannot be asked: no backend is loaded");
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result =
      PyObject_CallFunction(host_bridge.query, "sL", model_name, (long long)model_version);
  TRITONSERVER_Error* error = NULL;
  if (result == NULL) error = host_python_error("TRITONSERVER_Server");
  else if (!PyDict_Check(result)) {
    Py_DECREF(result);
    error = host_error(TRITONSERVER_ERROR_INTERNAL, "the server's answer is not a dict");
  } else {
    *facts = result;
  }
  PyGILState_Release(gil);
  return error;
}

/* one fact of a served model: a new reference, NULL with an error set */
static TRITONSERVER_Error* fact(const char* model_name, int64_t model_version, const char* key,
                                PyObject** value) {
  PyObject* facts = NULL;
  TRITONSERVER_Error* error = host_query_model(model_name, model_version, &facts);
  if (error != NULL) return error;
  PyGILState_STATE gil = PyGILState_Ensure();
  *value = PyDict_GetItemString(facts, key);
  Py_XINCREF(*value);
  Py_DECREF(facts);
  if (*value == NULL)
    error = host_error(TRITONSERVER_ERROR_INTERNAL, "the server's answer has no '%s'", key);
  PyGILState_Release(gil);
  return error;
}

static TRITONSERVER_Error* fact_flag(const char* name, int64_t version, const char* key,
                                     bool* value) {
  PyObject* obj = NULL;
  TRITONSERVER_Error* error = fact(name, version, key, &obj);
  if (error != NULL) return error;
  PyGILState_STATE gil = PyGILState_Ensure();
  *value = PyObject_IsTrue(obj) == 1;
  Py_DECREF(obj);
  PyGILState_Release(gil);
  return NULL;
}

static TRITONSERVER_Error* fact_message(const char* name, int64_t version, const char* key,
                                        TRITONSERVER_Message** message) {
  PyObject* obj = NULL;
  TRITONSERVER_Error* error = fact(name, version, key, &obj);
  if (error != NULL) return error;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_ssize_t size = 0;
  const char* json = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &size) : NULL;
  if (json == NULL) {
    PyErr_Clear();
    error = host_error(TRITONSERVER_ERROR_INTERNAL, "the server's '%s' is not JSON text", key);
  } else {
    error = TRITONSERVER_MessageNewFromSerializedJson(message, json, (size_t)size);
  }
  Py_DECREF(obj);
  PyGILState_Release(gil);
  return error;
}

#define SERVER(s) HOST_NOT_NULL(s, "server")

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerIsLive(TRITONSERVER_Server* server,
                                                          bool* live) {
  SERVER(server);
  *live = true; /* a backend runs: its worker's broker serves */
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerIsReady(TRITONSERVER_Server* server,
                                                           bool* ready) {
  SERVER(server);
  *ready = true;
  return NULL;
}

/* ready: false for a model that is not served or not ready, as Triton */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelIsReady(TRITONSERVER_Server* server,
                                                                const char* model_name,
                                                                const int64_t model_version,
                                                                bool* ready) {
  SERVER(server);
  HOST_NOT_NULL(model_name, "model_name");
  HOST_NOT_NULL(ready, "ready");
  TRITONSERVER_Error* error = fact_flag(model_name, model_version, "ready", ready);
  if (error != NULL && (error->code == TRITONSERVER_ERROR_NOT_FOUND ||
                        error->code == TRITONSERVER_ERROR_UNAVAILABLE)) {
    TRITONSERVER_ErrorDelete(error);
    *ready = false;
    return NULL;
  }
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelBatchProperties(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    uint32_t* flags, void** voidp) {
  SERVER(server);
  HOST_NOT_NULL(model_name, "model_name");
  PyObject* obj = NULL;
  TRITONSERVER_Error* error = fact(model_name, model_version, "max_batch_size", &obj);
  if (error != NULL) return error;
  PyGILState_STATE gil = PyGILState_Ensure();
  long long max_batch_size = PyLong_AsLongLong(obj);
  if (PyErr_Occurred()) PyErr_Clear();
  Py_DECREF(obj);
  PyGILState_Release(gil);
  if (flags != NULL)
    *flags = max_batch_size > 0 ? TRITONSERVER_BATCH_FIRST_DIM : TRITONSERVER_BATCH_UNKNOWN;
  if (voidp != NULL) *voidp = NULL;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelTransactionProperties(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    uint32_t* txn_flags, void** voidp) {
  SERVER(server);
  HOST_NOT_NULL(model_name, "model_name");
  bool decoupled = false;
  TRITONSERVER_Error* error = fact_flag(model_name, model_version, "decoupled", &decoupled);
  if (error != NULL) return error;
  if (txn_flags != NULL) *txn_flags = decoupled ? TRITONSERVER_TXN_DECOUPLED : TRITONSERVER_TXN_ONE_TO_ONE;
  if (voidp != NULL) *voidp = NULL;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelMetadata(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    TRITONSERVER_Message** model_metadata) {
  SERVER(server);
  HOST_NOT_NULL(model_name, "model_name");
  HOST_NOT_NULL(model_metadata, "model_metadata");
  return fact_message(model_name, model_version, "metadata", model_metadata);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelConfig(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    const uint32_t config_version, TRITONSERVER_Message** model_config) {
  SERVER(server);
  HOST_NOT_NULL(model_name, "model_name");
  HOST_NOT_NULL(model_config, "model_config");
  if (config_version != 1)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "model configuration version %u not supported, supported versions are: 1",
                      config_version);
  return fact_message(model_name, model_version, "config", model_config);
}
