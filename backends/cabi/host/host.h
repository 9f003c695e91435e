/* inferpool's host of Triton's backend C API: the structures behind the opaque handles.
 *
 * The host is a CPython extension whose shared object is named libtritonserver.so: a
 * backend built against Triton's headers resolves every TRITONSERVER_* and TRITONBACKEND_*
 * function here.  What a backend reads many times per request (ids, input properties and
 * buffers, requested outputs) is held in C, filled once per request from Python; what
 * changes state (allocating outputs, sending responses, statistics, metrics, state, logs)
 * is handed to the Python bridge (backends/cabi/bridge.py), under the GIL. */
#ifndef INFERPOOL_CABI_HOST_H
#define INFERPOOL_CABI_HOST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <pthread.h>

#include "triton/core/tritonbackend.h"
#include "triton/core/tritonserver.h"

#define HOST_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ plain values */
struct TRITONSERVER_Error {
  TRITONSERVER_Error_Code code;
  char* message;
};

struct TRITONSERVER_Message {
  char* json;
  size_t size;
};

struct TRITONSERVER_Parameter {
  char* name;
  TRITONSERVER_ParameterType type;
  int64_t int_value;
  bool bool_value;
  double double_value;
  char* string_value; /* STRING */
  void* bytes;        /* BYTES: not copied, as Triton */
  uint64_t byte_size;
};

struct TRITONSERVER_BufferAttributes {
  TRITONSERVER_MemoryType memory_type;
  int64_t memory_type_id;
  size_t byte_size;
  void* cuda_ipc_handle;
};

/* ------------------------------------------------------------------ the three levels */
struct TRITONBACKEND_Backend {
  char* name;
  char* config_json;
  char* directory;
  void* state;
  TRITONBACKEND_ExecutionPolicy policy;
};

struct TRITONBACKEND_Model {
  char* name;
  uint64_t version;
  char* repository;
  char* config_json; /* guarded by the GIL: replaced by ModelSetConfig */
  bool auto_complete;
  TRITONBACKEND_Backend* backend;
  void* state;
  PyObject* owner; /* the Python model level (backends/cabi/levels.py) */
};

/* what the executing thread reports, kept until its execute returns (deferred.c) */
typedef struct TRITONBACKEND_Request HostRequest;
typedef struct {
  HostRequest* request;
  bool success;
  uint64_t t[4];
} DeferredStatistics;
typedef struct {
  uint64_t size;
  uint64_t t[4];
} DeferredBatch;
typedef struct {
  struct TRITONSERVER_Metric* metric;
  double amount;
} DeferredIncrement;
typedef struct {
  DeferredStatistics* stats;
  size_t stat_count, stat_capacity;
  DeferredBatch* batches;
  size_t batch_count, batch_capacity;
  DeferredIncrement* metrics;
  size_t metric_count, metric_capacity;
  HostRequest** gone; /* requests whose last holder let go: their reference to drop */
  size_t gone_count, gone_capacity;
} Deferred;

struct TRITONBACKEND_ModelInstance {
  char* name;
  TRITONSERVER_InstanceGroupKind kind;
  int32_t device_id;
  char* host_policy_json;
  uint32_t secondary_count;
  char** secondary_kinds;
  int64_t* secondary_ids;
  TRITONBACKEND_Model* model;
  void* state;
  PyObject* owner; /* the Python instance level */
  Deferred deferred;
};

/* ------------------------------------------------------------------ requests */
typedef struct TRITONBACKEND_Input {
  PyObject_HEAD
  PyObject* name_obj; /* bytes */
  const char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint32_t dims_count;
  uint64_t byte_size;
  const void* buffer;
  PyObject* keep; /* what keeps the buffer valid */
  Py_buffer view; /* held when the buffer came by the buffer protocol */
  int has_view;
  struct TRITONSERVER_BufferAttributes attributes;
} HostInput;

typedef struct HostState HostState;

struct TRITONBACKEND_Request {
  PyObject_HEAD
  PyObject* py;       /* inferpool's Request */
  PyObject* id_obj;   /* bytes */
  PyObject* corr_obj; /* bytes of a string correlation id, or NULL */
  uint64_t correlation_id;
  uint32_t flags;
  uint64_t timeout_us;
  PyObject* inputs;  /* tuple of HostInput */
  PyObject* outputs; /* tuple of bytes: the requested outputs */
  uint32_t parameter_count;
  struct TRITONSERVER_Parameter* parameters;
  PyObject* parameter_keep; /* bytes the parameters point into */
  TRITONBACKEND_ModelInstance* instance;
  /* holders on the C side: the backend (until RequestRelease), each response, factory and
   * state; the Python reference they share is dropped when the last lets go */
  atomic_int holders;
  atomic_int released;
  HostState* states; /* made by StateNew, freed with the request */
  pthread_mutex_t lock;
};

