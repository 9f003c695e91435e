/* The three levels a backend is handed (backend, model, instance): names, configs, state,
 * the memory manager, statistics and memory-usage reports. */
#include "host.h"

#include <string.h>


HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = TRITONBACKEND_API_VERSION_MAJOR;
  *minor = TRITONBACKEND_API_VERSION_MINOR;
  return NULL;
}

/* ------------------------------------------------------------------ backend */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendName(TRITONBACKEND_Backend* backend,
                                                          const char** name) {
  HOST_NOT_NULL(backend, "backend");
  *name = backend->name;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendConfig(TRITONBACKEND_Backend* backend,
                                                            TRITONSERVER_Message** backend_config) {
  HOST_NOT_NULL(backend, "backend");
  return TRITONSERVER_MessageNewFromSerializedJson(backend_config, backend->config_json,
                                                   strlen(backend->config_json));
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendExecutionPolicy(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_ExecutionPolicy* policy) {
  HOST_NOT_NULL(backend, "backend");
  *policy = backend->policy;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendSetExecutionPolicy(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_ExecutionPolicy policy) {
  HOST_NOT_NULL(backend, "backend");
  backend->policy = policy; /* one instance per process: both policies run the same way */
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendArtifacts(TRITONBACKEND_Backend* backend,
                                                               TRITONBACKEND_ArtifactType* type,
                                                               const char** location) {
  HOST_NOT_NULL(backend, "backend");
  *type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  *location = backend->directory;
  return NULL;
}

/* the one memory manager: host memory from malloc (pinned memory is host memory here) */
static int memory_manager;

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendMemoryManager(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_MemoryManager** manager) {
  HOST_NOT_NULL(backend, "backend");
  *manager = (TRITONBACKEND_MemoryManager*)&memory_manager;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_MemoryManagerAllocate(
    TRITONBACKEND_MemoryManager* manager, void** buffer, const TRITONSERVER_MemoryType memory_type,
    const int64_t memory_type_id, const uint64_t byte_size) {
  (void)manager;
  (void)memory_type_id;
  HOST_NOT_NULL(buffer, "buffer");
  if (memory_type == TRITONSERVER_MEMORY_GPU)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONBACKEND_MemoryManagerAllocate: GPU memory is not supported");
  *buffer = malloc(byte_size == 0 ? 1 : byte_size);
  if (*buffer == NULL)
    return host_error(TRITONSERVER_ERROR_UNAVAILABLE,
                      "TRITONBACKEND_MemoryManagerAllocate: out of memory (%llu bytes)",
                      (unsigned long long)byte_size);
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_MemoryManagerFree(
    TRITONBACKEND_MemoryManager* manager, void* buffer, const TRITONSERVER_MemoryType memory_type,
    const int64_t memory_type_id) {
  (void)manager;
  (void)memory_type_id;
  if (memory_type == TRITONSERVER_MEMORY_GPU)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONBACKEND_MemoryManagerFree: GPU memory is not supported");
  free(buffer);
  return NULL;
}

#define STATE_ACCESSORS(LEVEL, TYPE, ARG)                                                  \
  HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_##LEVEL##State(TYPE* ARG, void** state) { \
    HOST_NOT_NULL(ARG, #ARG);                                                              \
    *state = ARG->state;                                                                   \
    return NULL;                                                                           \
  }                                                                                        \
  HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_##LEVEL##SetState(TYPE* ARG, void* state) { \
    HOST_NOT_NULL(ARG, #ARG);                                                              \
    ARG->state = state;                                                                    \
    return NULL;                                                                           \
  }

STATE_ACCESSORS(Backend, TRITONBACKEND_Backend, backend)
STATE_ACCESSORS(Model, TRITONBACKEND_Model, model)
STATE_ACCESSORS(ModelInstance, TRITONBACKEND_ModelInstance, instance)

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup(
    TRITONBACKEND_BackendAttribute* backend_attributes, const TRITONSERVER_InstanceGroupKind kind,
    const uint64_t count, const uint64_t* device_ids, const uint64_t id_count) {
  /* instance groups are placed by the broker before any worker loads the backend */
  (void)backend_attributes;
  (void)kind;
  (void)count;
  (void)device_ids;
  (void)id_count;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(
    TRITONBACKEND_BackendAttribute* backend_attributes, bool enabled) {
  HOST_NOT_NULL(backend_attributes, "backend_attributes");
  backend_attributes->parallel_instance_loading = enabled;
  return NULL;
}

/* ------------------------------------------------------------------ model */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model,
                                                        const char** name) {
  HOST_NOT_NULL(model, "model");
  *name = model->name;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model* model,
                                                           uint64_t* version) {
  HOST_NOT_NULL(model, "model");
  *version = model->version;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model,
                                                              TRITONBACKEND_ArtifactType* type,
                                                              const char** location) {
  HOST_NOT_NULL(model, "model");
  *type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  *location = model->repository;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model,
                                                          const uint32_t config_version,
                                                          TRITONSERVER_Message** model_config) {
  HOST_NOT_NULL(model, "model");
  if (config_version != 1)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONBACKEND_ModelConfig: model configuration version %u is not "
                      "supported, only version 1",
                      config_version);
  PyGILState_STATE gil = PyGILState_Ensure(); /* ModelSetConfig may replace it */
  TRITONSERVER_Error* error = TRITONSERVER_MessageNewFromSerializedJson(
      model_config, model->config_json, strlen(model->config_json));
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelAutoCompleteConfig(TRITONBACKEND_Model* model,
                                                                      bool* auto_complete_config) {
  HOST_NOT_NULL(model, "model");
  *auto_complete_config = model->auto_complete;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelSetConfig(TRITONBACKEND_Model* model,
                                                             const uint32_t config_version,
                                                             TRITONSERVER_Message* model_config) {
  HOST_NOT_NULL(model, "model");
  HOST_NOT_NULL(model_config, "model_config");
  if (config_version != 1)
    return host_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "TRITONBACKEND_ModelSetConfig: model configuration version %u is not "
                      "supported, only version 1",
                      config_version);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(host_bridge.set_config, "Os#", model->owner,
                                           model_config->json, (Py_ssize_t)model_config->size);
  TRITONSERVER_Error* error = NULL;
  if (result == NULL) {
    error = host_python_error("TRITONBACKEND_ModelSetConfig");
  } else {
    const char* json = PyUnicode_AsUTF8(result); /* the config as the model now serves it */
    if (json == NULL) {
      error = host_python_error("TRITONBACKEND_ModelSetConfig");
    } else {
      free(model->config_json);
      model->config_json = strdup(json);
    }
    Py_DECREF(result);
  }
  PyGILState_Release(gil);
  return error;
}

static int the_server; /* the server a worker's backend asks (server_queries.c, calls.c) */

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelServer(TRITONBACKEND_Model* model,
                                                          TRITONSERVER_Server** server) {
  HOST_NOT_NULL(model, "model");
  *server = (TRITONSERVER_Server*)&the_server;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBackend(TRITONBACKEND_Model* model,
                                                           TRITONBACKEND_Backend** backend) {
  HOST_NOT_NULL(model, "model");
  *backend = model->backend;
  return NULL;
}

static TRITONSERVER_Error* report_memory(PyObject* owner, TRITONSERVER_BufferAttributes** usage,
                                         uint32_t usage_size, const char* where) {
  PyGILState_STATE gil = PyGILState_Ensure();
  TRITONSERVER_Error* error = NULL;
  PyObject* list = PyList_New(usage_size);
  for (uint32_t i = 0; list != NULL && i < usage_size; i++) {
    if (usage[i] == NULL) {
      error = host_error(TRITONSERVER_ERROR_INVALID_ARG, "%s: usage %u is null", where, i);
      break;
    }
    PyList_SET_ITEM(list, i,
                    Py_BuildValue("(sLn)", TRITONSERVER_MemoryTypeString(usage[i]->memory_type),
                                  (long long)usage[i]->memory_type_id,
                                  (Py_ssize_t)usage[i]->byte_size));
  }
  if (error == NULL) {
    PyObject* result =
        list == NULL ? NULL : PyObject_CallFunctionObjArgs(host_bridge.memory, owner, list, NULL);
    error = host_checked(result, where);
  }
  Py_XDECREF(list);
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelReportMemoryUsage(
    TRITONBACKEND_Model* model, TRITONSERVER_BufferAttributes** usage, uint32_t usage_size) {
  HOST_NOT_NULL(model, "model");
  return report_memory(model->owner, usage, usage_size, "TRITONBACKEND_ModelReportMemoryUsage");
}

/* ------------------------------------------------------------------ instance */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(
    TRITONBACKEND_ModelInstance* instance, const char** name) {
  HOST_NOT_NULL(instance, "instance");
  *name = instance->name;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceKind(
    TRITONBACKEND_ModelInstance* instance, TRITONSERVER_InstanceGroupKind* kind) {
  HOST_NOT_NULL(instance, "instance");
  *kind = instance->kind;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceDeviceId(
    TRITONBACKEND_ModelInstance* instance, int32_t* device_id) {
  HOST_NOT_NULL(instance, "instance");
  *device_id = instance->device_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceHostPolicy(
    TRITONBACKEND_ModelInstance* instance, TRITONSERVER_Message** host_policy) {
  HOST_NOT_NULL(instance, "instance");
  return TRITONSERVER_MessageNewFromSerializedJson(host_policy, instance->host_policy_json,
                                                   strlen(instance->host_policy_json));
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceIsPassive(
    TRITONBACKEND_ModelInstance* instance, bool* is_passive) {
  HOST_NOT_NULL(instance, "instance");
  *is_passive = false;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceProfileCount(
    TRITONBACKEND_ModelInstance* instance, uint32_t* count) {
  HOST_NOT_NULL(instance, "instance");
  *count = 0;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceProfileName(
    TRITONBACKEND_ModelInstance* instance, const uint32_t index, const char** profile_name) {
  HOST_NOT_NULL(instance, "instance");
  (void)profile_name;
  return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "TRITONBACKEND_ModelInstanceProfileName: out of bounds index %u: instance "
                    "has 0 profiles",
                    index);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSecondaryDeviceCount(
    TRITONBACKEND_ModelInstance* instance, uint32_t* count) {
  HOST_NOT_NULL(instance, "instance");
  *count = instance->secondary_count;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSecondaryDeviceProperties(
    TRITONBACKEND_ModelInstance* instance, uint32_t index, const char** kind, int64_t* id) {
  HOST_NOT_NULL(instance, "instance");
  if (index >= instance->secondary_count)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "TRITONBACKEND_ModelInstanceSecondaryDeviceProperties: out of bounds index "
                      "%u: instance has %u secondary devices",
                      index, instance->secondary_count);
  *kind = instance->secondary_kinds[index];
  *id = instance->secondary_ids[index];
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Model** model) {
  HOST_NOT_NULL(instance, "instance");
  *model = instance->model;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportMemoryUsage(
    TRITONBACKEND_ModelInstance* instance, TRITONSERVER_BufferAttributes** usage,
    uint32_t usage_size) {
  HOST_NOT_NULL(instance, "instance");
  return report_memory(instance->owner, usage, usage_size,
                       "TRITONBACKEND_ModelInstanceReportMemoryUsage");
}
