/* inferpool's declarations of Triton's tritonserver.h ABI (TRITONSERVER API 1.34).
 *
 * Written for inferpool from Triton's public documentation: the names, signatures and
 * enum values a backend built against Triton's headers links to, so that the same backend
 * source builds against this header set and runs in an inferpool worker. Which functions
 * inferpool implements, and how they differ from Triton's, is in docs/c-backends.md. */
#ifndef INFERPOOL_TRITONSERVER_H
#define INFERPOOL_TRITONSERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_MSC_VER)
#define TRITONSERVER_DECLSPEC __declspec(dllimport)
#else
#define TRITONSERVER_DECLSPEC __attribute__((__visibility__("default")))
#endif

#define TRITONSERVER_API_VERSION_MAJOR 1
#define TRITONSERVER_API_VERSION_MINOR 34

/* opaque handles */
struct TRITONSERVER_BufferAttributes;
typedef struct TRITONSERVER_BufferAttributes TRITONSERVER_BufferAttributes;
struct TRITONSERVER_Error;
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
struct TRITONSERVER_InferenceRequest;
typedef struct TRITONSERVER_InferenceRequest TRITONSERVER_InferenceRequest;
struct TRITONSERVER_InferenceResponse;
typedef struct TRITONSERVER_InferenceResponse TRITONSERVER_InferenceResponse;
struct TRITONSERVER_InferenceTrace;
typedef struct TRITONSERVER_InferenceTrace TRITONSERVER_InferenceTrace;
struct TRITONSERVER_Message;
typedef struct TRITONSERVER_Message TRITONSERVER_Message;
struct TRITONSERVER_Metrics;
typedef struct TRITONSERVER_Metrics TRITONSERVER_Metrics;
struct TRITONSERVER_Parameter;
typedef struct TRITONSERVER_Parameter TRITONSERVER_Parameter;
struct TRITONSERVER_ResponseAllocator;
typedef struct TRITONSERVER_ResponseAllocator TRITONSERVER_ResponseAllocator;
struct TRITONSERVER_Server;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
struct TRITONSERVER_ServerOptions;
typedef struct TRITONSERVER_ServerOptions TRITONSERVER_ServerOptions;
struct TRITONSERVER_Metric;
typedef struct TRITONSERVER_Metric TRITONSERVER_Metric;
struct TRITONSERVER_MetricFamily;
typedef struct TRITONSERVER_MetricFamily TRITONSERVER_MetricFamily;
struct TRITONSERVER_MetricArgs;
typedef struct TRITONSERVER_MetricArgs TRITONSERVER_MetricArgs;

