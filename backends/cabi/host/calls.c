/* TRITONSERVER_ServerInferAsync: a request a backend made goes to Python (the bridge's
 * infer: backends/cabi/server_calls.py), which sends it through the worker's calls to the
 * broker.  Each reply comes back through deliver(): the backend's allocator gives each
 * output's buffer, the output is copied there, and the response callback is called; after
 * the final reply, the request's release callback.  deliver() runs on the thread that reads
 * the worker's channel, never needing the thread that made the call, so a backend may block
 * its execute until its callback has run. */
#include <string.h>

#include "host.h"

static void call_capsule_free(PyObject* capsule) { (void)capsule; }

/* an input's data as Python reads it: a view of the backend's memory (one buffer), or the
 * buffers joined (GIL held) */
static PyObject* input_data(const CallInput* input) {
  if (input->chunk_count == 1)
    return PyMemoryView_FromMemory((char*)input->chunks[0].base,
                                   (Py_ssize_t)input->chunks[0].byte_size, PyBUF_READ);
  size_t total = 0;
  for (size_t k = 0; k < input->chunk_count; k++) total += input->chunks[k].byte_size;
  PyObject* joined = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
  if (joined == NULL) return NULL;
  char* at = PyBytes_AS_STRING(joined);
  for (size_t k = 0; k < input->chunk_count; k++) {
    memcpy(at, input->chunks[k].base, input->chunks[k].byte_size);
    at += input->chunks[k].byte_size;
  }
  return joined;
}

