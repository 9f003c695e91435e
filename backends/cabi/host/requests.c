/* Requests as a C backend reads them: the Python type whose object is a
 * TRITONBACKEND_Request, read from an inferpool request once, and its accessors. */
#include "host.h"

#include <string.h>

/* ================================================================== requests (Python type) */
static int set_parameter(TRITONSERVER_Parameter* p, PyObject* key, PyObject* value) {
  p->name = (char*)PyBytes_AsString(key);
  if (p->name == NULL) return -1;
  if (PyBool_Check(value)) {
    p->type = TRITONSERVER_PARAMETER_BOOL;
    p->bool_value = value == Py_True;
  } else if (PyLong_Check(value)) {
    p->type = TRITONSERVER_PARAMETER_INT;
    p->int_value = PyLong_AsLongLong(value);
  } else if (PyFloat_Check(value)) {
    p->type = TRITONSERVER_PARAMETER_DOUBLE;
    p->double_value = PyFloat_AS_DOUBLE(value);
  } else if (PyBytes_Check(value)) {
    p->type = TRITONSERVER_PARAMETER_STRING;
    p->string_value = PyBytes_AS_STRING(value);
  } else {
    PyErr_SetString(PyExc_TypeError, "a request parameter is bool, int, float or bytes");
    return -1;
  }
  return PyErr_Occurred() ? -1 : 0;
}

/* attribute names, interned once */
static PyObject *s_id, *s_correlation_id, *s_flags, *s_timeout_us, *s_inputs,
    *s_requested_outputs, *s_parameters, *s_made, *s_hidden, *s_input;

int host_requests_init(void) {
  struct {
    PyObject** name;
    const char* text;
  } names[] = {{&s_id, "id"},           {&s_correlation_id, "correlation_id"},
               {&s_flags, "flags"},     {&s_timeout_us, "timeout_us"},
               {&s_inputs, "inputs"},   {&s_requested_outputs, "requested_outputs"},
               {&s_parameters, "parameters"}, {&s_made, "made"},
               {&s_hidden, "hidden"},   {&s_input, "input"}};
  for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
    if ((*names[k].name = PyUnicode_InternFromString(names[k].text)) == NULL) return -1;
  return 0;
}

static int set_parameters(HostRequest* self, PyObject* parameters) {
  Py_ssize_t n = PyTuple_GET_SIZE(parameters);
  self->parameters = PyMem_Calloc(n ? n : 1, sizeof(TRITONSERVER_Parameter));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* item = PyTuple_GET_ITEM(parameters, i);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
        set_parameter(&self->parameters[i], PyTuple_GET_ITEM(item, 0),
                      PyTuple_GET_ITEM(item, 1)) < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a parameter is (key, value)");
      return -1;
    }
  }
  self->parameter_count = (uint32_t)n;
  Py_INCREF(parameters);
  self->parameter_keep = parameters;
  return 0;
}

/* each input's Input: the one kept with the tensor (``made``), else ``maker.input(tensor)`` */
static PyObject* inputs_of(PyObject* tensors, PyObject* maker) {
  if (!PyDict_Check(tensors)) {
    PyErr_SetString(PyExc_TypeError, "a request's inputs are a dict");
    return NULL;
  }
  PyObject* inputs = PyTuple_New(PyDict_GET_SIZE(tensors));
  Py_ssize_t pos = 0, k = 0;
  PyObject *key, *tensor;
  while (inputs != NULL && PyDict_Next(tensors, &pos, &key, &tensor)) {
    PyObject* made = PyObject_GetAttr(tensor, s_made);
    if (made != NULL && !PyObject_TypeCheck(made, &HostInputType)) {
      Py_DECREF(made);
      made = PyObject_CallMethodOneArg(maker, s_input, tensor);
      if (made != NULL && !PyObject_TypeCheck(made, &HostInputType)) {
        Py_CLEAR(made);
        PyErr_SetString(PyExc_TypeError, "maker.input() must return an Input");
      }
    }
    if (made == NULL) Py_CLEAR(inputs);
    else PyTuple_SET_ITEM(inputs, k++, made);
  }
  return inputs;
}

