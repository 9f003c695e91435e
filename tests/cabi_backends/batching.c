/* A backend that also defines Triton's custom batching functions (a strategy that takes a
 * request while the batch stays under a byte budget): inferpool's broker never calls them,
 * so a model served by this library, or with it as its batchstrategy.so, fails to load. */
#include <stdlib.h>

#include "triton/core/tritonbackend.h"

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                         TRITONBACKEND_Model* model) {
  (void)model;
  *batcher = NULL;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher) {
  (void)batcher;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher,
                                                       void** userp) {
  (void)batcher;
  *userp = calloc(1, sizeof(uint64_t));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {
  free(userp);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request,
                                                           void* userp, bool* should_include) {
  (void)request;
  uint64_t* taken = userp;
  *should_include = ++*taken <= 2;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  (void)instance;
  for (uint32_t r = 0; r < request_count; r++)
    TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);
  return NULL;
}
