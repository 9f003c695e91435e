/* A BLS backend: each request calls another model of the server through Triton's
 * in-process API (TRITONSERVER_ServerInferAsync) and waits in its execute, on a condition
 * variable, for the response callback.  The model called is the request's parameter
 * "target" (default "faulty"); INPUT0 goes to it as the request's own buffer (in shared
 * memory: by reference), or, with the parameter "split" true, in two pieces (copied); its
 * OUTPUT0 comes back as OUTPUT0.  COUNTS is [requests made, requests released, output buffers allocated, output
 * buffers released] as they stood when the execute began: every earlier call is over then.
 * A failed call answers the request with an error naming where it failed and the code and
 * message the backend got.  The response callback itself asks the server whether the model
 * is ready (a callback may call the API: it runs where the reply was read).
 * With the request parameter "stream" true, the call goes to the decoupled model "repeat"
 * (IN: INPUT0 as INT32): each of its responses is read in the callback, and OUTPUT0 is
 * their OUT values; the parameters "responses" and "null_final" say how they came. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#define CHECK(X)                                 \
  do {                                           \
    TRITONSERVER_Error* check_err__ = (X);       \
    if (check_err__ != NULL) return check_err__; \
  } while (0)

static atomic_long made, released, allocated, freed;
static TRITONSERVER_ResponseAllocator* allocator;

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t done;
  TRITONSERVER_InferenceResponse* response;
  int finals;
  TRITONSERVER_Server* server;
  const char* target;
  bool ready_in_callback;
} Waiter;

static TRITONSERVER_Error* alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* name,
                                    size_t size, TRITONSERVER_MemoryType type, int64_t type_id,
                                    void* userp, void** buffer, void** buffer_userp,
                                    TRITONSERVER_MemoryType* actual_type, int64_t* actual_id) {
  (void)a, (void)name, (void)type, (void)userp;
  *buffer = malloc(size ? size : 1);
  *buffer_userp = *buffer;
  *actual_type = TRITONSERVER_MEMORY_CPU;
  *actual_id = type_id;
  atomic_fetch_add(&allocated, 1);
  return NULL;
}

static TRITONSERVER_Error* release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                      void* buffer_userp, size_t size,
                                      TRITONSERVER_MemoryType type, int64_t type_id) {
  (void)a, (void)size, (void)type, (void)type_id;
  if (buffer != buffer_userp) abort();
  free(buffer);
  atomic_fetch_add(&freed, 1);
  return NULL;
}

static void request_released(TRITONSERVER_InferenceRequest* request, const uint32_t flags,
                             void* userp) {
  (void)userp;
  if (flags != TRITONSERVER_REQUEST_RELEASE_ALL) abort();
  atomic_fetch_add(&released, 1);
  TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(request));
}

static void response_complete(TRITONSERVER_InferenceResponse* response, const uint32_t flags,
                              void* userp) {
  Waiter* w = userp;
  bool ready = false;
  TRITONSERVER_Error* err = TRITONSERVER_ServerModelIsReady(w->server, w->target, -1, &ready);
  TRITONSERVER_ErrorDelete(err);
  pthread_mutex_lock(&w->lock);
  w->ready_in_callback = err == NULL && ready;
  if (response != NULL) w->response = response;
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) w->finals++;
  pthread_cond_signal(&w->done);
  pthread_mutex_unlock(&w->lock);
}

typedef struct { /* a decoupled call's responses, as they come */
  pthread_mutex_t lock;
  pthread_cond_t done;
  float values[64];
  int count, responses;
  bool final, null_final;
} Stream;

static void stream_complete(TRITONSERVER_InferenceResponse* response, const uint32_t flags,
                            void* userp) {
  Stream* st = userp;
  pthread_mutex_lock(&st->lock);
  if (response != NULL) {
    st->responses++;
    const char* name;
    TRITONSERVER_DataType datatype;
    const int64_t* shape;
    uint64_t dims;
    const void* base;
    size_t size;
    TRITONSERVER_MemoryType type;
    int64_t type_id;
    void* buffer_userp;
    TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseOutput(
        response, 0, &name, &datatype, &shape, &dims, &base, &size, &type, &type_id, &buffer_userp);
    if (err == NULL && size == sizeof(int32_t) && st->count < 64)
      st->values[st->count++] = (float)*(const int32_t*)base;
    TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceResponseDelete(response));
  }
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) {
    st->final = true;
    st->null_final = response == NULL;
    pthread_cond_signal(&st->done);
  }
  pthread_mutex_unlock(&st->lock);
}

