/* A decoupled C backend, as Triton's repeat backend: for each request a thread of the
 * backend's own sends one response per element of IN (OUT = the element, IDX = its index),
 * then the final flag alone, and releases the request. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

typedef struct {
  TRITONBACKEND_Request* request;
  TRITONBACKEND_ResponseFactory* factory;
  int32_t* values;
  uint32_t count;
} Job;

static TRITONSERVER_Error* respond(Job* job, uint32_t index) {
  TRITONBACKEND_Response* response;
  CHECK(TRITONBACKEND_ResponseNewFromFactory(&response, job->factory));
  const int64_t shape[1] = {1};
  TRITONBACKEND_Output* out;
  void* buffer;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  CHECK(TRITONBACKEND_ResponseOutput(response, &out, "OUT", TRITONSERVER_TYPE_INT32, shape, 1));
  CHECK(TRITONBACKEND_OutputBuffer(out, &buffer, sizeof(int32_t), &type, &id));
  memcpy(buffer, &job->values[index], sizeof(int32_t));
  CHECK(TRITONBACKEND_ResponseOutput(response, &out, "IDX", TRITONSERVER_TYPE_UINT32, shape, 1));
  CHECK(TRITONBACKEND_OutputBuffer(out, &buffer, sizeof(uint32_t), &type, &id));
  memcpy(buffer, &index, sizeof(uint32_t));
  return TRITONBACKEND_ResponseSend(response, 0, NULL);
}

static void* run(void* arg) {
  Job* job = arg;
  for (uint32_t i = 0; i < job->count; i++) {
    bool cancelled = false;
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryIsCancelled(job->factory, &cancelled));
    if (cancelled) break;
    TRITONSERVER_Error* err = respond(job, i);
    if (err != NULL) {
      TRITONSERVER_LogMessage(TRITONSERVER_LOG_ERROR, __FILE__, __LINE__,
                              TRITONSERVER_ErrorMessage(err));
      TRITONSERVER_ErrorDelete(err);
    }
  }
  TRITONSERVER_ErrorDelete(
      TRITONBACKEND_ResponseFactorySendFlags(job->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
  TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryDelete(job->factory));
  TRITONSERVER_ErrorDelete(
      TRITONBACKEND_RequestRelease(job->request, TRITONSERVER_REQUEST_RELEASE_ALL));
  free(job->values);
  free(job);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  (void)instance;
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Input* input;
    CHECK(TRITONBACKEND_RequestInput(requests[r], "IN", &input));
    uint64_t byte_size;
    CHECK(TRITONBACKEND_InputProperties(input, NULL, NULL, NULL, NULL, &byte_size, NULL));
    const void* buffer;
    uint64_t size;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t id = 0;
    CHECK(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &type, &id));
    Job* job = calloc(1, sizeof(*job));
    job->request = requests[r];
    job->count = (uint32_t)(byte_size / sizeof(int32_t));
    job->values = malloc(byte_size ? byte_size : 1);
    memcpy(job->values, buffer, byte_size);
    CHECK(TRITONBACKEND_ResponseFactoryNew(&job->factory, requests[r]));
    pthread_t thread;
    pthread_create(&thread, NULL, run, job);
    pthread_detach(thread);
  }
  return NULL;
}
