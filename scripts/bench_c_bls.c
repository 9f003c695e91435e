/* The C BLS backend of scripts/bench_c_backends.py: what Triton's bls example does, for one
 * model.  Each request checks that "py_identity" is ready, calls it with its own INPUT0 (a
 * buffer in shared memory: passed by reference), waits in its execute for the response
 * callback, and answers with the called model's OUTPUT0. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#define TARGET "py_identity"
#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

static TRITONSERVER_ResponseAllocator* allocator;

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t done;
  TRITONSERVER_InferenceResponse* response;
  bool final;
} Waiter;

static TRITONSERVER_Error* alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* name,
                                    size_t size, TRITONSERVER_MemoryType type, int64_t type_id,
                                    void* userp, void** buffer, void** buffer_userp,
                                    TRITONSERVER_MemoryType* actual_type, int64_t* actual_id) {
  (void)a, (void)name, (void)type, (void)userp;
  *buffer = malloc(size ? size : 1);
  *buffer_userp = NULL;
  *actual_type = TRITONSERVER_MEMORY_CPU;
  *actual_id = type_id;
  return NULL;
}

static TRITONSERVER_Error* release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                      void* buffer_userp, size_t size,
                                      TRITONSERVER_MemoryType type, int64_t type_id) {
  (void)a, (void)buffer_userp, (void)size, (void)type, (void)type_id;
  free(buffer);
  return NULL;
}

static void released(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp) {
  (void)flags, (void)userp;
  TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(request));
}

static void completed(TRITONSERVER_InferenceResponse* response, const uint32_t flags,
                      void* userp) {
  Waiter* w = userp;
  pthread_mutex_lock(&w->lock);
  if (response != NULL) w->response = response;
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) w->final = true;
  pthread_cond_signal(&w->done);
  pthread_mutex_unlock(&w->lock);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  (void)model;
  return TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  (void)model;
  return TRITONSERVER_ResponseAllocatorDelete(allocator);
}

static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                  TRITONSERVER_Server* server) {
  bool ready = false;
  CHECK(TRITONSERVER_ServerModelIsReady(server, TARGET, -1, &ready));
  if (!ready) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, TARGET " is not ready");
  TRITONBACKEND_Input* input;
  const char* name;
  TRITONSERVER_DataType datatype;
  const int64_t* shape;
  uint32_t dims;
  const void* data;
  uint64_t size;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t type_id = 0;
  CHECK(TRITONBACKEND_RequestInput(request, "INPUT0", &input));
  CHECK(TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &dims, NULL, NULL));
  CHECK(TRITONBACKEND_InputBuffer(input, 0, &data, &size, &type, &type_id));
  TRITONSERVER_InferenceRequest* irequest;
  CHECK(TRITONSERVER_InferenceRequestNew(&irequest, server, TARGET, -1));
  CHECK(TRITONSERVER_InferenceRequestAddInput(irequest, name, datatype, shape, dims));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(irequest, name, data, size, type, type_id));
  CHECK(TRITONSERVER_InferenceRequestAddRequestedOutput(irequest, "OUTPUT0"));
  CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(irequest, released, NULL));
  Waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false};
  CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(irequest, allocator, NULL, completed, &w));
  CHECK(TRITONSERVER_ServerInferAsync(server, irequest, NULL));
  pthread_mutex_lock(&w.lock);
  while (!w.final) pthread_cond_wait(&w.done, &w.lock);
  pthread_mutex_unlock(&w.lock);
  TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseError(w.response);
  const void* base;
  size_t out_size;
  uint64_t out_dims;
  const char* out_name;
  void* userp;
  if (err == NULL)
    err = TRITONSERVER_InferenceResponseOutput(w.response, 0, &out_name, &datatype, &shape,
                                               &out_dims, &base, &out_size, &type, &type_id,
                                               &userp);
  TRITONBACKEND_Output* output;
  void* buffer;
  if (err == NULL)
    err = TRITONBACKEND_ResponseOutput(response, &output, "OUTPUT0", datatype, shape,
                                       (uint32_t)out_dims);
  type = TRITONSERVER_MEMORY_CPU;
  if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, out_size, &type, &type_id);
  if (err == NULL) memcpy(buffer, base, out_size);
  TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceResponseDelete(w.response));
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  TRITONBACKEND_Model* model;
  TRITONSERVER_Server* server;
  CHECK(TRITONBACKEND_ModelInstanceModel(instance, &model));
  CHECK(TRITONBACKEND_ModelServer(model, &server));
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Response* response;
    CHECK(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* err = answer(requests[r], response, server);
    CHECK(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
    CHECK(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  return NULL;
}