static TRITONSERVER_Error* add_output(TRITONBACKEND_Response* response, const char* name,
                                      TRITONSERVER_DataType datatype, const int64_t* shape,
                                      uint32_t dims, const void* data, size_t size);

static TRITONSERVER_Error* stream(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                  TRITONSERVER_Server* server) {
  TRITONBACKEND_Input* input;
  const void* data;
  uint64_t size;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t type_id = 0;
  CHECK(TRITONBACKEND_RequestInput(request, "INPUT0", &input));
  CHECK(TRITONBACKEND_InputBuffer(input, 0, &data, &size, &type, &type_id));
  int32_t in[64];
  int64_t n = (int64_t)(size / sizeof(float));
  if (n > 64) n = 64;
  for (int64_t k = 0; k < n; k++) in[k] = (int32_t)((const float*)data)[k];
  TRITONSERVER_InferenceRequest* irequest;
  CHECK(TRITONSERVER_InferenceRequestNew(&irequest, server, "repeat", -1));
  atomic_fetch_add(&made, 1);
  CHECK(TRITONSERVER_InferenceRequestAddInput(irequest, "IN", TRITONSERVER_TYPE_INT32, &n, 1));
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(irequest, "IN", in, n * sizeof(int32_t),
                                                     TRITONSERVER_MEMORY_CPU, 0));
  CHECK(TRITONSERVER_InferenceRequestAddRequestedOutput(irequest, "OUT"));
  CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(irequest, request_released, NULL));
  Stream st = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0, false, false};
  CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(irequest, allocator, NULL,
                                                         stream_complete, &st));
  CHECK(TRITONSERVER_ServerInferAsync(server, irequest, NULL));
  pthread_mutex_lock(&st.lock);
  while (!st.final) pthread_cond_wait(&st.done, &st.lock);
  pthread_mutex_unlock(&st.lock);
  const int64_t count = st.count;
  CHECK(add_output(response, "OUTPUT0", TRITONSERVER_TYPE_FP32, &count, 1, st.values,
                   st.count * sizeof(float)));
  CHECK(TRITONBACKEND_ResponseSetIntParameter(response, "responses", st.responses));
  return TRITONBACKEND_ResponseSetBoolParameter(response, "null_final", st.null_final);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  (void)model;
  return TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  (void)model;
  return TRITONSERVER_ResponseAllocatorDelete(allocator);
}

/* an error the request is answered with: where, then the code and message the backend got */
static TRITONSERVER_Error* failed(const char* where, TRITONSERVER_Error* err) {
  char text[512];
  snprintf(text, sizeof(text), "%s: %s: %s", where, TRITONSERVER_ErrorCodeString(err),
           TRITONSERVER_ErrorMessage(err));
  TRITONSERVER_Error* made_error = TRITONSERVER_ErrorNew(TRITONSERVER_ErrorCode(err), text);
  TRITONSERVER_ErrorDelete(err);
  return made_error;
}

