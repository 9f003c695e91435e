/* A sequence C backend with implicit state: OUTPUT = INPUT + the state the sequence carries
 * (INPUT_STATE, zeros at its start); the new sum becomes the state (OUTPUT_STATE) through
 * TRITONBACKEND_StateNew, StateBuffer and StateUpdate.  An INPUT of -1 fails the execute
 * once the state's buffer is taken. */
#include <string.h>

#include "triton/core/tritonbackend.h"

#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

static TRITONSERVER_Error* read_int(TRITONBACKEND_Request* request, const char* name,
                                    int32_t* value) {
  TRITONBACKEND_Input* input;
  CHECK(TRITONBACKEND_RequestInput(request, name, &input));
  const void* buffer;
  uint64_t size;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  CHECK(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &type, &id));
  memcpy(value, buffer, sizeof(int32_t));
  return NULL;
}

static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request,
                                  TRITONBACKEND_Response* response) {
  int32_t value, state;
  CHECK(read_int(request, "INPUT", &value));
  CHECK(read_int(request, "INPUT_STATE", &state));
  int32_t sum = value + state;
  const int64_t shape[1] = {1};
  TRITONBACKEND_State* next;
  void* buffer;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  CHECK(TRITONBACKEND_StateNew(&next, request, "OUTPUT_STATE", TRITONSERVER_TYPE_INT32, shape, 1));
  CHECK(TRITONBACKEND_StateBuffer(next, &buffer, sizeof(int32_t), &type, &id));
  if (value == -1) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "minus one");
  memcpy(buffer, &sum, sizeof(int32_t));
  CHECK(TRITONBACKEND_StateUpdate(next));
  TRITONBACKEND_Output* out;
  CHECK(TRITONBACKEND_ResponseOutput(response, &out, "OUTPUT", TRITONSERVER_TYPE_INT32, shape, 1));
  CHECK(TRITONBACKEND_OutputBuffer(out, &buffer, sizeof(int32_t), &type, &id));
  memcpy(buffer, &sum, sizeof(int32_t));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  (void)instance;
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Response* response;
    CHECK(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* err = answer(requests[r], response);
    if (err != NULL && strcmp(TRITONSERVER_ErrorMessage(err), "minus one") == 0) {
      TRITONBACKEND_ResponseDelete(response);
      return err; /* the batch fails: its requests are the server's again */
    }
    TRITONSERVER_ErrorDelete(
        TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
    CHECK(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  return NULL;
}