/* the requested outputs' names as bytes, without those in ``hidden`` */
static PyObject* outputs_of(PyObject* requested, PyObject* hidden) {
  if (!PyDict_Check(requested)) {
    PyErr_SetString(PyExc_TypeError, "a request's requested outputs are a dict");
    return NULL;
  }
  PyObject* outputs = PyTuple_New(PyDict_GET_SIZE(requested));
  Py_ssize_t pos = 0, k = 0;
  PyObject *name, *value;
  while (outputs != NULL && PyDict_Next(requested, &pos, &name, &value)) {
    int skip = PySet_GET_SIZE(hidden) ? PySet_Contains(hidden, name) : 0;
    PyObject* text = skip ? NULL : PyUnicode_AsUTF8String(name);
    if (skip < 0 || (!skip && text == NULL)) Py_CLEAR(outputs);
    else if (!skip) PyTuple_SET_ITEM(outputs, k++, text);
  }
  if (outputs != NULL && k < PyTuple_GET_SIZE(outputs) && _PyTuple_Resize(&outputs, k) < 0)
    return NULL;
  return outputs;
}

/* A new Request: the C side of inferpool request ``py``, read from it once; ``maker``
 * makes what the host cannot (backends/cabi/requests.py).  NULL with a Python error. */
HostRequest* host_request_new(PyObject* py, PyObject* maker) {
  HostRequest* self = (HostRequest*)HostRequestType.tp_alloc(&HostRequestType, 0);
  if (self == NULL) return NULL;
  int status = -1;
  PyObject* id = PyObject_GetAttr(py, s_id);
  PyObject* corr = PyObject_GetAttr(py, s_correlation_id);
  PyObject* flags = PyObject_GetAttr(py, s_flags);
  PyObject* timeout = PyObject_GetAttr(py, s_timeout_us);
  PyObject* tensors = PyObject_GetAttr(py, s_inputs);
  PyObject* requested = PyObject_GetAttr(py, s_requested_outputs);
  PyObject* parameters = PyObject_GetAttr(py, s_parameters);
  PyObject* hidden = PyObject_GetAttr(maker, s_hidden);
  if (!id || !corr || !flags || !timeout || !tensors || !requested || !parameters || !hidden)
    goto done;
  if (!PyAnySet_Check(hidden)) {
    PyErr_SetString(PyExc_TypeError, "maker.hidden is a set of output names");
    goto done;
  }
  if ((self->id_obj = PyUnicode_AsUTF8String(id)) == NULL) goto done;
  if (PyUnicode_Check(corr)) {
    if ((self->corr_obj = PyUnicode_AsUTF8String(corr)) == NULL) goto done;
  } else {
    self->correlation_id = PyLong_AsUnsignedLongLongMask(corr);
  }
  self->flags = (uint32_t)PyLong_AsUnsignedLongMask(flags);
  self->timeout_us = PyLong_AsUnsignedLongLongMask(timeout);
  if (PyErr_Occurred()) goto done;
  if ((self->inputs = inputs_of(tensors, maker)) == NULL) goto done;
  if ((self->outputs = outputs_of(requested, hidden)) == NULL) goto done;
  if (PyDict_Check(parameters) && PyDict_GET_SIZE(parameters) > 0) {
    PyObject* made = PyObject_CallMethod(maker, "parameters", "O", parameters);
    if (made == NULL) goto done;
    int bad = !PyTuple_Check(made) || set_parameters(self, made) < 0;
    if (bad && !PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "maker.parameters() must return a tuple");
    Py_DECREF(made);
    if (bad) goto done;
  }
  Py_INCREF(py);
  self->py = py;
  atomic_init(&self->holders, 0);
  atomic_init(&self->released, 1); /* until it is handed to a backend */
  pthread_mutex_init(&self->lock, NULL);
  status = 0;
done:
  Py_XDECREF(id);
  Py_XDECREF(corr);
  Py_XDECREF(flags);
  Py_XDECREF(timeout);
  Py_XDECREF(tensors);
  Py_XDECREF(requested);
  Py_XDECREF(parameters);
  Py_XDECREF(hidden);
  if (status < 0) Py_CLEAR(self);
  return self;
}

