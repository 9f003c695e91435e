/* The C identity backend of scripts/bench_c_backends.py: what Triton's identity backend
 * calls per request (id, inputs and their properties and buffers, the requested outputs, a
 * response with its output and four parameters, statistics, release) and per batch (batch
 * statistics, a custom metric), counting its calls into the API.
 *
 * A request with the parameter "probe" times the API instead: each call it can repeat is
 * made PROBE_CALLS times, PROBE_ROUNDS times over, and the median ns per call of each comes
 * back as a response parameter, with the calls per request and per batch counted so far. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triton/core/tritonbackend.h"

#define PROBE_CALLS 200
#define PROBE_ROUNDS 15

static uint64_t calls, requests_seen, batches_seen, batch_calls;
#define API(X) (calls++, (X))
#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct {
  TRITONSERVER_MetricFamily* family;
  TRITONSERVER_Metric* bytes;
} State;

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  State* state = (State*)calloc(1, sizeof(*state));
  const char* name;
  CHECK(TRITONBACKEND_ModelName(model, &name));
  CHECK(TRITONSERVER_MetricFamilyNew(&state->family, TRITONSERVER_METRIC_KIND_COUNTER,
                                     "c_identity_input_bytes", "input bytes"));
  const TRITONSERVER_Parameter* label =
      TRITONSERVER_ParameterNew("model", TRITONSERVER_PARAMETER_STRING, name);
  CHECK(TRITONSERVER_MetricNew(&state->bytes, state->family, &label, 1));
  TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter*)label);
  return TRITONBACKEND_ModelSetState(model, state);
}

static int compare(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

#define TIMED(NAME, BODY)                                                             \
  do {                                                                                \
    uint64_t rounds[PROBE_ROUNDS];                                                    \
    for (int r = 0; r < PROBE_ROUNDS; r++) {                                          \
      uint64_t t0 = now_ns();                                                         \
      for (int k = 0; k < PROBE_CALLS; k++) { BODY; }                                 \
      rounds[r] = now_ns() - t0;                                                      \
    }                                                                                 \
    qsort(rounds, PROBE_ROUNDS, sizeof(uint64_t), compare);                           \
    CHECK(TRITONBACKEND_ResponseSetDoubleParameter(                                   \
        response, NAME, (double)rounds[PROBE_ROUNDS / 2] / PROBE_CALLS));             \
  } while (0)

static TRITONSERVER_Error* probe(TRITONBACKEND_ModelInstance* instance,
                                 TRITONBACKEND_Request* request, State* state,
                                 TRITONBACKEND_Response* response) {
  (void)instance;
  const char* id;
  bool cancelled;
  TRITONBACKEND_Input* input;
  const char* name;
  TRITONSERVER_DataType datatype;
  const int64_t* shape;
  uint32_t dims;
  uint64_t byte_size, size;
  const void* buffer;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t type_id = 0;
  CHECK(TRITONBACKEND_RequestInput(request, "INPUT0", &input));
  TIMED("ns_RequestId", CHECK(TRITONBACKEND_RequestId(request, &id)));
  TIMED("ns_RequestInput", CHECK(TRITONBACKEND_RequestInput(request, "INPUT0", &input)));
  TIMED("ns_InputProperties",
        CHECK(TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &dims, &byte_size,
                                            NULL)));
  TIMED("ns_InputBuffer",
        CHECK(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &type, &type_id)));
  TIMED("ns_RequestOutputName", CHECK(TRITONBACKEND_RequestOutputName(request, 0, &name)));
  TIMED("ns_RequestIsCancelled", CHECK(TRITONBACKEND_RequestIsCancelled(request, &cancelled)));
  TIMED("ns_MetricIncrement", CHECK(TRITONSERVER_MetricIncrement(state->bytes, 0)));
  TIMED("ns_LogIsEnabled", (void)TRITONSERVER_LogIsEnabled(TRITONSERVER_LOG_VERBOSE));
  /* a response made, given an output and its buffer, then deleted (its memory given back) */
  TIMED("ns_ResponseNew+Output+OutputBuffer+Delete", {
    TRITONBACKEND_Response* scratch;
    TRITONBACKEND_Output* output;
    void* out;
    CHECK(TRITONBACKEND_ResponseNew(&scratch, request));
    CHECK(TRITONBACKEND_ResponseOutput(scratch, &output, "OUTPUT0", datatype, shape, dims));
    CHECK(TRITONBACKEND_OutputBuffer(output, &out, byte_size, &type, &type_id));
    CHECK(TRITONBACKEND_ResponseDelete(scratch));
  });
  TIMED("ns_ResponseNew+Delete", {
    TRITONBACKEND_Response* scratch;
    CHECK(TRITONBACKEND_ResponseNew(&scratch, request));
    CHECK(TRITONBACKEND_ResponseDelete(scratch));
  });
  TIMED("ns_ResponseSetStringParameter", {
    TRITONBACKEND_Response* scratch;
    CHECK(TRITONBACKEND_ResponseNew(&scratch, request));
    CHECK(TRITONBACKEND_ResponseSetStringParameter(scratch, "p", "v"));
    CHECK(TRITONBACKEND_ResponseDelete(scratch));
  });
  CHECK(TRITONBACKEND_ResponseSetDoubleParameter(
      response, "calls_per_request",
      requests_seen ? (double)(calls - batch_calls) / (double)requests_seen : 0));
  CHECK(TRITONBACKEND_ResponseSetDoubleParameter(
      response, "calls_per_batch", batches_seen ? (double)batch_calls / batches_seen : 0));
  return NULL;
}

