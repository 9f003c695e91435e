/* Requests and their inputs (read in C, filled once per request from Python), responses
 * and their outputs, response factories, implicit state. */
#include "host.h"

#include <string.h>


/* ================================================================== inputs (Python type) */
static int input_init(HostInput* self, PyObject* args, PyObject* kwds) {
  (void)kwds;
  PyObject *name, *shape, *buffer, *keep = Py_None;
  int datatype, memory_type;
  unsigned long long byte_size;
  long long device_id;
  if (!PyArg_ParseTuple(args, "O!iO!KOiL|O", &PyBytes_Type, &name, &datatype, &PyTuple_Type,
                        &shape, &byte_size, &buffer, &memory_type, &device_id, &keep))
    return -1;
  Py_ssize_t dims = PyTuple_GET_SIZE(shape);
  self->shape = PyMem_Malloc(sizeof(int64_t) * (dims ? dims : 1));
  for (Py_ssize_t i = 0; i < dims; i++) {
    self->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (self->shape[i] == -1 && PyErr_Occurred()) return -1;
  }
  if (PyLong_Check(buffer)) { /* a device address; ``keep`` keeps its memory */
    self->buffer = PyLong_AsVoidPtr(buffer);
    Py_INCREF(keep);
    self->keep = keep;
  } else {
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_SIMPLE) < 0) return -1;
    self->has_view = 1;
    self->buffer = self->view.buf;
  }
  Py_INCREF(name);
  self->name_obj = name;
  self->name = PyBytes_AS_STRING(name);
  self->datatype = (TRITONSERVER_DataType)datatype;
  self->dims_count = (uint32_t)dims;
  self->byte_size = byte_size;
  self->attributes.memory_type = (TRITONSERVER_MemoryType)memory_type;
  self->attributes.memory_type_id = device_id;
  self->attributes.byte_size = byte_size;
  return 0;
}

static void input_dealloc(HostInput* self) {
  if (self->has_view) PyBuffer_Release(&self->view);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->name_obj);
  PyMem_Free(self->shape);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyTypeObject HostInputType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "inferpool.backends.cabi._tritonserver.Input",
    .tp_basicsize = sizeof(HostInput),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TRITONBACKEND_Input: Input(name, datatype, shape, byte_size, buffer, "
              "memory_type, memory_type_id[, keep])",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)input_init,
    .tp_dealloc = (destructor)input_dealloc,
};

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