struct HostState {
  HostState* next;
  HostRequest* request;
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint32_t dims_count;
  void* buffer;
  uint64_t byte_size;
  struct TRITONSERVER_BufferAttributes attributes;
};

struct TRITONBACKEND_ResponseFactory {
  HostRequest* request;
};

struct TRITONBACKEND_Output {
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint32_t dims_count;
  void* buffer;
  uint64_t byte_size;
  struct TRITONSERVER_BufferAttributes attributes;
  struct TRITONBACKEND_Response* response;
};

struct TRITONBACKEND_Response {
  HostRequest* request;
  PyObject* py; /* inferpool's Response, made with the first output buffer */
  struct TRITONBACKEND_Output** outputs;
  uint32_t output_count, output_capacity;
  struct TRITONSERVER_Parameter** parameters;
  uint32_t parameter_count, parameter_capacity;
};

/* ------------------------------------------------------------------ metrics */
struct TRITONSERVER_MetricFamily {
  TRITONSERVER_MetricKind kind;
  PyObject* py; /* backends.metrics.MetricFamily */
};

struct TRITONSERVER_Metric {
  TRITONSERVER_MetricFamily* family;
  PyObject* py; /* backends.metrics.Metric */
  double value;
  pthread_mutex_t lock;
};

struct TRITONSERVER_MetricArgs {
  int histogram;
};

struct TRITONBACKEND_ModelInstanceResponseStatistics {
  TRITONBACKEND_ModelInstance* instance;
  TRITONBACKEND_ResponseFactory* factory;
  uint64_t response_start, compute_output_start, response_end;
  TRITONSERVER_Error* error;
};

struct TRITONBACKEND_BackendAttribute {
  bool parallel_instance_loading;
};

/* ------------------------------------------------------------------ requests a backend makes (BLS) */
struct TRITONSERVER_ResponseAllocator {
  TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn;
  TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn;
  TRITONSERVER_ResponseAllocatorStartFn_t start_fn;
  TRITONSERVER_ResponseAllocatorQueryFn_t query_fn;
  TRITONSERVER_ResponseAllocatorBufferAttributesFn_t buffer_attributes_fn;
};

typedef struct {
  const void* base;
  size_t byte_size;
} CallChunk;

typedef struct { /* an input of a request a backend makes: its data stays the backend's */
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint64_t dims_count;
  CallChunk* chunks;
  size_t chunk_count, chunk_capacity;
} CallInput;

struct TRITONSERVER_InferenceRequest {
  char* model_name;
  int64_t model_version;  /* as asked: -1 is the highest ready version */
  int64_t served_version; /* the version the server resolved when the request was made */
  char* id;
  uint64_t correlation_id;
  char* correlation_string; /* set: the correlation id is this string */
  uint32_t flags;
  uint64_t priority;
  uint64_t timeout_us;
  CallInput* inputs;
  size_t input_count, input_capacity;
  char** outputs;
  size_t output_count, output_capacity;
  struct TRITONSERVER_Parameter** parameters;
  size_t parameter_count, parameter_capacity;
  TRITONSERVER_InferenceRequestReleaseFn_t release_fn;
  void* release_userp;
  TRITONSERVER_ResponseAllocator* allocator;
  void* allocator_userp;
  TRITONSERVER_InferenceResponseCompleteFn_t response_fn;
  void* response_userp;
  /* guarded by the GIL: the call in flight (server_calls.CCall), its state */
  PyObject* call;
  bool in_flight;
  bool cancelled;
  uint32_t responses; /* delivered in this flight */
};

typedef struct {
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint64_t dims_count;
  void* buffer; /* the allocator's */
  void* buffer_userp;
  size_t byte_size;
  TRITONSERVER_MemoryType memory_type;
  int64_t memory_type_id;
} CallOutput;

struct TRITONSERVER_InferenceResponse {
  char* model_name;
  int64_t model_version;
  char* id;
  TRITONSERVER_Error* error;
  CallOutput* outputs;
  uint32_t output_count;
  struct TRITONSERVER_Parameter** parameters;
  uint32_t parameter_count;
  TRITONSERVER_ResponseAllocator* allocator;
  PyObject* labels; /* the model's output labels once asked for (they hold the label text) */
};

