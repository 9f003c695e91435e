/* A C identity backend that calls every request and response function of the API:
 * OUTPUT<i> answers INPUT<i>; each request parameter comes back as echo_<key>; the
 * response also carries one parameter of each kind; a custom metric counts input bytes;
 * statistics are reported per request and per batch; the backend's config comes back as
 * backend_config. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triton/core/tritonbackend.h"

#define CHECK(X)                                   \
  do {                                             \
    TRITONSERVER_Error* check_err__ = (X);         \
    if (check_err__ != NULL) return check_err__;   \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* the backend's state: its config, and its metric family (made at backend level, as
 * Triton's identity backend makes it) */
typedef struct {
  char* config;
  TRITONSERVER_MetricFamily* family;
} BackendState;

typedef struct {
  TRITONSERVER_Metric* bytes;
  uint64_t executions;
  const char* backend_config;
} ModelState;

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  uint32_t major, minor;
  CHECK(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "api version");
  const char* name;
  CHECK(TRITONBACKEND_BackendName(backend, &name));
  TRITONSERVER_Message* config;
  CHECK(TRITONBACKEND_BackendConfig(backend, &config));
  const char* json;
  size_t size;
  CHECK(TRITONSERVER_MessageSerializeToJson(config, &json, &size));
  char line[512];
  snprintf(line, sizeof(line), "backend %s config %.*s", name, (int)size, json);
  if (TRITONSERVER_LogIsEnabled(TRITONSERVER_LOG_INFO))
    CHECK(TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__, line));
  BackendState* state = calloc(1, sizeof(*state));
  state->config = strndup(json, size);
  CHECK(TRITONSERVER_MessageDelete(config));
  CHECK(TRITONSERVER_MetricFamilyNew(&state->family, TRITONSERVER_METRIC_KIND_COUNTER,
                                     "echo_input_bytes", "input bytes the echo backend read"));
  CHECK(TRITONBACKEND_BackendSetState(backend, state));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend* backend) {
  void* vstate;
  CHECK(TRITONBACKEND_BackendState(backend, &vstate));
  BackendState* state = vstate;
  CHECK(TRITONSERVER_MetricFamilyDelete(state->family));
  free(state->config);
  free(state);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name;
  uint64_t version;
  TRITONBACKEND_ArtifactType type;
  const char* location;
  CHECK(TRITONBACKEND_ModelName(model, &name));
  CHECK(TRITONBACKEND_ModelVersion(model, &version));
  CHECK(TRITONBACKEND_ModelRepository(model, &type, &location));
  TRITONSERVER_Message* config;
  CHECK(TRITONBACKEND_ModelConfig(model, 1, &config));
  const char* json;
  size_t size;
  CHECK(TRITONSERVER_MessageSerializeToJson(config, &json, &size));
  int named = strstr(json, "\"max_batch_size\"") != NULL;
  CHECK(TRITONSERVER_MessageDelete(config));
  if (!named)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "config has no max_batch_size");
  TRITONBACKEND_Backend* backend;
  CHECK(TRITONBACKEND_ModelBackend(model, &backend));
  ModelState* state = calloc(1, sizeof(*state));
  void* vbackend;
  CHECK(TRITONBACKEND_BackendState(backend, &vbackend));
  BackendState* backend_state = vbackend;
  state->backend_config = backend_state->config;
  char version_text[32];
  snprintf(version_text, sizeof(version_text), "%llu", (unsigned long long)version);
  const TRITONSERVER_Parameter* labels[2] = {
      TRITONSERVER_ParameterNew("model", TRITONSERVER_PARAMETER_STRING, name),
      TRITONSERVER_ParameterNew("version", TRITONSERVER_PARAMETER_STRING, version_text)};
  CHECK(TRITONSERVER_MetricNew(&state->bytes, backend_state->family, labels, 2));
  TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter*)labels[0]);
  TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter*)labels[1]);
  return TRITONBACKEND_ModelSetState(model, state);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* vstate;
  CHECK(TRITONBACKEND_ModelState(model, &vstate));
  ModelState* state = vstate;
  CHECK(TRITONSERVER_MetricDelete(state->bytes));
  free(state);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  const char* name;
  TRITONSERVER_InstanceGroupKind kind;
  int32_t device;
  CHECK(TRITONBACKEND_ModelInstanceName(instance, &name));
  CHECK(TRITONBACKEND_ModelInstanceKind(instance, &kind));
  CHECK(TRITONBACKEND_ModelInstanceDeviceId(instance, &device));
  if (kind != TRITONSERVER_INSTANCEGROUPKIND_CPU)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                 "echo backend only supports CPU instances");
  TRITONBACKEND_Model* model;
  CHECK(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* state;
  CHECK(TRITONBACKEND_ModelState(model, &state));
  TRITONSERVER_BufferAttributes* usage; /* 4 KiB of host memory, reported */
  CHECK(TRITONSERVER_BufferAttributesNew(&usage));
  CHECK(TRITONSERVER_BufferAttributesSetMemoryType(usage, TRITONSERVER_MEMORY_CPU));
  CHECK(TRITONSERVER_BufferAttributesSetMemoryTypeId(usage, 0));
  CHECK(TRITONSERVER_BufferAttributesSetByteSize(usage, 4096));
  CHECK(TRITONBACKEND_ModelInstanceReportMemoryUsage(instance, &usage, 1));
  CHECK(TRITONSERVER_BufferAttributesDelete(usage));
  return TRITONBACKEND_ModelInstanceSetState(instance, state);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  (void)instance;
  return NULL;
}

