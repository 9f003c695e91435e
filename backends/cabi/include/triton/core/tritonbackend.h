/* inferpool's declarations of Triton's tritonbackend.h ABI (TRITONBACKEND API 1.19).
 *
 * Written for inferpool from Triton's public documentation: the names, signatures and
 * enum values a backend built against Triton's headers links to, so that the same backend
 * source builds against this header set and runs in an inferpool worker. Which functions
 * inferpool implements, and how they differ from Triton's, is in docs/c-backends.md. */
#ifndef INFERPOOL_TRITONBACKEND_H
#define INFERPOOL_TRITONBACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "triton/core/tritonserver.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_MSC_VER)
#define TRITONBACKEND_DECLSPEC __declspec(dllimport)
#define TRITONBACKEND_ISPEC __declspec(dllexport)
#else
#define TRITONBACKEND_DECLSPEC __attribute__((__visibility__("default")))
#define TRITONBACKEND_ISPEC __attribute__((__visibility__("default")))
#endif

#define TRITONBACKEND_API_VERSION_MAJOR 1
#define TRITONBACKEND_API_VERSION_MINOR 19

/* opaque handles */
struct TRITONBACKEND_MemoryManager;
typedef struct TRITONBACKEND_MemoryManager TRITONBACKEND_MemoryManager;
struct TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
struct TRITONBACKEND_Output;
typedef struct TRITONBACKEND_Output TRITONBACKEND_Output;
struct TRITONBACKEND_State;
typedef struct TRITONBACKEND_State TRITONBACKEND_State;
struct TRITONBACKEND_Request;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
struct TRITONBACKEND_ResponseFactory;
typedef struct TRITONBACKEND_ResponseFactory TRITONBACKEND_ResponseFactory;
struct TRITONBACKEND_Response;
typedef struct TRITONBACKEND_Response TRITONBACKEND_Response;
struct TRITONBACKEND_Backend;
typedef struct TRITONBACKEND_Backend TRITONBACKEND_Backend;
struct TRITONBACKEND_Model;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_ModelInstanceResponseStatistics;
typedef struct TRITONBACKEND_ModelInstanceResponseStatistics TRITONBACKEND_ModelInstanceResponseStatistics;
struct TRITONBACKEND_BackendAttribute;
typedef struct TRITONBACKEND_BackendAttribute TRITONBACKEND_BackendAttribute;
struct TRITONBACKEND_Batcher;
typedef struct TRITONBACKEND_Batcher TRITONBACKEND_Batcher;

/* enumerations */
typedef enum {
  TRITONBACKEND_ARTIFACT_FILESYSTEM = 0,
} TRITONBACKEND_ArtifactType;
typedef enum {
  TRITONBACKEND_EXECUTION_BLOCKING = 0,
  TRITONBACKEND_EXECUTION_DEVICE_BLOCKING = 1,
} TRITONBACKEND_ExecutionPolicy;