static PyObject* request_args(TRITONSERVER_InferenceRequest* r, PyObject* capsule) {
  PyObject* inputs = PyList_New((Py_ssize_t)r->input_count);
  PyObject* outputs = PyList_New((Py_ssize_t)r->output_count);
  PyObject* parameters = PyDict_New();
  PyObject* args = NULL;
  if (inputs == NULL || outputs == NULL || parameters == NULL) goto done;
  for (size_t k = 0; k < r->input_count; k++) {
    const CallInput* input = &r->inputs[k];
    PyObject* data = input_data(input);
    PyObject* shape = host_shape_tuple(input->shape, (uint32_t)input->dims_count);
    PyObject* datatype = host_datatype_name(input->datatype);
    if (data == NULL || shape == NULL || datatype == NULL) {
      Py_XDECREF(data);
      Py_XDECREF(shape);
      Py_XDECREF(datatype);
      goto done;
    }
    /* one buffer: its address, by which Python finds it if it lies in shared memory */
    unsigned long long address =
        input->chunk_count == 1 ? (unsigned long long)(uintptr_t)input->chunks[0].base : 0;
    PyList_SET_ITEM(inputs, (Py_ssize_t)k,
                    Py_BuildValue("(sNNNK)", input->name, datatype, shape, data, address));
  }
  for (size_t k = 0; k < r->output_count; k++)
    PyList_SET_ITEM(outputs, (Py_ssize_t)k, PyUnicode_FromString(r->outputs[k]));
  for (size_t k = 0; k < r->parameter_count; k++) {
    PyObject* value = host_parameter_value(r->parameters[k]);
    if (value == NULL || PyDict_SetItemString(parameters, r->parameters[k]->name, value) < 0) {
      Py_XDECREF(value);
      goto done;
    }
    Py_DECREF(value);
  }
  PyObject* correlation = r->correlation_string != NULL
                              ? PyUnicode_FromString(r->correlation_string)
                              : PyLong_FromUnsignedLongLong(r->correlation_id);
  args = Py_BuildValue("(OsLsNkKOOO)", capsule, r->model_name, (long long)r->model_version,
                       r->id, correlation, (unsigned long)r->flags,
                       (unsigned long long)r->timeout_us, parameters, inputs, outputs);
done:
  Py_XDECREF(inputs);
  Py_XDECREF(outputs);
  Py_XDECREF(parameters);
  return args;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerInferAsync(
    TRITONSERVER_Server* server, TRITONSERVER_InferenceRequest* r,
    TRITONSERVER_InferenceTrace* trace) {
  (void)trace; /* no tracing */
  HOST_NOT_NULL(server, "server");
  HOST_NOT_NULL(r, "inference_request");
  if (r->response_fn == NULL || r->allocator == NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "inference request has no response callback: call "
                      "TRITONSERVER_InferenceRequestSetResponseCallback first");
  for (size_t k = 0; k < r->input_count; k++)
    if (r->inputs[k].chunk_count == 0)
      return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                        "input '%s' has no data: call TRITONSERVER_InferenceRequestAppendInputData",
                        r->inputs[k].name);
  if (host_bridge.infer == NULL)
    return host_error(TRITONSERVER_ERROR_UNAVAILABLE, "TRITONSERVER_ServerInferAsync: no backend is loaded");
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* error = NULL;
  if (r->in_flight) {
    error = host_error(TRITONSERVER_ERROR_INVALID_ARG,
                       "the inference request is in flight: send it again once its release "
                       "callback has been called");
    goto done;
  }
  PyObject* capsule = PyCapsule_New(r, "inferpool.inference_request", call_capsule_free);
  PyObject* args = capsule != NULL ? request_args(r, capsule) : NULL;
  Py_XDECREF(capsule);
  PyObject* call = args != NULL ? PyObject_CallObject(host_bridge.infer, args) : NULL;
  Py_XDECREF(args);
  if (call == NULL) {
    error = host_python_error("TRITONSERVER_ServerInferAsync");
    goto done;
  }
  r->call = call;
  r->in_flight = true;
  r->cancelled = false;
  r->responses = 0;
  /* from here the replies may be delivered, on other threads (the request may even be
   * released and deleted before arm() returns): r is not touched again */
  PyObject* armed = PyObject_CallMethod(call, "arm", NULL);
  if (armed == NULL) {
    PyErr_WriteUnraisable(call);
  }
  Py_XDECREF(armed);
done:
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestCancel(
    TRITONSERVER_InferenceRequest* r) {
  HOST_NOT_NULL(r, "inference_request");
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* error = NULL;
  r->cancelled = true;
  if (r->call != NULL) {
    PyObject* call = r->call;
    Py_INCREF(call);
    error = host_checked(PyObject_CallMethod(call, "cancel", NULL),
                         "TRITONSERVER_InferenceRequestCancel");
    Py_DECREF(call);
  }
  PyGILState_Release(gil);
  return error;
}

/* ------------------------------------------------------------------ deliver */
static TRITONSERVER_Error* place_output(TRITONSERVER_InferenceRequest* r,
                                        TRITONSERVER_InferenceResponse* response, PyObject* item) {
  const char *name, *datatype;
  PyObject *shape, *data;
  if (!PyArg_ParseTuple(item, "ssOO", &name, &datatype, &shape, &data))
    return host_python_error("deliver");
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return host_python_error("deliver");
  CallOutput* out = &response->outputs[response->output_count++];
  memset(out, 0, sizeof(*out));
  out->name = strdup(name);
  out->datatype = TRITONSERVER_StringToDataType(datatype);
  out->dims_count = (uint64_t)PyTuple_Size(shape);
  out->shape = calloc(out->dims_count ? out->dims_count : 1, sizeof(int64_t));
  for (uint64_t d = 0; d < out->dims_count; d++)
    out->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, (Py_ssize_t)d));
  out->byte_size = (size_t)view.len;
  TRITONSERVER_ResponseAllocator* allocator = r->allocator;
  TRITONSERVER_Error* error;
  Py_BEGIN_ALLOW_THREADS
  error = allocator->alloc_fn(allocator, out->name, out->byte_size, TRITONSERVER_MEMORY_CPU, 0,
                              r->allocator_userp, &out->buffer, &out->buffer_userp,
                              &out->memory_type, &out->memory_type_id);
  Py_END_ALLOW_THREADS
  if (error == NULL && out->byte_size > 0) {
    if (out->memory_type == TRITONSERVER_MEMORY_GPU)
      error = host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                         "output '%s': the allocator gave GPU memory; inferpool's host copies "
                         "the outputs of a backend's requests into CPU or CPU_PINNED memory",
                         name);
    else if (out->buffer == NULL)
      error = host_error(TRITONSERVER_ERROR_INTERNAL,
                         "output '%s': the allocator gave no buffer for %zu bytes", name,
                         out->byte_size);
    else
      memcpy(out->buffer, view.buf, out->byte_size);
  }
  PyBuffer_Release(&view);
  return error;
}