/* the call this request makes, waited for; the response (NULL: an error for the request) */
static TRITONSERVER_Error* call(TRITONBACKEND_Request* request, TRITONSERVER_Server* server,
                                const char* target, bool split,
                                TRITONSERVER_InferenceResponse** response,
                                bool* ready_in_callback) {
  TRITONBACKEND_Input* input;
  const int64_t* shape;
  uint32_t dims;
  const void* data;
  uint64_t size;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t type_id = 0;
  CHECK(TRITONBACKEND_RequestInput(request, "INPUT0", &input));
  CHECK(TRITONBACKEND_InputProperties(input, NULL, NULL, &shape, &dims, NULL, NULL));
  CHECK(TRITONBACKEND_InputBuffer(input, 0, &data, &size, &type, &type_id));

  TRITONSERVER_InferenceRequest* irequest;
  TRITONSERVER_Error* err = TRITONSERVER_InferenceRequestNew(&irequest, server, target, -1);
  if (err != NULL) return failed("TRITONSERVER_InferenceRequestNew", err);
  atomic_fetch_add(&made, 1);
  const char* id;
  CHECK(TRITONBACKEND_RequestId(request, &id));
  CHECK(TRITONSERVER_InferenceRequestSetId(irequest, id));
  CHECK(TRITONSERVER_InferenceRequestAddInput(irequest, "INPUT0", TRITONSERVER_TYPE_FP32, shape,
                                              dims));
  size_t half = split ? (size / 2) & ~(size_t)3 : size; /* a backend may append pieces */
  CHECK(TRITONSERVER_InferenceRequestAppendInputData(irequest, "INPUT0", data, half,
                                                     TRITONSERVER_MEMORY_CPU, 0));
  if (split)
    CHECK(TRITONSERVER_InferenceRequestAppendInputData(
        irequest, "INPUT0", (const char*)data + half, size - half, TRITONSERVER_MEMORY_CPU, 0));
  CHECK(TRITONSERVER_InferenceRequestAddRequestedOutput(irequest, "OUTPUT0"));
  CHECK(TRITONSERVER_InferenceRequestSetReleaseCallback(irequest, request_released, NULL));
  Waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, server, target, false};
  CHECK(TRITONSERVER_InferenceRequestSetResponseCallback(irequest, allocator, NULL,
                                                         response_complete, &w));
  err = TRITONSERVER_ServerInferAsync(server, irequest, NULL);
  if (err != NULL) {
    TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceRequestDelete(irequest));
    return failed("TRITONSERVER_ServerInferAsync", err);
  }
  pthread_mutex_lock(&w.lock); /* the execute blocks until the callback has run */
  while (w.finals == 0) pthread_cond_wait(&w.done, &w.lock);
  pthread_mutex_unlock(&w.lock);
  *response = w.response;
  *ready_in_callback = w.ready_in_callback;
  err = TRITONSERVER_InferenceResponseError(w.response);
  if (err != NULL) {
    TRITONSERVER_InferenceResponseDelete(w.response);
    *response = NULL;
    return failed("the call", err);
  }
  return NULL;
}

static TRITONSERVER_Error* add_output(TRITONBACKEND_Response* response, const char* name,
                                      TRITONSERVER_DataType datatype, const int64_t* shape,
                                      uint32_t dims, const void* data, size_t size) {
  TRITONBACKEND_Output* output;
  void* buffer;
  TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
  int64_t type_id = 0;
  CHECK(TRITONBACKEND_ResponseOutput(response, &output, name, datatype, shape, dims));
  CHECK(TRITONBACKEND_OutputBuffer(output, &buffer, size, &type, &type_id));
  memcpy(buffer, data, size);
  return NULL;
}

