/* A C backend that fails in every way a backend can: INPUT0's first element picks it.
 *   0: answers (OUTPUT0 = INPUT0)
 *   1: an error response for this request only (INVALID_ARG), the batch goes on
 *   2: ModelInstanceExecute returns an error: the host answers the batch with it
 *   3: a segmentation fault mid-execute
 *   4: abort() mid-execute
 * A model whose config has the parameter "refuse" fails to load. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

static TRITONSERVER_Error* first(TRITONBACKEND_Request* request, TRITONBACKEND_Input** input,
                                 const float** data, uint64_t* size) {
  CHECK(TRITONBACKEND_RequestInput(request, "INPUT0", input));
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  CHECK(TRITONBACKEND_InputBuffer(*input, 0, (const void**)data, size, &type, &id));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  TRITONSERVER_Message* config;
  CHECK(TRITONBACKEND_ModelConfig(model, 1, &config));
  const char* json;
  size_t size;
  CHECK(TRITONSERVER_MessageSerializeToJson(config, &json, &size));
  int refuse = strstr(json, "\"refuse\"") != NULL;
  CHECK(TRITONSERVER_MessageDelete(config));
  if (refuse) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "refused by its config");
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  (void)instance;
  for (uint32_t r = 0; r < request_count; r++) { /* a failure of the batch comes first */
    TRITONBACKEND_Input* input;
    const float* data;
    uint64_t size;
    CHECK(first(requests[r], &input, &data, &size));
    int what = size >= sizeof(float) ? (int)data[0] : 0;
    if (what == 2)
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, "the device is on fire");
    if (what == 3) raise(SIGSEGV);
    if (what == 4) abort();
  }
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Input* input;
    const float* data;
    uint64_t size;
    CHECK(first(requests[r], &input, &data, &size));
    TRITONBACKEND_Response* response;
    CHECK(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* err = NULL;
    if (size >= sizeof(float) && (int)data[0] == 1) {
      err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "a one is not welcome here");
    } else {
      const int64_t* shape;
      uint32_t dims;
      CHECK(TRITONBACKEND_InputProperties(input, NULL, NULL, &shape, &dims, NULL, NULL));
      TRITONBACKEND_Output* out;
      void* buffer;
      TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
      int64_t id = 0;
      CHECK(TRITONBACKEND_ResponseOutput(response, &out, "OUTPUT0", TRITONSERVER_TYPE_FP32, shape,
                                         dims));
      CHECK(TRITONBACKEND_OutputBuffer(out, &buffer, size, &type, &id));
      memcpy(buffer, data, size);
    }
    CHECK(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
    CHECK(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  return NULL;
}
