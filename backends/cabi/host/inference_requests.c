/* Requests a backend makes to other models of the server (Triton's BLS from C): the
 * TRITONSERVER_InferenceRequest a backend fills, and the response allocator it hands over.
 * Everything here is C; ServerInferAsync (calls.c) hands a filled request to Python. */
#include <string.h>

#include "host.h"

void host_grow(void** items, size_t item_size, size_t count, size_t* capacity) {
  if (count < *capacity) return;
  *capacity = *capacity ? *capacity * 2 : 4;
  void* grown = realloc(*items, item_size * *capacity);
  if (grown == NULL) abort();
  *items = grown;
}

#define GROW(array, count, capacity) \
  host_grow((void**)&(array), sizeof(*(array)), (count), &(capacity))

/* ------------------------------------------------------------------ the response allocator */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorNew(
    TRITONSERVER_ResponseAllocator** allocator, TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,
    TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,
    TRITONSERVER_ResponseAllocatorStartFn_t start_fn) {
  HOST_NOT_NULL(allocator, "allocator");
  HOST_NOT_NULL(alloc_fn, "alloc_fn");
  HOST_NOT_NULL(release_fn, "release_fn");
  TRITONSERVER_ResponseAllocator* made = calloc(1, sizeof(*made));
  made->alloc_fn = alloc_fn;
  made->release_fn = release_fn;
  made->start_fn = start_fn;
  *allocator = made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction(
    TRITONSERVER_ResponseAllocator* allocator,
    TRITONSERVER_ResponseAllocatorBufferAttributesFn_t buffer_attributes_fn) {
  HOST_NOT_NULL(allocator, "allocator");
  allocator->buffer_attributes_fn = buffer_attributes_fn;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorSetQueryFunction(
    TRITONSERVER_ResponseAllocator* allocator, TRITONSERVER_ResponseAllocatorQueryFn_t query_fn) {
  HOST_NOT_NULL(allocator, "allocator");
  allocator->query_fn = query_fn;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorDelete(
    TRITONSERVER_ResponseAllocator* allocator) {
  free(allocator);
  return NULL;
}

/* ------------------------------------------------------------------ making and deleting */
TRITONSERVER_Error* host_query_model(const char* model_name, int64_t model_version,
                                     PyObject** facts);

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestNew(
    TRITONSERVER_InferenceRequest** inference_request, TRITONSERVER_Server* server,
    const char* model_name, const int64_t model_version) {
  HOST_NOT_NULL(inference_request, "inference_request");
  HOST_NOT_NULL(server, "server");
  HOST_NOT_NULL(model_name, "model_name");
  PyObject* facts = NULL; /* the model must be served, as in Triton */
  TRITONSERVER_Error* error = host_query_model(model_name, model_version, &facts);
  if (error != NULL) return error;
  TRITONSERVER_InferenceRequest* r = calloc(1, sizeof(*r));
  r->model_name = strdup(model_name);
  r->model_version = model_version;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* version = PyDict_GetItemString(facts, "version");
  r->served_version = version != NULL ? PyLong_AsLongLong(version) : model_version;
  if (PyErr_Occurred()) PyErr_Clear();
  Py_DECREF(facts);
  PyGILState_Release(gil);
  r->id = strdup("");
  *inference_request = r;
  return NULL;
}

static void input_free(CallInput* input) {
  free(input->name);
  free(input->shape);
  free(input->chunks);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestDelete(
    TRITONSERVER_InferenceRequest* r) {
  if (r == NULL) return NULL;
  if (r->in_flight)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "TRITONSERVER_InferenceRequestDelete: the request is in flight: delete it "
                      "once its release callback has been called");
  free(r->model_name);
  free(r->id);
  free(r->correlation_string);
  for (size_t k = 0; k < r->input_count; k++) input_free(&r->inputs[k]);
  free(r->inputs);
  for (size_t k = 0; k < r->output_count; k++) free(r->outputs[k]);
  free(r->outputs);
  for (size_t k = 0; k < r->parameter_count; k++) host_parameter_free(r->parameters[k]);
  free(r->parameters);
  free(r);
  return NULL;
}

/* ------------------------------------------------------------------ plain fields */
#define REQ(r) HOST_NOT_NULL(r, "inference_request")
#define GETTER(NAME, TYPE, VALUE)                                                       \
  HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequest##NAME(                 \
      TRITONSERVER_InferenceRequest* r, TYPE* value) {                                  \
    REQ(r);                                                                             \
    HOST_NOT_NULL(value, "value");                                                      \
    *value = VALUE;                                                                     \
    return NULL;                                                                        \
  }
#define SETTER(NAME, TYPE, FIELD)                                                       \
  HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSet##NAME(              \
      TRITONSERVER_InferenceRequest* r, TYPE value) {                                   \
    REQ(r);                                                                             \
    r->FIELD = value;                                                                   \
    return NULL;                                                                        \
  }

GETTER(Id, const char*, r->id)
GETTER(Flags, uint32_t, r->flags)
SETTER(Flags, uint32_t, flags)
GETTER(PriorityUInt64, uint64_t, r->priority)
SETTER(PriorityUInt64, uint64_t, priority)
GETTER(Priority, uint32_t, (uint32_t)r->priority)
SETTER(Priority, uint32_t, priority)
GETTER(TimeoutMicroseconds, uint64_t, r->timeout_us)
SETTER(TimeoutMicroseconds, uint64_t, timeout_us)
GETTER(IsCancelled, bool, r->cancelled)

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetId(
    TRITONSERVER_InferenceRequest* r, const char* id) {
  REQ(r);
  free(r->id);
  r->id = strdup(id == NULL ? "" : id);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestCorrelationId(
    TRITONSERVER_InferenceRequest* r, uint64_t* correlation_id) {
  REQ(r);
  if (r->correlation_string != NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "given request's correlation id is not an unsigned int");
  *correlation_id = r->correlation_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestCorrelationIdString(
    TRITONSERVER_InferenceRequest* r, const char** correlation_id) {
  REQ(r);
  if (r->correlation_string == NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "given request's correlation id is not a string");
  *correlation_id = r->correlation_string;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetCorrelationId(
    TRITONSERVER_InferenceRequest* r, uint64_t correlation_id) {
  REQ(r);
  free(r->correlation_string);
  r->correlation_string = NULL;
  r->correlation_id = correlation_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetCorrelationIdString(
    TRITONSERVER_InferenceRequest* r, const char* correlation_id) {
  REQ(r);
  HOST_NOT_NULL(correlation_id, "correlation_id");
  free(r->correlation_string);
  r->correlation_string = strdup(correlation_id);
  r->correlation_id = 0;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetReleaseCallback(
    TRITONSERVER_InferenceRequest* r, TRITONSERVER_InferenceRequestReleaseFn_t request_release_fn,
    void* request_release_userp) {
  REQ(r);
  r->release_fn = request_release_fn;
  r->release_userp = request_release_userp;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest* r, TRITONSERVER_ResponseAllocator* response_allocator,
    void* response_allocator_userp, TRITONSERVER_InferenceResponseCompleteFn_t response_fn,
    void* response_userp) {
  REQ(r);
  r->allocator = response_allocator;
  r->allocator_userp = response_allocator_userp;
  r->response_fn = response_fn;
  r->response_userp = response_userp;
  return NULL;
}

/* ------------------------------------------------------------------ inputs */
static CallInput* find_input(TRITONSERVER_InferenceRequest* r, const char* name) {
  for (size_t k = 0; name != NULL && k < r->input_count; k++)
    if (strcmp(r->inputs[k].name, name) == 0) return &r->inputs[k];
  return NULL;
}

/* the input added as ``name``, or Triton's error */
static TRITONSERVER_Error* added_input(TRITONSERVER_InferenceRequest* r, const char* name,
                                       CallInput** input) {
  REQ(r);
  *input = find_input(r, name);
  if (*input == NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "input '%s' does not exist in request", name ? name : "");
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddInput(
    TRITONSERVER_InferenceRequest* r, const char* name, const TRITONSERVER_DataType datatype,
    const int64_t* shape, uint64_t dim_count) {
  REQ(r);
  HOST_NOT_NULL(name, "name");
  if (find_input(r, name) != NULL)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "input '%s' already exists in request", name);
  GROW(r->inputs, r->input_count, r->input_capacity);
  CallInput* input = &r->inputs[r->input_count++];
  memset(input, 0, sizeof(*input));
  input->name = strdup(name);
  input->datatype = datatype;
  input->dims_count = dim_count;
  input->shape = host_shape_copy(shape, (uint32_t)dim_count);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRawInput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  (void)r;
  return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "TRITONSERVER_InferenceRequestAddRawInput ('%s') is not supported by "
                    "inferpool: add the input with its datatype and shape (AddInput)",
                    name ? name : "");
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveInput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  CallInput* input;
  TRITONSERVER_Error* error = added_input(r, name, &input);
  if (error != NULL) return error;
  input_free(input);
  size_t index = (size_t)(input - r->inputs);
  memmove(input, input + 1, (r->input_count - index - 1) * sizeof(*input));
  r->input_count--;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllInputs(
    TRITONSERVER_InferenceRequest* r) {
  REQ(r);
  for (size_t k = 0; k < r->input_count; k++) input_free(&r->inputs[k]);
  r->input_count = 0;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
    TRITONSERVER_InferenceRequest* r, const char* name, const void* base, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, const char* host_policy_name) {
  (void)memory_type_id;
  (void)host_policy_name; /* a worker has one host policy */
  CallInput* input;
  TRITONSERVER_Error* error = added_input(r, name, &input);
  if (error != NULL) return error;
  if (memory_type == TRITONSERVER_MEMORY_GPU)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "input '%s' in GPU memory: inferpool's host takes the inputs of a "
                      "backend's requests in CPU memory", name);
  if (byte_size > 0) HOST_NOT_NULL(base, "base");
  GROW(input->chunks, input->chunk_count, input->chunk_capacity);
  input->chunks[input->chunk_count++] = (CallChunk){base, byte_size};
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputData(
    TRITONSERVER_InferenceRequest* r, const char* name, const void* base, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id) {
  return TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
      r, name, base, byte_size, memory_type, memory_type_id, NULL);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes(
    TRITONSERVER_InferenceRequest* r, const char* name, const void* base,
    TRITONSERVER_BufferAttributes* buffer_attributes) {
  HOST_NOT_NULL(buffer_attributes, "buffer_attributes");
  return TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
      r, name, base, buffer_attributes->byte_size, buffer_attributes->memory_type,
      buffer_attributes->memory_type_id, NULL);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllInputData(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  CallInput* input;
  TRITONSERVER_Error* error = added_input(r, name, &input);
  if (error != NULL) return error;
  input->chunk_count = 0;
  return NULL;
}

/* ------------------------------------------------------------------ requested outputs */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRequestedOutput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  REQ(r);
  HOST_NOT_NULL(name, "name");
  for (size_t k = 0; k < r->output_count; k++)
    if (strcmp(r->outputs[k], name) == 0)
      return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                        "output '%s' already requested", name);
  GROW(r->outputs, r->output_count, r->output_capacity);
  r->outputs[r->output_count++] = strdup(name);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveRequestedOutput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  REQ(r);
  for (size_t k = 0; name != NULL && k < r->output_count; k++) {
    if (strcmp(r->outputs[k], name) == 0) {
      free(r->outputs[k]);
      memmove(&r->outputs[k], &r->outputs[k + 1], (r->output_count - k - 1) * sizeof(char*));
      r->output_count--;
      return NULL;
    }
  }
  return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "output '%s' does not exist in request", name ? name : "");
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs(
    TRITONSERVER_InferenceRequest* r) {
  REQ(r);
  for (size_t k = 0; k < r->output_count; k++) free(r->outputs[k]);
  r->output_count = 0;
  return NULL;
}

/* ------------------------------------------------------------------ parameters */
static TRITONSERVER_Error* set_parameter(TRITONSERVER_InferenceRequest* r, const char* key,
                                         TRITONSERVER_ParameterType type, const void* value) {
  REQ(r);
  HOST_NOT_NULL(key, "key");
  HOST_NOT_NULL(value, "value");
  for (size_t k = 0; k < r->parameter_count; k++) {
    if (strcmp(r->parameters[k]->name, key) == 0) { /* set again: the last value holds */
      host_parameter_free(r->parameters[k]);
      r->parameters[k] = TRITONSERVER_ParameterNew(key, type, value);
      return NULL;
    }
  }
  GROW(r->parameters, r->parameter_count, r->parameter_capacity);
  r->parameters[r->parameter_count++] = TRITONSERVER_ParameterNew(key, type, value);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetStringParameter(
    TRITONSERVER_InferenceRequest* request, const char* key, const char* value) {
  return set_parameter(request, key, TRITONSERVER_PARAMETER_STRING, value);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetIntParameter(
    TRITONSERVER_InferenceRequest* request, const char* key, const int64_t value) {
  return set_parameter(request, key, TRITONSERVER_PARAMETER_INT, &value);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetBoolParameter(
    TRITONSERVER_InferenceRequest* request, const char* key, const bool value) {
  return set_parameter(request, key, TRITONSERVER_PARAMETER_BOOL, &value);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetDoubleParameter(
    TRITONSERVER_InferenceRequest* request, const char* key, const double value) {
  return set_parameter(request, key, TRITONSERVER_PARAMETER_DOUBLE, &value);
}