static void request_dealloc(HostRequest* self) {
  HostState* state = self->states;
  while (state != NULL) {
    HostState* next = state->next;
    free(state->name);
    free(state->shape);
    free(state);
    state = next;
  }
  pthread_mutex_destroy(&self->lock);
  PyMem_Free(self->parameters);
  Py_XDECREF(self->parameter_keep);
  Py_XDECREF(self->py);
  Py_XDECREF(self->id_obj);
  Py_XDECREF(self->corr_obj);
  Py_XDECREF(self->inputs);
  Py_XDECREF(self->outputs);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* The backend lets go of a request (release, or a response, factory or state gone): the
 * Python reference the C side holds goes with the last holder. */
void host_request_let_go(HostRequest* request) {
  if (atomic_fetch_sub(&request->holders, 1) == 1) {
    if (host_deferred != NULL) {
      host_defer_gone(host_deferred, request);
      return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF((PyObject*)request);
    PyGILState_Release(gil);
  }
}

/* handed to a backend's execute: the backend holds it until RequestRelease (GIL held) */
void host_request_hand_over(HostRequest* request) {
  Py_INCREF((PyObject*)request);
  atomic_store(&request->released, 0);
  atomic_store(&request->holders, 1);
}

/* Triton's rule when an execute fails: the requests are the server's again (GIL held) */
void host_request_reclaim(HostRequest* request) {
  if (atomic_exchange(&request->released, 1) == 0) host_request_let_go(request);
}

PyTypeObject HostRequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "inferpool.backends.cabi._tritonserver.Request",
    .tp_basicsize = sizeof(HostRequest),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TRITONBACKEND_Request: made by the host's execute from an inferpool request",
    .tp_dealloc = (destructor)request_dealloc,
};

/* ================================================================== request accessors */

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request,
                                                        const char** id) {
  REQUEST_ARG(request);
  *id = PyBytes_AS_STRING(request->id_obj);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationId(TRITONBACKEND_Request* request,
                                                                   uint64_t* id) {
  REQUEST_ARG(request);
  if (request->corr_obj != NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "correlation ID in request is not an unsigned int");
  *id = request->correlation_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationIdString(
    TRITONBACKEND_Request* request, const char** id) {
  REQUEST_ARG(request);
  if (request->corr_obj == NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG, "correlation ID in request is not a string");
  *id = PyBytes_AS_STRING(request->corr_obj);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestFlags(TRITONBACKEND_Request* request,
                                                           uint32_t* flags) {
  REQUEST_ARG(request);
  *flags = request->flags;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InferenceRequestTimeoutMicroseconds(
    TRITONBACKEND_Request* request, uint64_t* timeout) {
  REQUEST_ARG(request);
  *timeout = request->timeout_us;
  return NULL;
}

TRITONSERVER_Error* host_request_cancelled(HostRequest* request, bool* is_cancelled,
                                           const char* where) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunctionObjArgs(host_bridge.cancelled, request->py, NULL);
  TRITONSERVER_Error* error = NULL;
  if (result == NULL) {
    error = host_python_error(where);
  } else {
    *is_cancelled = PyObject_IsTrue(result) == 1;
    Py_DECREF(result);
  }
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestIsCancelled(TRITONBACKEND_Request* request,
                                                                 bool* is_cancelled) {
  REQUEST_ARG(request);
  return host_request_cancelled(request, is_cancelled, "TRITONBACKEND_RequestIsCancelled");
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request* request,
                                                                    uint32_t* count) {
  REQUEST_ARG(request);
  *count = request->parameter_count;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestParameter(TRITONBACKEND_Request* request,
                                                               const uint32_t index,
                                                               const char** key,
                                                               TRITONSERVER_ParameterType* type,
                                                               const void** vvalue) {
  REQUEST_ARG(request);
  if (index >= request->parameter_count)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: request has %u parameters", index,
                      request->parameter_count);
  TRITONSERVER_Parameter* p = &request->parameters[index];
  *key = p->name;
  *type = p->type;
  switch (p->type) {
    case TRITONSERVER_PARAMETER_STRING: *vvalue = p->string_value; break;
    case TRITONSERVER_PARAMETER_INT: *vvalue = &p->int_value; break;
    case TRITONSERVER_PARAMETER_BOOL: *vvalue = &p->bool_value; break;
    default: *vvalue = &p->double_value; break;
  }
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* request,
                                                                uint32_t* count) {
  REQUEST_ARG(request);
  *count = (uint32_t)PyTuple_GET_SIZE(request->inputs);
  return NULL;
}

/* INVALID_ARG, Triton's words, where ``index`` is not below ``count`` */
static TRITONSERVER_Error* bounded(uint32_t index, Py_ssize_t count, const char* what) {
  if (index < (uint32_t)count) return NULL;
  return host_error(TRITONSERVER_ERROR_INVALID_ARG, "out of bounds index %u: request has %zd %s",
                    index, count, what);
}

static HostInput* input_at(HostRequest* request, uint32_t index) {
  return (HostInput*)PyTuple_GET_ITEM(request->inputs, index);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputName(TRITONBACKEND_Request* request,
                                                               const uint32_t index,
                                                               const char** input_name) {
  REQUEST_ARG(request);
  TRITONSERVER_Error* error = bounded(index, PyTuple_GET_SIZE(request->inputs), "inputs");
  if (error != NULL) return error;
  *input_name = input_at(request, index)->name;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request,
                                                           const char* name,
                                                           TRITONBACKEND_Input** input) {
  REQUEST_ARG(request);
  HOST_NOT_NULL(name, "name");
  uint32_t n = (uint32_t)PyTuple_GET_SIZE(request->inputs);
  for (uint32_t i = 0; i < n; i++)
    if (strcmp(input_at(request, i)->name, name) == 0) {
      *input = input_at(request, i);
      return NULL;
    }
  return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "unknown request input name %s", name);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request* request,
                                                                  const uint32_t index,
                                                                  TRITONBACKEND_Input** input) {
  REQUEST_ARG(request);
  TRITONSERVER_Error* error = bounded(index, PyTuple_GET_SIZE(request->inputs), "inputs");
  if (error != NULL) return error;
  *input = input_at(request, index);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request,
                                                                 uint32_t* count) {
  REQUEST_ARG(request);
  *count = (uint32_t)PyTuple_GET_SIZE(request->outputs);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request,
                                                                const uint32_t index,
                                                                const char** output_name) {
  REQUEST_ARG(request);
  TRITONSERVER_Error* error = bounded(index, PyTuple_GET_SIZE(request->outputs), "requested outputs");
  if (error != NULL) return error;
  *output_name = PyBytes_AS_STRING(PyTuple_GET_ITEM(request->outputs, index));
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestOutputBufferProperties(
    TRITONBACKEND_Request* request, const char* name, size_t* byte_size,
    TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id) {
  REQUEST_ARG(request);
  (void)name;
  if (byte_size != NULL) *byte_size = 0; /* not known ahead */
  if (memory_type != NULL) *memory_type = TRITONSERVER_MEMORY_CPU;
  if (memory_type_id != NULL) *memory_type_id = 0;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request,
                                                             uint32_t release_flags) {
  REQUEST_ARG(request);
  if (release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONBACKEND_RequestRelease: TRITONSERVER_REQUEST_RELEASE_RESCHEDULE is "
                      "not supported");
  if (atomic_exchange(&request->released, 1) != 0)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "TRITONBACKEND_RequestRelease: request '%s' is not held by the backend",
                      PyBytes_AS_STRING(request->id_obj));
  host_request_let_go(request);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestTrace(TRITONBACKEND_Request* request,
                                                           TRITONSERVER_InferenceTrace** trace) {
  REQUEST_ARG(request);
  *trace = NULL; /* requests are not traced */
  return NULL;
}