/* enumerations */
typedef enum {
  TRITONSERVER_TYPE_INVALID = 0,
  TRITONSERVER_TYPE_BOOL = 1,
  TRITONSERVER_TYPE_UINT8 = 2,
  TRITONSERVER_TYPE_UINT16 = 3,
  TRITONSERVER_TYPE_UINT32 = 4,
  TRITONSERVER_TYPE_UINT64 = 5,
  TRITONSERVER_TYPE_INT8 = 6,
  TRITONSERVER_TYPE_INT16 = 7,
  TRITONSERVER_TYPE_INT32 = 8,
  TRITONSERVER_TYPE_INT64 = 9,
  TRITONSERVER_TYPE_FP16 = 10,
  TRITONSERVER_TYPE_FP32 = 11,
  TRITONSERVER_TYPE_FP64 = 12,
  TRITONSERVER_TYPE_BYTES = 13,
  TRITONSERVER_TYPE_BF16 = 14,
} TRITONSERVER_DataType;
typedef enum {
  TRITONSERVER_MEMORY_CPU = 0,
  TRITONSERVER_MEMORY_CPU_PINNED = 1,
  TRITONSERVER_MEMORY_GPU = 2,
} TRITONSERVER_MemoryType;
typedef enum {
  TRITONSERVER_PARAMETER_STRING = 0,
  TRITONSERVER_PARAMETER_INT = 1,
  TRITONSERVER_PARAMETER_BOOL = 2,
  TRITONSERVER_PARAMETER_DOUBLE = 3,
  TRITONSERVER_PARAMETER_BYTES = 4,
} TRITONSERVER_ParameterType;
typedef enum {
  TRITONSERVER_INSTANCEGROUPKIND_AUTO = 0,
  TRITONSERVER_INSTANCEGROUPKIND_CPU = 1,
  TRITONSERVER_INSTANCEGROUPKIND_GPU = 2,
  TRITONSERVER_INSTANCEGROUPKIND_MODEL = 3,
} TRITONSERVER_InstanceGroupKind;
typedef enum {
  TRITONSERVER_LOG_INFO = 0,
  TRITONSERVER_LOG_WARN = 1,
  TRITONSERVER_LOG_ERROR = 2,
  TRITONSERVER_LOG_VERBOSE = 3,
} TRITONSERVER_LogLevel;
typedef enum {
  TRITONSERVER_LOG_DEFAULT = 0,
  TRITONSERVER_LOG_ISO8601 = 1,
} TRITONSERVER_LogFormat;
typedef enum {
  TRITONSERVER_ERROR_UNKNOWN = 0,
  TRITONSERVER_ERROR_INTERNAL = 1,
  TRITONSERVER_ERROR_NOT_FOUND = 2,
  TRITONSERVER_ERROR_INVALID_ARG = 3,
  TRITONSERVER_ERROR_UNAVAILABLE = 4,
  TRITONSERVER_ERROR_UNSUPPORTED = 5,
  TRITONSERVER_ERROR_ALREADY_EXISTS = 6,
  TRITONSERVER_ERROR_CANCELLED = 7,
} TRITONSERVER_Error_Code;
typedef enum {
  TRITONSERVER_METRIC_PROMETHEUS = 0,
} TRITONSERVER_MetricFormat;
typedef enum {
  TRITONSERVER_TRACE_LEVEL_DISABLED = 0,
  TRITONSERVER_TRACE_LEVEL_MIN = 1,
  TRITONSERVER_TRACE_LEVEL_MAX = 2,
  TRITONSERVER_TRACE_LEVEL_TIMESTAMPS = 4,
  TRITONSERVER_TRACE_LEVEL_TENSORS = 8,
} TRITONSERVER_InferenceTraceLevel;
typedef enum {
  TRITONSERVER_TRACE_REQUEST_START = 0,
  TRITONSERVER_TRACE_QUEUE_START = 1,
  TRITONSERVER_TRACE_COMPUTE_START = 2,
  TRITONSERVER_TRACE_COMPUTE_INPUT_END = 3,
  TRITONSERVER_TRACE_COMPUTE_OUTPUT_START = 4,
  TRITONSERVER_TRACE_COMPUTE_END = 5,
  TRITONSERVER_TRACE_REQUEST_END = 6,
  TRITONSERVER_TRACE_TENSOR_QUEUE_INPUT = 7,
  TRITONSERVER_TRACE_TENSOR_BACKEND_INPUT = 8,
  TRITONSERVER_TRACE_TENSOR_BACKEND_OUTPUT = 9,
  TRITONSERVER_TRACE_CUSTOM_ACTIVITY = 10,
} TRITONSERVER_InferenceTraceActivity;
typedef enum {
  TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1,
  TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2,
} TRITONSERVER_RequestFlag;
typedef enum {
  TRITONSERVER_REQUEST_RELEASE_ALL = 1,
  TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2,
} TRITONSERVER_RequestReleaseFlag;
typedef enum {
  TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1,
} TRITONSERVER_ResponseCompleteFlag;
typedef enum {
  TRITONSERVER_MODEL_CONTROL_NONE = 0,
  TRITONSERVER_MODEL_CONTROL_POLL = 1,
  TRITONSERVER_MODEL_CONTROL_EXPLICIT = 2,
} TRITONSERVER_ModelControlMode;
typedef enum {
  TRITONSERVER_RATE_LIMIT_OFF = 0,
  TRITONSERVER_RATE_LIMIT_EXEC_COUNT = 1,
} TRITONSERVER_RateLimitMode;
typedef enum {
  TRITONSERVER_BATCH_UNKNOWN = 1,
  TRITONSERVER_BATCH_FIRST_DIM = 2,
} TRITONSERVER_ModelBatchFlag;
typedef enum {
  TRITONSERVER_INDEX_FLAG_READY = 1,
} TRITONSERVER_ModelIndexFlag;
typedef enum {
  TRITONSERVER_TXN_ONE_TO_ONE = 1,
  TRITONSERVER_TXN_DECOUPLED = 2,
} TRITONSERVER_ModelTxnPropertyFlag;
typedef enum {
  TRITONSERVER_METRIC_KIND_COUNTER = 0,
  TRITONSERVER_METRIC_KIND_GAUGE = 1,
  TRITONSERVER_METRIC_KIND_HISTOGRAM = 2,
} TRITONSERVER_MetricKind;