/* functions */
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_MemoryManagerAllocate(TRITONBACKEND_MemoryManager* manager, void** buffer, const TRITONSERVER_MemoryType memory_type, const int64_t memory_type_id, const uint64_t byte_size);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_MemoryManagerFree(TRITONBACKEND_MemoryManager* manager, void* buffer, const TRITONSERVER_MemoryType memory_type, const int64_t memory_type_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name, TRITONSERVER_DataType* datatype, const int64_t** shape, uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InputPropertiesForHostPolicy(TRITONBACKEND_Input* input, const char* host_policy_name, const char** name, TRITONSERVER_DataType* datatype, const int64_t** shape, uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, const uint32_t index, const void** buffer, uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InputBufferForHostPolicy(TRITONBACKEND_Input* input, const char* host_policy_name, const uint32_t index, const void** buffer, uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InputBufferAttributes(TRITONBACKEND_Input* input, const uint32_t index, const void** buffer, TRITONSERVER_BufferAttributes** buffer_attributes);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output, void** buffer, const uint64_t buffer_byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_OutputBufferAttributes(TRITONBACKEND_Output* output, TRITONSERVER_BufferAttributes** buffer_attributes);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request, const char** id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestIsCancelled(TRITONBACKEND_Request* request, bool* is_cancelled);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory* factory, bool* is_cancelled);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationId(TRITONBACKEND_Request* request, uint64_t* id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InferenceRequestTimeoutMicroseconds(TRITONBACKEND_Request* request, uint64_t* timeout);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationIdString(TRITONBACKEND_Request* request, const char** id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestFlags(TRITONBACKEND_Request* request, uint32_t* flags);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestParameter(TRITONBACKEND_Request* request, const uint32_t index, const char** key, TRITONSERVER_ParameterType* type, const void** vvalue);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestInputName(TRITONBACKEND_Request* request, const uint32_t index, const char** input_name);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name, TRITONBACKEND_Input** input);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request* request, const uint32_t index, TRITONBACKEND_Input** input);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request, const uint32_t index, const char** output_name);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestOutputBufferProperties(TRITONBACKEND_Request* request, const char* name, size_t* byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_RequestTrace(TRITONBACKEND_Request* request, TRITONSERVER_InferenceTrace** trace);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory** factory, TRITONBACKEND_Request* request);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory* factory);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory* factory, const uint32_t send_flags);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response, TRITONBACKEND_Request* request);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response** response, TRITONBACKEND_ResponseFactory* factory);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseSetStringParameter(TRITONBACKEND_Response* response, const char* name, const char* value);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseSetIntParameter(TRITONBACKEND_Response* response, const char* name, const int64_t value);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseSetBoolParameter(TRITONBACKEND_Response* response, const char* name, const bool value);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseSetDoubleParameter(TRITONBACKEND_Response* response, const char* name, const double value);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response, TRITONBACKEND_Output** output, const char* name, const TRITONSERVER_DataType datatype, const int64_t* shape, const uint32_t dims_count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response, const uint32_t send_flags, TRITONSERVER_Error* error);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_StateNew(TRITONBACKEND_State** state, TRITONBACKEND_Request* request, const char* name, const TRITONSERVER_DataType datatype, const int64_t* shape, const uint32_t dims_count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_StateUpdate(TRITONBACKEND_State* state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_StateBuffer(TRITONBACKEND_State* state, void** buffer, const uint64_t buffer_byte_size, TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_StateBufferAttributes(TRITONBACKEND_State* state, TRITONSERVER_BufferAttributes** buffer_attributes);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendName(TRITONBACKEND_Backend* backend, const char** name);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendConfig(TRITONBACKEND_Backend* backend, TRITONSERVER_Message** backend_config);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendExecutionPolicy(TRITONBACKEND_Backend* backend, TRITONBACKEND_ExecutionPolicy* policy);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendSetExecutionPolicy(TRITONBACKEND_Backend* backend, TRITONBACKEND_ExecutionPolicy policy);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendArtifacts(TRITONBACKEND_Backend* backend, TRITONBACKEND_ArtifactType* artifact_type, const char** location);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendMemoryManager(TRITONBACKEND_Backend* backend, TRITONBACKEND_MemoryManager** manager);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendState(TRITONBACKEND_Backend* backend, void** state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendSetState(TRITONBACKEND_Backend* backend, void* state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, const char** name);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model* model, uint64_t* version);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model, TRITONBACKEND_ArtifactType* artifact_type, const char** location);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model, const uint32_t config_version, TRITONSERVER_Message** model_config);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelAutoCompleteConfig(TRITONBACKEND_Model* model, bool* auto_complete_config);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelSetConfig(TRITONBACKEND_Model* model, const uint32_t config_version, TRITONSERVER_Message* model_config);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelServer(TRITONBACKEND_Model* model, TRITONSERVER_Server** server);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelBackend(TRITONBACKEND_Model* model, TRITONBACKEND_Backend** backend);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelReportMemoryUsage(TRITONBACKEND_Model* model, TRITONSERVER_BufferAttributes** usage, uint32_t usage_size);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance* instance, const char** name);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceKind(TRITONBACKEND_ModelInstance* instance, TRITONSERVER_InstanceGroupKind* kind);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceDeviceId(TRITONBACKEND_ModelInstance* instance, int32_t* device_id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceHostPolicy(TRITONBACKEND_ModelInstance* instance, TRITONSERVER_Message** host_policy);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceIsPassive(TRITONBACKEND_ModelInstance* instance, bool* is_passive);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceProfileCount(TRITONBACKEND_ModelInstance* instance, uint32_t* count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceProfileName(TRITONBACKEND_ModelInstance* instance, const uint32_t index, const char** profile_name);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSecondaryDeviceCount(TRITONBACKEND_ModelInstance* instance, uint32_t* count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSecondaryDeviceProperties(TRITONBACKEND_ModelInstance* instance, uint32_t index, const char** kind, int64_t* id);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Model** model);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance* instance, void** state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance* instance, void* state);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportMemoryUsage(TRITONBACKEND_ModelInstance* instance, TRITONSERVER_BufferAttributes** usage, uint32_t usage_size);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, const bool success, const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns, const uint64_t exec_end_ns);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsNew(TRITONBACKEND_ModelInstanceResponseStatistics** response_statistics);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsDelete(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetModelInstance(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, TRITONBACKEND_ModelInstance* model_instance);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseFactory(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, TRITONBACKEND_ResponseFactory* response_factory);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseStart(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, uint64_t response_start);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetComputeOutputStart(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, uint64_t compute_output_start);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseEnd(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, uint64_t response_end);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetError(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, TRITONSERVER_Error* error);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportResponseStatistics(TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance* instance, const uint64_t batch_size, const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns, const uint64_t exec_end_ns);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend* backend);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t request_count);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReady(TRITONBACKEND_ModelInstance* instance);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_GetBackendAttribute(TRITONBACKEND_Backend* backend, TRITONBACKEND_BackendAttribute* backend_attributes);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup(TRITONBACKEND_BackendAttribute* backend_attributes, const TRITONSERVER_InstanceGroupKind kind, const uint64_t count, const uint64_t* device_ids, const uint64_t id_count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(TRITONBACKEND_BackendAttribute* backend_attributes, bool enabled);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher, TRITONBACKEND_Model* model);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp, bool* should_include);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp);
TRITONBACKEND_ISPEC TRITONSERVER_Error* TRITONBACKEND_InferenceResponseOutputByName(TRITONBACKEND_Response* response, const char* name, TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count);
TRITONBACKEND_DECLSPEC TRITONSERVER_Error* TRITONBACKEND_InferenceResponseOutput(TRITONBACKEND_Response* response, const uint32_t index, const char** name, TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count);

#ifdef __cplusplus
}  /* extern "C" */
#endif
#endif  /* INFERPOOL_TRITONBACKEND_H */
