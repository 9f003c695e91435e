/* A C backend that completes its model's config (Triton's auto-complete): a config.pbtxt
 * naming only the backend gets its input, output and max_batch_size from the backend,
 * through TRITONBACKEND_ModelSetConfig.  Execute doubles INPUT0 into OUTPUT0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

static const char ADDED[] =
    ",\"max_batch_size\":4,"
    "\"input\":[{\"name\":\"INPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[3]}],"
    "\"output\":[{\"name\":\"OUTPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[3]}]}";

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  bool complete;
  CHECK(TRITONBACKEND_ModelAutoCompleteConfig(model, &complete));
  if (!complete) return NULL;
  TRITONSERVER_Message* config;
  CHECK(TRITONBACKEND_ModelConfig(model, 1, &config));
  const char* json;
  size_t size;
  CHECK(TRITONSERVER_MessageSerializeToJson(config, &json, &size));
  /* the same object with the fields added last (a later key wins) */
  char* completed = malloc(size + sizeof(ADDED));
  const char* end = strrchr(json, '}');
  size_t head = (size_t)(end - json);
  memcpy(completed, json, head);
  memcpy(completed + head, ADDED, sizeof(ADDED));
  CHECK(TRITONSERVER_MessageDelete(config));
  TRITONSERVER_Message* message;
  CHECK(TRITONSERVER_MessageNewFromSerializedJson(&message, completed, strlen(completed)));
  free(completed);
  TRITONSERVER_Error* err = TRITONBACKEND_ModelSetConfig(model, 1, message);
  TRITONSERVER_MessageDelete(message);
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  (void)instance;
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Input* input;
    CHECK(TRITONBACKEND_RequestInput(requests[r], "INPUT0", &input));
    const int64_t* shape;
    uint32_t dims;
    uint64_t byte_size;
    CHECK(TRITONBACKEND_InputProperties(input, NULL, NULL, &shape, &dims, &byte_size, NULL));
    const void* in;
    uint64_t size;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t id = 0;
    CHECK(TRITONBACKEND_InputBuffer(input, 0, &in, &size, &type, &id));
    TRITONBACKEND_Response* response;
    CHECK(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONBACKEND_Output* out;
    void* buffer;
    CHECK(TRITONBACKEND_ResponseOutput(response, &out, "OUTPUT0", TRITONSERVER_TYPE_FP32, shape, dims));
    CHECK(TRITONBACKEND_OutputBuffer(out, &buffer, byte_size, &type, &id));
    for (uint64_t k = 0; k < byte_size / sizeof(float); k++)
      ((float*)buffer)[k] = 2.0f * ((const float*)in)[k];
    CHECK(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL));
    CHECK(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  return NULL;
}