static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                  uint64_t* read) {
  const char* id;
  uint64_t correlation;
  uint32_t flags, inputs, outputs, parameters;
  uint64_t timeout;
  bool cancelled;
  TRITONSERVER_InferenceTrace* trace;
  CHECK(TRITONBACKEND_RequestId(request, &id));
  TRITONSERVER_Error* corr_error = TRITONBACKEND_RequestCorrelationId(request, &correlation);
  if (corr_error != NULL) { /* a string correlation id */
    TRITONSERVER_ErrorDelete(corr_error);
    const char* text;
    CHECK(TRITONBACKEND_RequestCorrelationIdString(request, &text));
    CHECK(TRITONBACKEND_ResponseSetStringParameter(response, "correlation_id", text));
  } else {
    CHECK(TRITONBACKEND_ResponseSetIntParameter(response, "correlation_id", (int64_t)correlation));
  }
  CHECK(TRITONBACKEND_RequestFlags(request, &flags));
  CHECK(TRITONBACKEND_InferenceRequestTimeoutMicroseconds(request, &timeout));
  CHECK(TRITONBACKEND_RequestIsCancelled(request, &cancelled));
  CHECK(TRITONBACKEND_RequestTrace(request, &trace));
  CHECK(TRITONBACKEND_RequestInputCount(request, &inputs));
  CHECK(TRITONBACKEND_RequestOutputCount(request, &outputs));
  CHECK(TRITONBACKEND_RequestParameterCount(request, &parameters));
  for (uint32_t p = 0; p < parameters; p++) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* value;
    CHECK(TRITONBACKEND_RequestParameter(request, p, &key, &type, &value));
    char echoed[256];
    snprintf(echoed, sizeof(echoed), "echo_%s", key);
    switch (type) {
      case TRITONSERVER_PARAMETER_STRING:
        CHECK(TRITONBACKEND_ResponseSetStringParameter(response, echoed, value));
        break;
      case TRITONSERVER_PARAMETER_INT:
        CHECK(TRITONBACKEND_ResponseSetIntParameter(response, echoed, *(const int64_t*)value));
        break;
      case TRITONSERVER_PARAMETER_BOOL:
        CHECK(TRITONBACKEND_ResponseSetBoolParameter(response, echoed, *(const bool*)value));
        break;
      default:
        CHECK(TRITONBACKEND_ResponseSetDoubleParameter(response, echoed, *(const double*)value));
    }
  }
  for (uint32_t i = 0; i < inputs; i++) { /* every way of reaching an input agrees */
    const char* name;
    TRITONBACKEND_Input *by_index, *by_name;
    CHECK(TRITONBACKEND_RequestInputName(request, i, &name));
    CHECK(TRITONBACKEND_RequestInputByIndex(request, i, &by_index));
    CHECK(TRITONBACKEND_RequestInput(request, name, &by_name));
    if (by_index != by_name)
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "inputs disagree");
  }
  for (uint32_t o = 0; o < outputs; o++) {
    const char* output_name;
    CHECK(TRITONBACKEND_RequestOutputName(request, o, &output_name));
    size_t preferred_size;
    TRITONSERVER_MemoryType preferred_type;
    int64_t preferred_id;
    CHECK(TRITONBACKEND_RequestOutputBufferProperties(request, output_name, &preferred_size,
                                                      &preferred_type, &preferred_id));
    char input_name[256];
    snprintf(input_name, sizeof(input_name), "INPUT%s", output_name + strlen("OUTPUT"));
    TRITONBACKEND_Input* input;
    CHECK(TRITONBACKEND_RequestInput(request, input_name, &input));
    const char* name;
    TRITONSERVER_DataType datatype;
    const int64_t* shape;
    uint32_t dims, buffers;
    uint64_t byte_size;
    CHECK(TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &dims, &byte_size,
                                        &buffers));
    TRITONBACKEND_Output* output;
    CHECK(TRITONBACKEND_ResponseOutput(response, &output, output_name, datatype, shape, dims));
    void* out;
    TRITONSERVER_MemoryType out_type = TRITONSERVER_MEMORY_CPU;
    int64_t out_id = 0;
    CHECK(TRITONBACKEND_OutputBuffer(output, &out, byte_size, &out_type, &out_id));
    TRITONSERVER_BufferAttributes* attributes;
    CHECK(TRITONBACKEND_OutputBufferAttributes(output, &attributes));
    uint64_t copied = 0;
    for (uint32_t b = 0; b < buffers; b++) {
      const void* in;
      uint64_t in_size;
      TRITONSERVER_MemoryType in_type = TRITONSERVER_MEMORY_CPU;
      int64_t in_id = 0;
      CHECK(TRITONBACKEND_InputBuffer(input, b, &in, &in_size, &in_type, &in_id));
      memcpy((char*)out + copied, in, in_size);
      copied += in_size;
    }
    *read += byte_size;
  }
  CHECK(TRITONBACKEND_ResponseSetStringParameter(response, "param0", "an example string parameter"));
  CHECK(TRITONBACKEND_ResponseSetIntParameter(response, "param1", 42));
  CHECK(TRITONBACKEND_ResponseSetBoolParameter(response, "param2", false));
  CHECK(TRITONBACKEND_ResponseSetDoubleParameter(response, "param3", 123.123));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  uint64_t exec_start = now_ns();
  void* vstate;
  CHECK(TRITONBACKEND_ModelInstanceState(instance, &vstate));
  ModelState* state = vstate;
  state->executions++;
  uint64_t read = 0;
  uint64_t compute_end = now_ns();
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Response* response;
    CHECK(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* error = answer(requests[r], response, &read);
    if (error == NULL)
      error = TRITONBACKEND_ResponseSetStringParameter(response, "backend_config",
                                                       state->backend_config);
    TRITONSERVER_Error* sent =
        TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error);
    if (sent != NULL) {
      TRITONSERVER_LogMessage(TRITONSERVER_LOG_ERROR, __FILE__, __LINE__,
                              TRITONSERVER_ErrorMessage(sent));
      TRITONSERVER_ErrorDelete(sent);
    }
    uint64_t exec_end = now_ns();
    CHECK(TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[r], error == NULL,
                                                      exec_start, exec_start, compute_end,
                                                      exec_end));
    TRITONSERVER_ErrorDelete(error);
    CHECK(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  CHECK(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, request_count, exec_start,
                                                         exec_start, compute_end, now_ns()));
  if (read > 0) {
    CHECK(TRITONSERVER_MetricIncrement(state->bytes, (double)read));
    double value;
    CHECK(TRITONSERVER_MetricValue(state->bytes, &value));
  }
  return NULL;
}