/* callback types */
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorAllocFn_t)(TRITONSERVER_ResponseAllocator* allocator, const char* tensor_name, size_t byte_size, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, void* userp, void** buffer, void** buffer_userp, TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorBufferAttributesFn_t)(TRITONSERVER_ResponseAllocator* allocator, const char* tensor_name, TRITONSERVER_BufferAttributes* buffer_attributes, void* userp, void* buffer_userp);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorQueryFn_t)(TRITONSERVER_ResponseAllocator* allocator, void* userp, const char* tensor_name, size_t* byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorReleaseFn_t)(TRITONSERVER_ResponseAllocator* allocator, void* buffer, void* buffer_userp, size_t byte_size, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorStartFn_t)(TRITONSERVER_ResponseAllocator* allocator, void* userp);
typedef void (*TRITONSERVER_InferenceTraceActivityFn_t)(TRITONSERVER_InferenceTrace* trace, TRITONSERVER_InferenceTraceActivity activity, uint64_t timestamp_ns, void* userp);
typedef void (*TRITONSERVER_InferenceTraceTensorActivityFn_t)(TRITONSERVER_InferenceTrace* trace, TRITONSERVER_InferenceTraceActivity activity, const char* name, TRITONSERVER_DataType datatype, const void* base, size_t byte_size, const int64_t* shape, uint64_t dim_count, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, void* userp);
typedef void (*TRITONSERVER_InferenceTraceReleaseFn_t)(TRITONSERVER_InferenceTrace* trace, void* userp);
typedef void (*TRITONSERVER_InferenceRequestReleaseFn_t)(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp);
typedef void (*TRITONSERVER_InferenceResponseCompleteFn_t)(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);

