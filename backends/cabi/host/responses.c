/* Responses: made in C, their outputs' memory and their sending handed to the bridge;
 * response factories (decoupled models); a response's outputs read back. */
#include "host.h"

#include <string.h>

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

/* A response parameter's name as a Python string: the names a backend sets are few and set
 * on every response, so the first KEYS are made once and kept (GIL held). */
#define KEYS 32
static PyObject* parameter_key(const char* name) {
  static struct {
    char* text;
    PyObject* key;
  } kept[KEYS];
  static int count;
  for (int k = 0; k < count; k++)
    if (strcmp(kept[k].text, name) == 0) {
      Py_INCREF(kept[k].key);
      return kept[k].key;
    }
  PyObject* key = PyUnicode_FromString(name);
  if (key != NULL && count < KEYS) {
    kept[count].text = strdup(name);
    kept[count++].key = key;
    Py_INCREF(key);
  }
  return key;
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
      PyObject* key = parameter_key(p->name);
      PyObject* value = host_parameter_value(p);
      if (key == NULL || value == NULL || PyDict_SetItem(parameters, key, value) < 0)
        Py_CLEAR(parameters);
      Py_XDECREF(key);
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
  return host_request_cancelled(factory->request, is_cancelled,
                                "TRITONBACKEND_ResponseFactoryIsCancelled");
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
