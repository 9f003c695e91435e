/* The responses to requests a backend made (TRITONSERVER_InferenceResponse), read in C:
 * made by deliver() (calls.c), deleted by the backend, which gives each output's buffer back
 * to its allocator. */
#include <string.h>

#include "host.h"

#define RESPONSE(r) HOST_NOT_NULL(r, "inference_response")

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseDelete(
    TRITONSERVER_InferenceResponse* response) {
  if (response == NULL) return NULL;
  TRITONSERVER_Error* first = NULL;
  for (uint32_t k = 0; k < response->output_count; k++) {
    CallOutput* out = &response->outputs[k];
    if (out->buffer != NULL || out->buffer_userp != NULL) {
      TRITONSERVER_Error* error = response->allocator->release_fn(
          response->allocator, out->buffer, out->buffer_userp, out->byte_size, out->memory_type,
          out->memory_type_id);
      if (first == NULL) first = error;
      else TRITONSERVER_ErrorDelete(error);
    }
    free(out->name);
    free(out->shape);
  }
  free(response->outputs);
  if (response->labels != NULL) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(response->labels);
    PyGILState_Release(gil);
  }
  for (uint32_t k = 0; k < response->parameter_count; k++)
    host_parameter_free(response->parameters[k]);
  free(response->parameters);
  TRITONSERVER_ErrorDelete(response->error);
  free(response->model_name);
  free(response->id);
  free(response);
  return first;
}

/* the response's error as a new error the caller deletes, or null on success */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseError(
    TRITONSERVER_InferenceResponse* response) {
  if (response == NULL || response->error == NULL) return NULL;
  return TRITONSERVER_ErrorNew(response->error->code, response->error->message);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseModel(
    TRITONSERVER_InferenceResponse* response, const char** model_name, int64_t* model_version) {
  RESPONSE(response);
  *model_name = response->model_name;
  *model_version = response->model_version;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseId(
    TRITONSERVER_InferenceResponse* response, const char** request_id) {
  RESPONSE(response);
  *request_id = response->id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseParameterCount(
    TRITONSERVER_InferenceResponse* response, uint32_t* count) {
  RESPONSE(response);
  *count = response->parameter_count;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseParameter(
    TRITONSERVER_InferenceResponse* response, const uint32_t index, const char** name,
    TRITONSERVER_ParameterType* type, const void** vvalue) {
  RESPONSE(response);
  if (index >= response->parameter_count)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: response has %u parameters", index,
                      response->parameter_count);
  TRITONSERVER_Parameter* p = response->parameters[index];
  *name = p->name;
  *type = p->type;
  switch (p->type) {
    case TRITONSERVER_PARAMETER_STRING: *vvalue = p->string_value; break;
    case TRITONSERVER_PARAMETER_INT: *vvalue = &p->int_value; break;
    case TRITONSERVER_PARAMETER_BOOL: *vvalue = &p->bool_value; break;
    case TRITONSERVER_PARAMETER_DOUBLE: *vvalue = &p->double_value; break;
    case TRITONSERVER_PARAMETER_BYTES: *vvalue = p->bytes; break;
  }
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputCount(
    TRITONSERVER_InferenceResponse* response, uint32_t* count) {
  RESPONSE(response);
  *count = response->output_count;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutput(
    TRITONSERVER_InferenceResponse* response, const uint32_t index, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count,
    const void** base, size_t* byte_size, TRITONSERVER_MemoryType* memory_type,
    int64_t* memory_type_id, void** userp) {
  RESPONSE(response);
  if (index >= response->output_count)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: response has %u outputs", index,
                      response->output_count);
  CallOutput* out = &response->outputs[index];
  *name = out->name;
  *datatype = out->datatype;
  *shape = out->shape;
  *dim_count = out->dims_count;
  *base = out->buffer;
  *byte_size = out->byte_size;
  *memory_type = out->memory_type;
  *memory_type_id = out->memory_type_id;
  *userp = out->buffer_userp;
  return NULL;
}

/* the label of class class_index of output index, as the called model's label_filename gives
 * it (read by the broker at load, asked for once per response); null where it has none */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputClassificationLabel(
    TRITONSERVER_InferenceResponse* response, const uint32_t index, const size_t class_index,
    const char** label) {
  RESPONSE(response);
  HOST_NOT_NULL(label, "label");
  if (index >= response->output_count)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: response has %u outputs", index,
                      response->output_count);
  *label = NULL;
  if (host_bridge.labels == NULL)
    return host_error(TRITONSERVER_ERROR_UNAVAILABLE, "the server cannot be asked: no backend is loaded");
  TRITONSERVER_Error* error = NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (response->labels == NULL) {
    PyObject* labels = PyObject_CallFunction(host_bridge.labels, "sL", response->model_name,
                                             (long long)response->model_version);
    if (labels == NULL) error = host_python_error("TRITONSERVER_InferenceResponseOutputClassificationLabel");
    else if (!PyDict_Check(labels)) {
      Py_DECREF(labels);
      error = host_error(TRITONSERVER_ERROR_INTERNAL, "the server's labels are not a dict");
    } else {
      response->labels = labels;
    }
  }
  if (error == NULL) {
    PyObject* found = PyDict_GetItemString(response->labels, response->outputs[index].name);
    if (found != NULL && PyList_Check(found) && class_index < (size_t)PyList_Size(found)) {
      const char* text = PyUnicode_AsUTF8(PyList_GET_ITEM(found, (Py_ssize_t)class_index));
      if (text == NULL) PyErr_Clear();
      else if (text[0] != '\0') *label = text; /* an empty line: the class has no label */
    }
  }
  PyGILState_Release(gil);
  return error;
}