/* ------------------------------------------------------------------ shared helpers */
extern PyTypeObject HostInputType;
extern PyTypeObject HostRequestType;

/* the bridge's callbacks (set by bind()) */
typedef struct {
  PyObject* output;       /* (request, response|None, name, datatype, shape, nbytes) */
  PyObject* send;         /* (request, response|None, parameters|None, flags, error|None) */
  PyObject* cancelled;    /* (request) -> bool */
  PyObject* state_buffer; /* (request, name, datatype, shape, nbytes) */
  PyObject* state_update; /* (request, name) */
  PyObject* statistics;   /* (instance, request, success, t0, t1, t2, t3) */
  PyObject* batch;        /* (instance, size, t0, t1, t2, t3) */
  PyObject* log;          /* (level, file, line, message) */
  PyObject* set_config;   /* (model, json) */
  PyObject* metric_family;/* (kind, name, description) */
  PyObject* metric;       /* (family, labels dict) */
  PyObject* metric_op;    /* (metric, op, value) */
  PyObject* memory;       /* (owner, [(type, id, bytes)]) */
  PyObject* response_statistics; /* (instance, request, t0, t1, t2, success) */
  PyObject* infer; /* (capsule, model, version, id, correlation, flags, timeout, parameters,
                      inputs, outputs) -> server_calls.CCall */
  PyObject* query; /* (model, version) -> dict */
  PyObject* labels; /* (model, version) -> {output: [label, ...]} */
} Bridge;

extern Bridge host_bridge;
extern atomic_int host_log_enabled[4]; /* by TRITONSERVER_LogLevel */

TRITONSERVER_Error* host_error(TRITONSERVER_Error_Code code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
/* the Python error in flight as a TRITONSERVER_Error (GIL held); clears it */
TRITONSERVER_Error* host_python_error(const char* where);
/* the result of a bridge call: NULL on success, an error if it raised (GIL held) */
TRITONSERVER_Error* host_checked(PyObject* result, const char* where);
char* host_strdup(const char* text);
/* a code by its name in wire.errors.Code (TIMEOUT reads as UNAVAILABLE) */
TRITONSERVER_Error_Code host_code_of(const char* name);
/* make room for one more item in a growing array (exits on no memory, as malloc's callers) */
void host_grow(void** items, size_t item_size, size_t count, size_t* capacity);
/* module.deliver: a reply to a request a backend made (calls.c) */
PyObject* host_deliver(PyObject* self, PyObject* args);
const char* host_datatype_string(TRITONSERVER_DataType datatype);
PyObject* host_datatype_name(TRITONSERVER_DataType datatype);
PyObject* host_shape_tuple(const int64_t* shape, uint32_t dims_count);
int64_t* host_shape_copy(const int64_t* shape, uint32_t dims_count);
/* a buffer a bridge call returned: host memory (a writable buffer), or device memory as
 * (address, memory type, type id) */
TRITONSERVER_Error* host_buffer_of(PyObject* placed, void** buffer,
                                   struct TRITONSERVER_BufferAttributes* attributes,
                                   const char* what);
void host_request_let_go(HostRequest* request);
HostRequest* host_request_new(PyObject* py, PyObject* maker);
void host_request_hand_over(HostRequest* request);
void host_request_reclaim(HostRequest* request);

/* set on the thread running an execute, while it runs (deferred.c) */
extern _Thread_local Deferred* host_deferred;
void host_defer_statistics(Deferred* d, HostRequest* request, bool success, const uint64_t t[4]);
void host_defer_batch(Deferred* d, uint64_t size, const uint64_t t[4]);
void host_defer_increment(Deferred* d, struct TRITONSERVER_Metric* metric, double value);
void host_defer_gone(Deferred* d, HostRequest* request);
int host_drain(Deferred* d, PyObject* owner);
void host_deferred_free(Deferred* d);
PyObject* host_parameter_value(const struct TRITONSERVER_Parameter* parameter);
void host_parameter_free(struct TRITONSERVER_Parameter* parameter);

TRITONSERVER_Error* host_request_cancelled(HostRequest* request, bool* is_cancelled,
                                           const char* where);

#define REQUEST_ARG(r) HOST_NOT_NULL(r, "request")
#define HOST_NOT_NULL(p, what)                                                   \
  do {                                                                           \
    if ((p) == NULL)                                                             \
      return host_error(TRITONSERVER_ERROR_INVALID_ARG, "%s: %s is null", __func__, what); \
  } while (0)

#endif