static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request,
                                  TRITONBACKEND_Response* response, uint64_t* read) {
  const char* id;
  uint32_t inputs, outputs;
  CHECK(API(TRITONBACKEND_RequestId(request, &id)));
  CHECK(API(TRITONBACKEND_RequestInputCount(request, &inputs)));
  CHECK(API(TRITONBACKEND_RequestOutputCount(request, &outputs)));
  for (uint32_t o = 0; o < outputs; o++) {
    const char* output_name;
    CHECK(API(TRITONBACKEND_RequestOutputName(request, o, &output_name)));
    TRITONBACKEND_Input* input;
    CHECK(API(TRITONBACKEND_RequestInput(request, "INPUT0", &input)));
    TRITONSERVER_DataType datatype;
    const int64_t* shape;
    uint32_t dims, count;
    uint64_t byte_size;
    CHECK(API(TRITONBACKEND_InputProperties(input, NULL, &datatype, &shape, &dims, &byte_size,
                                            &count)));
    TRITONBACKEND_Output* output;
    CHECK(API(TRITONBACKEND_ResponseOutput(response, &output, output_name, datatype, shape,
                                           dims)));
    void* out;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    CHECK(API(TRITONBACKEND_OutputBuffer(output, &out, byte_size, &type, &type_id)));
    const void* in;
    uint64_t size;
    CHECK(API(TRITONBACKEND_InputBuffer(input, 0, &in, &size, &type, &type_id)));
    memcpy(out, in, size);
    *read += size;
  }
  CHECK(API(TRITONBACKEND_ResponseSetStringParameter(response, "param0",
                                                     "an example string parameter")));
  CHECK(API(TRITONBACKEND_ResponseSetIntParameter(response, "param1", 42)));
  CHECK(API(TRITONBACKEND_ResponseSetBoolParameter(response, "param2", false)));
  CHECK(API(TRITONBACKEND_ResponseSetDoubleParameter(response, "param3", 123.123)));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  uint64_t exec_start = now_ns();
  TRITONBACKEND_Model* model;
  CHECK(TRITONBACKEND_ModelInstanceModel(instance, &model));
  State* state;
  CHECK(TRITONBACKEND_ModelState(model, (void**)&state));
  uint64_t read = 0;
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Response* response;
    CHECK(API(TRITONBACKEND_ResponseNew(&response, requests[r])));
    uint32_t parameters;
    CHECK(TRITONBACKEND_RequestParameterCount(requests[r], &parameters));
    TRITONSERVER_Error* err = parameters > 0 ? probe(instance, requests[r], state, response)
                                             : answer(requests[r], response, &read);
    uint64_t compute_end = now_ns();
    CHECK(API(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err)));
    CHECK(API(TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[r], err == NULL,
                                                          exec_start, exec_start, compute_end,
                                                          now_ns())));
    TRITONSERVER_ErrorDelete(err);
    CHECK(API(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL)));
    if (parameters == 0) requests_seen++;
  }
  uint64_t before = calls;
  uint64_t end = now_ns();
  CHECK(API(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, request_count, exec_start,
                                                             exec_start, end, end)));
  CHECK(API(TRITONSERVER_MetricIncrement(state->bytes, (double)read)));
  batch_calls += calls - before;
  batches_seen++;
  return NULL;
}