static TRITONSERVER_InferenceResponse* response_new(TRITONSERVER_InferenceRequest* r,
                                                    PyObject* outputs, PyObject* parameters,
                                                    PyObject* error) {
  TRITONSERVER_InferenceResponse* response = calloc(1, sizeof(*response));
  response->model_name = strdup(r->model_name);
  response->model_version = r->served_version;
  response->id = strdup(r->id);
  response->allocator = r->allocator;
  Py_ssize_t count = PyList_Size(outputs);
  response->outputs = calloc(count > 0 ? (size_t)count : 1, sizeof(CallOutput));
  if (error != Py_None) {
    const char *code, *message;
    if (PyArg_ParseTuple(error, "ss", &code, &message))
      response->error = host_error(host_code_of(code), "%s", message);
    else
      response->error = host_python_error("deliver");
    return response;
  }
  if (r->allocator->start_fn != NULL && count > 0) {
    TRITONSERVER_ResponseAllocator* allocator = r->allocator;
    Py_BEGIN_ALLOW_THREADS
    response->error = allocator->start_fn(allocator, r->allocator_userp);
    Py_END_ALLOW_THREADS
  }
  for (Py_ssize_t k = 0; response->error == NULL && k < count; k++)
    response->error = place_output(r, response, PyList_GET_ITEM(outputs, k));
  if (parameters != Py_None && PyDict_Check(parameters)) {
    Py_ssize_t at = 0;
    PyObject *key, *value;
    response->parameters = calloc((size_t)PyDict_Size(parameters) + 1, sizeof(void*));
    while (PyDict_Next(parameters, &at, &key, &value)) {
      const char* name = PyUnicode_AsUTF8(key);
      TRITONSERVER_Parameter* p = NULL;
      if (name == NULL) {
        PyErr_Clear();
      } else if (PyBool_Check(value)) {
        bool b = value == Py_True;
        p = TRITONSERVER_ParameterNew(name, TRITONSERVER_PARAMETER_BOOL, &b);
      } else if (PyLong_Check(value)) {
        int64_t i = PyLong_AsLongLong(value);
        p = TRITONSERVER_ParameterNew(name, TRITONSERVER_PARAMETER_INT, &i);
      } else if (PyFloat_Check(value)) {
        double d = PyFloat_AsDouble(value);
        p = TRITONSERVER_ParameterNew(name, TRITONSERVER_PARAMETER_DOUBLE, &d);
      } else if (PyUnicode_Check(value)) {
        const char* s = PyUnicode_AsUTF8(value);
        if (s != NULL) p = TRITONSERVER_ParameterNew(name, TRITONSERVER_PARAMETER_STRING, s);
      }
      if (PyErr_Occurred()) PyErr_Clear();
      if (p != NULL) response->parameters[response->parameter_count++] = p;
    }
  }
  return response;
}

/* deliver(request, outputs, parameters, error, final) (GIL held) */
PyObject* host_deliver(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *outputs, *parameters, *error;
  int final;
  if (!PyArg_ParseTuple(args, "OO!OOp", &capsule, &PyList_Type, &outputs, &parameters, &error,
                        &final))
    return NULL;
  TRITONSERVER_InferenceRequest* r = PyCapsule_GetPointer(capsule, "inferpool.inference_request");
  if (r == NULL) return NULL;
  if (!r->in_flight) {
    PyErr_SetString(PyExc_RuntimeError, "a reply to a request that is not in flight");
    return NULL;
  }
  /* a stream's empty last reply is Triton's null response with the final flag */
  bool empty = final && r->responses > 0 && PyList_Size(outputs) == 0 && error == Py_None &&
               (parameters == Py_None || PyObject_Not(parameters) == 1);
  TRITONSERVER_InferenceResponse* response =
      empty ? NULL : response_new(r, outputs, parameters, error);
  r->responses++;
  TRITONSERVER_InferenceResponseCompleteFn_t response_fn = r->response_fn;
  void* response_userp = r->response_userp;
  TRITONSERVER_InferenceRequestReleaseFn_t release_fn = r->release_fn;
  void* release_userp = r->release_userp;
  PyObject* call = NULL;
  if (final) { /* the request is the backend's again once its release callback runs */
    call = r->call;
    r->call = NULL;
    r->in_flight = false;
  }
  Py_BEGIN_ALLOW_THREADS
  response_fn(response, final ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, response_userp);
  if (final && release_fn != NULL)
    release_fn(r, TRITONSERVER_REQUEST_RELEASE_ALL, release_userp);
  Py_END_ALLOW_THREADS
  Py_XDECREF(call);
  Py_RETURN_NONE;
}