/* what the server says of the model called, as response parameters */
static TRITONSERVER_Error* describe(TRITONBACKEND_Response* response, TRITONSERVER_Server* server,
                                    TRITONSERVER_InferenceResponse* called, const char* target) {
  bool ready = false, missing_ready = true;
  uint32_t txn = 0;
  CHECK(TRITONSERVER_ServerModelIsReady(server, target, -1, &ready));
  CHECK(TRITONSERVER_ServerModelIsReady(server, "no_such_model", -1, &missing_ready));
  CHECK(TRITONSERVER_ServerModelTransactionProperties(server, target, -1, &txn, NULL));
  TRITONSERVER_Message* config;
  const char* json;
  size_t json_size;
  CHECK(TRITONSERVER_ServerModelConfig(server, target, -1, 1, &config));
  CHECK(TRITONSERVER_MessageSerializeToJson(config, &json, &json_size));
  CHECK(TRITONBACKEND_ResponseSetStringParameter(response, "callee_config", json));
  CHECK(TRITONSERVER_MessageDelete(config));
  const char* model;
  int64_t version;
  CHECK(TRITONSERVER_InferenceResponseModel(called, &model, &version));
  CHECK(TRITONBACKEND_ResponseSetStringParameter(response, "callee", model));
  CHECK(TRITONBACKEND_ResponseSetIntParameter(response, "callee_version", version));
  CHECK(TRITONBACKEND_ResponseSetIntParameter(response, "callee_txn", txn));
  CHECK(TRITONBACKEND_ResponseSetBoolParameter(response, "callee_ready", ready));
  CHECK(TRITONBACKEND_ResponseSetBoolParameter(response, "missing_ready", missing_ready));
  /* the called model's labels (label_filename): "labels" lists classes 0 to 3, "-" where a
   * class has none; an output index past the last is Triton's error */
  char labels[256] = "";
  for (size_t k = 0; k < 4; k++) {
    const char* label;
    CHECK(TRITONSERVER_InferenceResponseOutputClassificationLabel(called, 0, k, &label));
    strncat(labels, label != NULL ? label : "-", sizeof(labels) - strlen(labels) - 2);
    if (k < 3) strcat(labels, ",");
  }
  CHECK(TRITONBACKEND_ResponseSetStringParameter(response, "callee_labels", labels));
  const char* past;
  TRITONSERVER_Error* refused =
      TRITONSERVER_InferenceResponseOutputClassificationLabel(called, 5, 0, &past);
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseSetStringParameter(
      response, "callee_label_past", refused != NULL ? TRITONSERVER_ErrorMessage(refused) : "-");
  TRITONSERVER_ErrorDelete(refused);
  return err;
}

static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
                                  TRITONSERVER_Server* server, const int64_t counts[4]) {
  const char* target = "faulty";
  bool streamed = false, split = false;
  uint32_t count;
  CHECK(TRITONBACKEND_RequestParameterCount(request, &count));
  for (uint32_t p = 0; p < count; p++) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* value;
    CHECK(TRITONBACKEND_RequestParameter(request, p, &key, &type, &value));
    if (strcmp(key, "target") == 0 && type == TRITONSERVER_PARAMETER_STRING) target = value;
    if (strcmp(key, "stream") == 0 && type == TRITONSERVER_PARAMETER_BOOL)
      streamed = *(const bool*)value;
    if (strcmp(key, "split") == 0 && type == TRITONSERVER_PARAMETER_BOOL)
      split = *(const bool*)value;
  }
  if (streamed) return stream(request, response, server);
  TRITONSERVER_InferenceResponse* called;
  bool ready_in_callback = false;
  CHECK(call(request, server, target, split, &called, &ready_in_callback));
  CHECK(TRITONBACKEND_ResponseSetBoolParameter(response, "ready_in_callback", ready_in_callback));
  const char* name;
  TRITONSERVER_DataType datatype;
  const int64_t* shape;
  uint64_t dims;
  const void* base;
  size_t size;
  TRITONSERVER_MemoryType type;
  int64_t type_id;
  void* userp;
  TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseOutput(
      called, 0, &name, &datatype, &shape, &dims, &base, &size, &type, &type_id, &userp);
  if (err == NULL) err = add_output(response, name, datatype, shape, (uint32_t)dims, base, size);
  if (err == NULL) err = describe(response, server, called, target);
  TRITONSERVER_ErrorDelete(TRITONSERVER_InferenceResponseDelete(called));
  CHECK(err);
  const int64_t four[1] = {4};
  return add_output(response, "COUNTS", TRITONSERVER_TYPE_INT64, four, 1, counts,
                    4 * sizeof(int64_t));
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  TRITONBACKEND_Model* model;
  TRITONSERVER_Server* server;
  CHECK(TRITONBACKEND_ModelInstanceModel(instance, &model));
  CHECK(TRITONBACKEND_ModelServer(model, &server));
  for (uint32_t r = 0; r < request_count; r++) {
    const int64_t counts[4] = {atomic_load(&made), atomic_load(&released),
                               atomic_load(&allocated), atomic_load(&freed)};
    TRITONBACKEND_Response* response;
    CHECK(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* err = answer(requests[r], response, server, counts);
    CHECK(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
    CHECK(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
  }
  return NULL;
}