/* functions */
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ApiVersion(uint32_t* major, uint32_t* minor);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_DataTypeString(TRITONSERVER_DataType datatype);
TRITONSERVER_DECLSPEC TRITONSERVER_DataType TRITONSERVER_StringToDataType(const char* dtype);
TRITONSERVER_DECLSPEC uint32_t TRITONSERVER_DataTypeByteSize(TRITONSERVER_DataType datatype);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_MemoryTypeString(TRITONSERVER_MemoryType memtype);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_ParameterTypeString(TRITONSERVER_ParameterType paramtype);
TRITONSERVER_DECLSPEC TRITONSERVER_Parameter* TRITONSERVER_ParameterNew(const char* name, const TRITONSERVER_ParameterType type, const void* value);
TRITONSERVER_DECLSPEC TRITONSERVER_Parameter* TRITONSERVER_ParameterBytesNew(const char* name, const void* byte_ptr, const uint64_t size);
TRITONSERVER_DECLSPEC void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter* parameter);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_InstanceGroupKindString(TRITONSERVER_InstanceGroupKind kind);
TRITONSERVER_DECLSPEC bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level, const char* filename, const int line, const char* msg);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg);
TRITONSERVER_DECLSPEC void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
TRITONSERVER_DECLSPEC TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error* error);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_ErrorCodeString(TRITONSERVER_Error* error);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorNew(TRITONSERVER_ResponseAllocator** allocator, TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn, TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn, TRITONSERVER_ResponseAllocatorStartFn_t start_fn);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction(TRITONSERVER_ResponseAllocator* allocator, TRITONSERVER_ResponseAllocatorBufferAttributesFn_t buffer_attributes_fn);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorSetQueryFunction(TRITONSERVER_ResponseAllocator* allocator, TRITONSERVER_ResponseAllocatorQueryFn_t query_fn);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorDelete(TRITONSERVER_ResponseAllocator* allocator);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MessageNewFromSerializedJson(TRITONSERVER_Message** message, const char* base, size_t byte_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message, const char** base, size_t* byte_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricsDelete(TRITONSERVER_Metrics* metrics);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricsFormatted(TRITONSERVER_Metrics* metrics, TRITONSERVER_MetricFormat format, const char** base, size_t* byte_size);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_InferenceTraceLevelString(TRITONSERVER_InferenceTraceLevel level);
TRITONSERVER_DECLSPEC const char* TRITONSERVER_InferenceTraceActivityString(TRITONSERVER_InferenceTraceActivity activity);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceNew(TRITONSERVER_InferenceTrace** trace, TRITONSERVER_InferenceTraceLevel level, uint64_t parent_id, TRITONSERVER_InferenceTraceActivityFn_t activity_fn, TRITONSERVER_InferenceTraceReleaseFn_t release_fn, void* trace_userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceTensorNew(TRITONSERVER_InferenceTrace** trace, TRITONSERVER_InferenceTraceLevel level, uint64_t parent_id, TRITONSERVER_InferenceTraceActivityFn_t activity_fn, TRITONSERVER_InferenceTraceTensorActivityFn_t tensor_activity_fn, TRITONSERVER_InferenceTraceReleaseFn_t release_fn, void* trace_userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceReportActivity(TRITONSERVER_InferenceTrace* trace, uint64_t timestamp, const char* activity_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceDelete(TRITONSERVER_InferenceTrace* trace);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceId(TRITONSERVER_InferenceTrace* trace, uint64_t* id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceParentId(TRITONSERVER_InferenceTrace* trace, uint64_t* parent_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceModelName(TRITONSERVER_InferenceTrace* trace, const char** model_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceModelVersion(TRITONSERVER_InferenceTrace* trace, int64_t* model_version);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceRequestId(TRITONSERVER_InferenceTrace* trace, const char** request_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceSpawnChildTrace(TRITONSERVER_InferenceTrace* trace, TRITONSERVER_InferenceTrace** child_trace);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceSetContext(TRITONSERVER_InferenceTrace* trace, const char* trace_context);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceTraceContext(TRITONSERVER_InferenceTrace* trace, const char** trace_context);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestNew(TRITONSERVER_InferenceRequest** inference_request, TRITONSERVER_Server* server, const char* model_name, const int64_t model_version);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestDelete(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestId(TRITONSERVER_InferenceRequest* inference_request, const char** id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetId(TRITONSERVER_InferenceRequest* inference_request, const char* id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestFlags(TRITONSERVER_InferenceRequest* inference_request, uint32_t* flags);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetFlags(TRITONSERVER_InferenceRequest* inference_request, uint32_t flags);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestCorrelationId(TRITONSERVER_InferenceRequest* inference_request, uint64_t* correlation_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestCorrelationIdString(TRITONSERVER_InferenceRequest* inference_request, const char** correlation_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetCorrelationId(TRITONSERVER_InferenceRequest* inference_request, uint64_t correlation_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetCorrelationIdString(TRITONSERVER_InferenceRequest* inference_request, const char* correlation_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestCancel(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestIsCancelled(TRITONSERVER_InferenceRequest* inference_request, bool* is_cancelled);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestPriority(TRITONSERVER_InferenceRequest* inference_request, uint32_t* priority);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestPriorityUInt64(TRITONSERVER_InferenceRequest* inference_request, uint64_t* priority);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetPriority(TRITONSERVER_InferenceRequest* inference_request, uint32_t priority);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetPriorityUInt64(TRITONSERVER_InferenceRequest* inference_request, uint64_t priority);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestTimeoutMicroseconds(TRITONSERVER_InferenceRequest* inference_request, uint64_t* timeout_us);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(TRITONSERVER_InferenceRequest* inference_request, uint64_t timeout_us);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddInput(TRITONSERVER_InferenceRequest* inference_request, const char* name, const TRITONSERVER_DataType datatype, const int64_t* shape, uint64_t dim_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRawInput(TRITONSERVER_InferenceRequest* inference_request, const char* name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveInput(TRITONSERVER_InferenceRequest* inference_request, const char* name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllInputs(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputData(TRITONSERVER_InferenceRequest* inference_request, const char* name, const void* base, size_t byte_size, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(TRITONSERVER_InferenceRequest* inference_request, const char* name, const void* base, size_t byte_size, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, const char* host_policy_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes(TRITONSERVER_InferenceRequest* inference_request, const char* name, const void* base, TRITONSERVER_BufferAttributes* buffer_attributes);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllInputData(TRITONSERVER_InferenceRequest* inference_request, const char* name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRequestedOutput(TRITONSERVER_InferenceRequest* inference_request, const char* name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveRequestedOutput(TRITONSERVER_InferenceRequest* inference_request, const char* name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetReleaseCallback(TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_InferenceRequestReleaseFn_t request_release_fn, void* request_release_userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetResponseCallback(TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_ResponseAllocator* response_allocator, void* response_allocator_userp, TRITONSERVER_InferenceResponseCompleteFn_t response_fn, void* response_userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetStringParameter(TRITONSERVER_InferenceRequest* request, const char* key, const char* value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetIntParameter(TRITONSERVER_InferenceRequest* request, const char* key, const int64_t value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetBoolParameter(TRITONSERVER_InferenceRequest* request, const char* key, const bool value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetDoubleParameter(TRITONSERVER_InferenceRequest* request, const char* key, const double value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseDelete(TRITONSERVER_InferenceResponse* inference_response);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseError(TRITONSERVER_InferenceResponse* inference_response);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseModel(TRITONSERVER_InferenceResponse* inference_response, const char** model_name, int64_t* model_version);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseId(TRITONSERVER_InferenceResponse* inference_response, const char** request_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseParameterCount(TRITONSERVER_InferenceResponse* inference_response, uint32_t* count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseParameter(TRITONSERVER_InferenceResponse* inference_response, const uint32_t index, const char** name, TRITONSERVER_ParameterType* type, const void** vvalue);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputCount(TRITONSERVER_InferenceResponse* inference_response, uint32_t* count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutput(TRITONSERVER_InferenceResponse* inference_response, const uint32_t index, const char** name, TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count, const void** base, size_t* byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id, void** userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputClassificationLabel(TRITONSERVER_InferenceResponse* inference_response, const uint32_t index, const size_t class_index, const char** label);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesNew(TRITONSERVER_BufferAttributes** buffer_attributes);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesDelete(TRITONSERVER_BufferAttributes* buffer_attributes);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetMemoryTypeId(TRITONSERVER_BufferAttributes* buffer_attributes, int64_t memory_type_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetMemoryType(TRITONSERVER_BufferAttributes* buffer_attributes, TRITONSERVER_MemoryType memory_type);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetCudaIpcHandle(TRITONSERVER_BufferAttributes* buffer_attributes, void* cuda_ipc_handle);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetByteSize(TRITONSERVER_BufferAttributes* buffer_attributes, size_t byte_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesMemoryTypeId(TRITONSERVER_BufferAttributes* buffer_attributes, int64_t* memory_type_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesMemoryType(TRITONSERVER_BufferAttributes* buffer_attributes, TRITONSERVER_MemoryType* memory_type);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesCudaIpcHandle(TRITONSERVER_BufferAttributes* buffer_attributes, void** cuda_ipc_handle);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_BufferAttributesByteSize(TRITONSERVER_BufferAttributes* buffer_attributes, size_t* byte_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsNew(TRITONSERVER_ServerOptions** options);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsDelete(TRITONSERVER_ServerOptions* options);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetServerId(TRITONSERVER_ServerOptions* options, const char* server_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelRepositoryPath(TRITONSERVER_ServerOptions* options, const char* model_repository_path);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelControlMode(TRITONSERVER_ServerOptions* options, TRITONSERVER_ModelControlMode mode);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetStartupModel(TRITONSERVER_ServerOptions* options, const char* model_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetStrictModelConfig(TRITONSERVER_ServerOptions* options, bool strict);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelConfigName(TRITONSERVER_ServerOptions* options, const char* model_config_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetRateLimiterMode(TRITONSERVER_ServerOptions* options, TRITONSERVER_RateLimitMode mode);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsAddRateLimiterResource(TRITONSERVER_ServerOptions* options, const char* resource_name, const size_t resource_count, const int device);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize(TRITONSERVER_ServerOptions* options, uint64_t size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize(TRITONSERVER_ServerOptions* options, int gpu_device, uint64_t size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetCudaVirtualAddressSize(TRITONSERVER_ServerOptions* options, int gpu_device, size_t cuda_virtual_address_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetResponseCacheByteSize(TRITONSERVER_ServerOptions* options, uint64_t size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetCacheConfig(TRITONSERVER_ServerOptions* options, const char* cache_name, const char* config_json);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetCacheDirectory(TRITONSERVER_ServerOptions* options, const char* cache_dir);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability(TRITONSERVER_ServerOptions* options, double cc);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetExitOnError(TRITONSERVER_ServerOptions* options, bool exit);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetStrictReadiness(TRITONSERVER_ServerOptions* options, bool strict);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetExitTimeout(TRITONSERVER_ServerOptions* options, unsigned int timeout);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetBufferManagerThreadCount(TRITONSERVER_ServerOptions* options, unsigned int thread_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelLoadThreadCount(TRITONSERVER_ServerOptions* options, unsigned int thread_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelLoadRetryCount(TRITONSERVER_ServerOptions* options, unsigned int retry_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelNamespacing(TRITONSERVER_ServerOptions* options, bool enable_namespace);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetEnablePeerAccess(TRITONSERVER_ServerOptions* options, bool enable_peer_access);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetLogFile(TRITONSERVER_ServerOptions* options, const char* file);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetLogInfo(TRITONSERVER_ServerOptions* options, bool log);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetLogWarn(TRITONSERVER_ServerOptions* options, bool log);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetLogError(TRITONSERVER_ServerOptions* options, bool log);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetLogFormat(TRITONSERVER_ServerOptions* options, const TRITONSERVER_LogFormat format);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetLogVerbose(TRITONSERVER_ServerOptions* options, int level);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetMetrics(TRITONSERVER_ServerOptions* options, bool metrics);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetGpuMetrics(TRITONSERVER_ServerOptions* options, bool gpu_metrics);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetCpuMetrics(TRITONSERVER_ServerOptions* options, bool cpu_metrics);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetMetricsInterval(TRITONSERVER_ServerOptions* options, uint64_t metrics_interval_ms);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetBackendDirectory(TRITONSERVER_ServerOptions* options, const char* backend_dir);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetRepoAgentDirectory(TRITONSERVER_ServerOptions* options, const char* repoagent_dir);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit(TRITONSERVER_ServerOptions* options, const TRITONSERVER_InstanceGroupKind kind, const int device_id, const double fraction);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetBackendConfig(TRITONSERVER_ServerOptions* options, const char* backend_name, const char* setting, const char* value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetHostPolicy(TRITONSERVER_ServerOptions* options, const char* policy_name, const char* setting, const char* value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerOptionsSetMetricsConfig(TRITONSERVER_ServerOptions* options, const char* name, const char* setting, const char* value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerNew(TRITONSERVER_Server** server, TRITONSERVER_ServerOptions* options);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerDelete(TRITONSERVER_Server* server);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerStop(TRITONSERVER_Server* server);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerSetExitTimeout(TRITONSERVER_Server* server, unsigned int timeout);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerRegisterModelRepository(TRITONSERVER_Server* server, const char* repository_path, const TRITONSERVER_Parameter** name_mapping, const uint32_t mapping_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerUnregisterModelRepository(TRITONSERVER_Server* server, const char* repository_path);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerPollModelRepository(TRITONSERVER_Server* server);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerIsLive(TRITONSERVER_Server* server, bool* live);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerIsReady(TRITONSERVER_Server* server, bool* ready);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelIsReady(TRITONSERVER_Server* server, const char* model_name, const int64_t model_version, bool* ready);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelBatchProperties(TRITONSERVER_Server* server, const char* model_name, const int64_t model_version, uint32_t* flags, void** voidp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelTransactionProperties(TRITONSERVER_Server* server, const char* model_name, const int64_t model_version, uint32_t* txn_flags, void** voidp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerMetadata(TRITONSERVER_Server* server, TRITONSERVER_Message** server_metadata);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelMetadata(TRITONSERVER_Server* server, const char* model_name, const int64_t model_version, TRITONSERVER_Message** model_metadata);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelStatistics(TRITONSERVER_Server* server, const char* model_name, const int64_t model_version, TRITONSERVER_Message** model_stats);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelConfig(TRITONSERVER_Server* server, const char* model_name, const int64_t model_version, const uint32_t config_version, TRITONSERVER_Message** model_config);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerModelIndex(TRITONSERVER_Server* server, uint32_t flags, TRITONSERVER_Message** model_index);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerLoadModel(TRITONSERVER_Server* server, const char* model_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerLoadModelWithParameters(TRITONSERVER_Server* server, const char* model_name, const TRITONSERVER_Parameter** parameters, const uint64_t parameter_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerUnloadModel(TRITONSERVER_Server* server, const char* model_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerUnloadModelAndDependents(TRITONSERVER_Server* server, const char* model_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerMetrics(TRITONSERVER_Server* server, TRITONSERVER_Metrics** metrics);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_ServerInferAsync(TRITONSERVER_Server* server, TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_InferenceTrace* trace);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily** family, const TRITONSERVER_MetricKind kind, const char* name, const char* description);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily* family);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_GetMetricFamilyKind(TRITONSERVER_MetricFamily* family, TRITONSERVER_MetricKind* kind);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricArgsNew(TRITONSERVER_MetricArgs** args);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricArgsSetHistogram(TRITONSERVER_MetricArgs* args, const double* buckets, const uint64_t buckets_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricArgsDelete(TRITONSERVER_MetricArgs* args);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricNew(TRITONSERVER_Metric** metric, TRITONSERVER_MetricFamily* family, const TRITONSERVER_Parameter** labels, const uint64_t label_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricNewWithArgs(TRITONSERVER_Metric** metric, TRITONSERVER_MetricFamily* family, const TRITONSERVER_Parameter** labels, const uint64_t label_count, const TRITONSERVER_MetricArgs* args);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricDelete(TRITONSERVER_Metric* metric);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricValue(TRITONSERVER_Metric* metric, double* value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricIncrement(TRITONSERVER_Metric* metric, double value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricSet(TRITONSERVER_Metric* metric, double value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_MetricObserve(TRITONSERVER_Metric* metric, double value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error* TRITONSERVER_GetMetricKind(TRITONSERVER_Metric* metric, TRITONSERVER_MetricKind* kind);

#ifdef __cplusplus
}  /* extern "C" */
#endif
#endif  /* INFERPOOL_TRITONSERVER_H */