/* Request(request, maker): the C side of an inferpool Request, read from it once */
static int request_init(HostRequest* self, PyObject* args, PyObject* kwds) {
  (void)kwds;
  PyObject *py, *maker;
  if (!PyArg_ParseTuple(args, "OO", &py, &maker)) return -1;
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
  return status;
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

static PyObject* request_reclaim(HostRequest* self, PyObject* unused) {
  (void)unused;
  if (atomic_exchange(&self->released, 1) == 0) host_request_let_go(self);
  Py_RETURN_NONE;
}

static PyObject* request_released(HostRequest* self, void* closure) {
  (void)closure;
  return PyBool_FromLong(atomic_load(&self->released));
}

static PyMethodDef request_methods[] = {
    {"reclaim", (PyCFunction)request_reclaim, METH_NOARGS,
     "Take the request back from a backend whose execute failed (Triton's rule: the server "
     "owns the requests then)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef request_getset[] = {
    {"released", (getter)request_released, NULL, "whether the backend released it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject HostRequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "inferpool.backends.cabi._tritonserver.Request",
    .tp_basicsize = sizeof(HostRequest),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TRITONBACKEND_Request: Request(request, maker), read from an inferpool "
              "request once; maker.input(tensor) makes an input not made yet, "
              "maker.parameters(dict) the parameters, maker.hidden names outputs left out",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)request_init,
    .tp_dealloc = (destructor)request_dealloc,
    .tp_methods = request_methods,
    .tp_getset = request_getset,
};

/* ================================================================== request accessors */
#define REQUEST_ARG(r) HOST_NOT_NULL(r, "request")

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

static TRITONSERVER_Error* cancelled(HostRequest* request, bool* is_cancelled, const char* where) {
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
  return cancelled(request, is_cancelled, "TRITONBACKEND_RequestIsCancelled");
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

static HostInput* input_at(HostRequest* request, uint32_t index) {
  return (HostInput*)PyTuple_GET_ITEM(request->inputs, index);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputName(TRITONBACKEND_Request* request,
                                                               const uint32_t index,
                                                               const char** input_name) {
  REQUEST_ARG(request);
  if (index >= (uint32_t)PyTuple_GET_SIZE(request->inputs))
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: request has %zd inputs", index,
                      PyTuple_GET_SIZE(request->inputs));
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
  if (index >= (uint32_t)PyTuple_GET_SIZE(request->inputs))
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: request has %zd inputs", index,
                      PyTuple_GET_SIZE(request->inputs));
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
  if (index >= (uint32_t)PyTuple_GET_SIZE(request->outputs))
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: request has %zd requested outputs", index,
                      PyTuple_GET_SIZE(request->outputs));
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

/* ================================================================== input accessors */
static TRITONSERVER_Error* input_properties(TRITONBACKEND_Input* input, const char** name,
                                            TRITONSERVER_DataType* datatype, const int64_t** shape,
                                            uint32_t* dims_count, uint64_t* byte_size,
                                            uint32_t* buffer_count) {
  HOST_NOT_NULL(input, "input");
  if (name != NULL) *name = input->name;
  if (datatype != NULL) *datatype = input->datatype;
  if (shape != NULL) *shape = input->shape;
  if (dims_count != NULL) *dims_count = input->dims_count;
  if (byte_size != NULL) *byte_size = input->byte_size;
  if (buffer_count != NULL) *buffer_count = 1;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputProperties(
    TRITONBACKEND_Input* input, const char** name, TRITONSERVER_DataType* datatype,
    const int64_t** shape, uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count) {
  return input_properties(input, name, datatype, shape, dims_count, byte_size, buffer_count);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputPropertiesForHostPolicy(
    TRITONBACKEND_Input* input, const char* host_policy_name, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint32_t* dims_count,
    uint64_t* byte_size, uint32_t* buffer_count) {
  (void)host_policy_name; /* one worker, one host policy: the input is the same for all */
  return input_properties(input, name, datatype, shape, dims_count, byte_size, buffer_count);
}

static TRITONSERVER_Error* input_buffer(TRITONBACKEND_Input* input, const uint32_t index,
                                        const void** buffer, uint64_t* buffer_byte_size,
                                        TRITONSERVER_MemoryType* memory_type,
                                        int64_t* memory_type_id) {
  HOST_NOT_NULL(input, "input");
  if (index != 0)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: input '%s' has 1 buffer", index, input->name);
  *buffer = input->buffer;
  *buffer_byte_size = input->byte_size;
  *memory_type = input->attributes.memory_type; /* where it is, whatever was preferred */
  *memory_type_id = input->attributes.memory_type_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input,
                                                          const uint32_t index,
                                                          const void** buffer,
                                                          uint64_t* buffer_byte_size,
                                                          TRITONSERVER_MemoryType* memory_type,
                                                          int64_t* memory_type_id) {
  return input_buffer(input, index, buffer, buffer_byte_size, memory_type, memory_type_id);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBufferForHostPolicy(
    TRITONBACKEND_Input* input, const char* host_policy_name, const uint32_t index,
    const void** buffer, uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
    int64_t* memory_type_id) {
  (void)host_policy_name;
  return input_buffer(input, index, buffer, buffer_byte_size, memory_type, memory_type_id);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBufferAttributes(
    TRITONBACKEND_Input* input, const uint32_t index, const void** buffer,
    TRITONSERVER_BufferAttributes** buffer_attributes) {
  HOST_NOT_NULL(input, "input");
  if (index != 0)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: input '%s' has 1 buffer", index, input->name);
  *buffer = input->buffer;
  *buffer_attributes = &input->attributes;
  return NULL;
}

/* ================================================================== responses */
static TRITONSERVER_Error* response_new(TRITONBACKEND_Response** response, HostRequest* request) {
  TRITONBACKEND_Response* made = calloc(1, sizeof(*made));
  atomic_fetch_add(&request->holders, 1);
  made->request = request;
  *response = made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response,
                                                          TRITONBACKEND_Request* request) {
  HOST_NOT_NULL(response, "response");
  REQUEST_ARG(request);
  return response_new(response, request);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(
    TRITONBACKEND_Response** response, TRITONBACKEND_ResponseFactory* factory) {
  HOST_NOT_NULL(response, "response");
  HOST_NOT_NULL(factory, "factory");
  return response_new(response, factory->request);
}

/* frees the C side of a response; its Python side (outputs) is the caller's (GIL held) */
static void response_free(TRITONBACKEND_Response* response) {
  for (uint32_t i = 0; i < response->output_count; i++) {
    free(response->outputs[i]->name);
    free(response->outputs[i]->shape);
    free(response->outputs[i]);
  }
  free(response->outputs);
  for (uint32_t i = 0; i < response->parameter_count; i++)
    host_parameter_free(response->parameters[i]);
  free(response->parameters);
  Py_XDECREF(response->py);
  HostRequest* request = response->request;
  free(response);
  host_request_let_go(request);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response) {
  if (response == NULL) return NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (response->py != NULL) { /* its outputs' memory goes back */
    PyObject* result = PyObject_CallMethod(response->py, "discard", NULL);
    Py_XDECREF(result);
    if (result == NULL) PyErr_WriteUnraisable(response->py);
  }
  response_free(response);
  PyGILState_Release(gil);
  return NULL;
}

static TRITONSERVER_Error* add_parameter(TRITONBACKEND_Response* response,
                                         TRITONSERVER_Parameter* parameter) {
  if (response->parameter_count == response->parameter_capacity) {
    response->parameter_capacity = response->parameter_capacity ? 2 * response->parameter_capacity : 4;
    response->parameters = realloc(response->parameters,
                                   response->parameter_capacity * sizeof(*response->parameters));
  }
  response->parameters[response->parameter_count++] = parameter;
  return NULL;
}

#define RESPONSE_PARAMETER(KIND, CTYPE, PTYPE)                                                 \
  HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSet##KIND##Parameter(                \
      TRITONBACKEND_Response* response, const char* name, const CTYPE value) {               \
    HOST_NOT_NULL(response, "response");                                                     \
    HOST_NOT_NULL(name, "name");                                                             \
    return add_parameter(response, TRITONSERVER_ParameterNew(name, PTYPE, &value));          \
  }

RESPONSE_PARAMETER(Int, int64_t, TRITONSERVER_PARAMETER_INT)
RESPONSE_PARAMETER(Bool, bool, TRITONSERVER_PARAMETER_BOOL)
RESPONSE_PARAMETER(Double, double, TRITONSERVER_PARAMETER_DOUBLE)

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSetStringParameter(
    TRITONBACKEND_Response* response, const char* name, const char* value) {
  HOST_NOT_NULL(response, "response");
  HOST_NOT_NULL(name, "name");
  HOST_NOT_NULL(value, "value");
  return add_parameter(response,
                       TRITONSERVER_ParameterNew(name, TRITONSERVER_PARAMETER_STRING, value));
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response,
                                                             TRITONBACKEND_Output** output,
                                                             const char* name,
                                                             const TRITONSERVER_DataType datatype,
                                                             const int64_t* shape,
                                                             const uint32_t dims_count) {
  HOST_NOT_NULL(response, "response");
  HOST_NOT_NULL(output, "output");
  HOST_NOT_NULL(name, "name");
  if (dims_count > 0) HOST_NOT_NULL(shape, "shape");
  for (uint32_t i = 0; i < response->output_count; i++)
    if (strcmp(response->outputs[i]->name, name) == 0)
      return host_error(TRITONSERVER_ERROR_ALREADY_EXISTS,
                        "output '%s' already exists in response", name);
  if (datatype <= TRITONSERVER_TYPE_INVALID || datatype > TRITONSERVER_TYPE_BF16)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "TRITONBACKEND_ResponseOutput: output '%s' has an invalid datatype %d",
                      name, (int)datatype);
  TRITONBACKEND_Output* made = calloc(1, sizeof(*made));
  made->name = strdup(name);
  made->datatype = datatype;
  made->shape = host_shape_copy(shape, dims_count);
  made->dims_count = dims_count;
  made->response = response;
  if (response->output_count == response->output_capacity) {
    response->output_capacity = response->output_capacity ? 2 * response->output_capacity : 4;
    response->outputs = realloc(response->outputs,
                                response->output_capacity * sizeof(*response->outputs));
  }
  response->outputs[response->output_count++] = made;
  *output = made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output,
                                                           void** buffer,
                                                           const uint64_t buffer_byte_size,
                                                           TRITONSERVER_MemoryType* memory_type,
                                                           int64_t* memory_type_id) {
  HOST_NOT_NULL(output, "output");
  HOST_NOT_NULL(buffer, "buffer");
  if (output->buffer != NULL)
    return host_error(TRITONSERVER_ERROR_ALREADY_EXISTS,
                      "TRITONBACKEND_OutputBuffer: output '%s' already has a buffer",
                      output->name);
  TRITONBACKEND_Response* response = output->response;
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* error = NULL;
  PyObject* args[6] = {response->request->py, response->py ? response->py : Py_None,
                       PyUnicode_FromString(output->name),
                       host_datatype_name(output->datatype),
                       host_shape_tuple(output->shape, output->dims_count),
                       PyLong_FromUnsignedLongLong(buffer_byte_size)};
  PyObject* result = args[2] && args[3] && args[4] && args[5]
                         ? PyObject_Vectorcall(host_bridge.output, args, 6, NULL)
                         : NULL;
  for (int k = 2; k < 6; k++) Py_XDECREF(args[k]);
  if (result == NULL) {
    error = host_python_error("TRITONBACKEND_OutputBuffer");
  } else { /* (the Python response, its buffer) */
    if (response->py == NULL) {
      response->py = PyTuple_GET_ITEM(result, 0);
      Py_INCREF(response->py);
    }
    error = host_buffer_of(PyTuple_GET_ITEM(result, 1), &output->buffer, &output->attributes,
                           "TRITONBACKEND_OutputBuffer");
    Py_DECREF(result);
  }
  PyGILState_Release(gil);
  if (error != NULL) return error;
  output->byte_size = buffer_byte_size;
  output->attributes.byte_size = buffer_byte_size;
  *buffer = output->buffer;
  if (memory_type != NULL) *memory_type = output->attributes.memory_type;
  if (memory_type_id != NULL) *memory_type_id = output->attributes.memory_type_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_OutputBufferAttributes(
    TRITONBACKEND_Output* output, TRITONSERVER_BufferAttributes** buffer_attributes) {
  HOST_NOT_NULL(output, "output");
  *buffer_attributes = &output->attributes;
  return NULL;
}

static TRITONSERVER_Error* send(HostRequest* request, PyObject* py_response,
                                TRITONBACKEND_Response* response, uint32_t flags,
                                TRITONSERVER_Error* failure, const char* where) {
  PyObject* parameters = Py_None;
  Py_INCREF(parameters);
  if (response != NULL && response->parameter_count > 0) {
    Py_DECREF(parameters);
    parameters = PyDict_New();
    for (uint32_t i = 0; parameters != NULL && i < response->parameter_count; i++) {
      TRITONSERVER_Parameter* p = response->parameters[i];
      PyObject* value = host_parameter_value(p);
      if (value == NULL || PyDict_SetItemString(parameters, p->name, value) < 0)
        Py_CLEAR(parameters);
      Py_XDECREF(value);
    }
  }
  PyObject* error = Py_None;
  Py_INCREF(error);
  if (failure != NULL) {
    Py_DECREF(error);
    error = Py_BuildValue("(is)", (int)failure->code, failure->message);
  }
  PyObject* args[6] = {request->py, py_response ? py_response : Py_None, parameters,
                       PyLong_FromUnsignedLong(flags), error, PyBool_FromLong(response != NULL)};
  PyObject* result = parameters == NULL || error == NULL || args[3] == NULL
                         ? NULL
                         : PyObject_Vectorcall(host_bridge.send, args, 6, NULL);
  Py_XDECREF(args[3]);
  Py_DECREF(args[5]);
  Py_XDECREF(parameters);
  Py_XDECREF(error);
  return host_checked(result, where);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response,
                                                           const uint32_t send_flags,
                                                           TRITONSERVER_Error* error) {
  HOST_NOT_NULL(response, "response");
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* failed = send(response->request, response->py, response, send_flags, error,
                                    "TRITONBACKEND_ResponseSend");
  response_free(response);
  PyGILState_Release(gil);
  return failed;
}

/* ================================================================== response factories */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(
    TRITONBACKEND_ResponseFactory** factory, TRITONBACKEND_Request* request) {
  HOST_NOT_NULL(factory, "factory");
  REQUEST_ARG(request);
  TRITONBACKEND_ResponseFactory* made = malloc(sizeof(*made));
  atomic_fetch_add(&request->holders, 1);
  made->request = request;
  *factory = made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(
    TRITONBACKEND_ResponseFactory* factory) {
  if (factory == NULL) return NULL;
  HostRequest* request = factory->request;
  free(factory);
  host_request_let_go(request);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(
    TRITONBACKEND_ResponseFactory* factory, const uint32_t send_flags) {
  HOST_NOT_NULL(factory, "factory");
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* error =
      send(factory->request, NULL, NULL, send_flags, NULL, "TRITONBACKEND_ResponseFactorySendFlags");
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(
    TRITONBACKEND_ResponseFactory* factory, bool* is_cancelled) {
  HOST_NOT_NULL(factory, "factory");
  return cancelled(factory->request, is_cancelled, "TRITONBACKEND_ResponseFactoryIsCancelled");
}

/* ================================================================== a response's outputs */
static TRITONSERVER_Error* output_of(TRITONBACKEND_Output* out, const char** name,
                                     TRITONSERVER_DataType* datatype, const int64_t** shape,
                                     uint64_t* dim_count) {
  if (name != NULL) *name = out->name;
  if (datatype != NULL) *datatype = out->datatype;
  if (shape != NULL) *shape = out->shape;
  if (dim_count != NULL) *dim_count = out->dims_count;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InferenceResponseOutput(
    TRITONBACKEND_Response* response, const uint32_t index, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count) {
  HOST_NOT_NULL(response, "response");
  if (index >= response->output_count)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: response has %u outputs", index,
                      response->output_count);
  return output_of(response->outputs[index], name, datatype, shape, dim_count);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InferenceResponseOutputByName(
    TRITONBACKEND_Response* response, const char* name, TRITONSERVER_DataType* datatype,
    const int64_t** shape, uint64_t* dim_count) {
  HOST_NOT_NULL(response, "response");
  HOST_NOT_NULL(name, "name");
  for (uint32_t i = 0; i < response->output_count; i++)
    if (strcmp(response->outputs[i]->name, name) == 0)
      return output_of(response->outputs[i], NULL, datatype, shape, dim_count);
  return host_error(TRITONSERVER_ERROR_NOT_FOUND, "Output name %s not found", name);
}

/* ================================================================== implicit state */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateNew(TRITONBACKEND_State** state,
                                                       TRITONBACKEND_Request* request,
                                                       const char* name,
                                                       const TRITONSERVER_DataType datatype,
                                                       const int64_t* shape,
                                                       const uint32_t dims_count) {
  HOST_NOT_NULL(state, "state");
  REQUEST_ARG(request);
  HOST_NOT_NULL(name, "name");
  HostState* made = calloc(1, sizeof(*made));
  made->request = request;
  made->name = strdup(name);
  made->datatype = datatype;
  made->shape = host_shape_copy(shape, dims_count);
  made->dims_count = dims_count;
  pthread_mutex_lock(&request->lock);
  made->next = request->states;
  request->states = made;
  pthread_mutex_unlock(&request->lock);
  *state = (TRITONBACKEND_State*)made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateBuffer(TRITONBACKEND_State* state,
                                                          void** buffer,
                                                          const uint64_t buffer_byte_size,
                                                          TRITONSERVER_MemoryType* memory_type,
                                                          int64_t* memory_type_id) {
  HOST_NOT_NULL(state, "state");
  HostState* s = (HostState*)state;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* shape = host_shape_tuple(s->shape, s->dims_count);
  PyObject* result =
      shape == NULL ? NULL
                    : PyObject_CallFunction(host_bridge.state_buffer, "OysOK", s->request->py,
                                            s->name, host_datatype_string(s->datatype), shape,
                                            (unsigned long long)buffer_byte_size);
  Py_XDECREF(shape);
  TRITONSERVER_Error* error = NULL;
  if (result == NULL) {
    error = host_python_error("TRITONBACKEND_StateBuffer");
  } else {
    error = host_buffer_of(result, &s->buffer, &s->attributes, "TRITONBACKEND_StateBuffer");
    Py_DECREF(result);
  }
  PyGILState_Release(gil);
  if (error != NULL) return error;
  s->byte_size = buffer_byte_size;
  s->attributes.byte_size = buffer_byte_size;
  *buffer = s->buffer;
  if (memory_type != NULL) *memory_type = s->attributes.memory_type;
  if (memory_type_id != NULL) *memory_type_id = s->attributes.memory_type_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateUpdate(TRITONBACKEND_State* state) {
  HOST_NOT_NULL(state, "state");
  HostState* s = (HostState*)state;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result =
      PyObject_CallFunction(host_bridge.state_update, "Oy", s->request->py, s->name);
  TRITONSERVER_Error* error = host_checked(result, "TRITONBACKEND_StateUpdate");
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateBufferAttributes(
    TRITONBACKEND_State* state, TRITONSERVER_BufferAttributes** buffer_attributes) {
  HOST_NOT_NULL(state, "state");
  *buffer_attributes = &((HostState*)state)->attributes;
  return NULL;
}
