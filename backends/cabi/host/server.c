/* The TRITONSERVER_* values a backend makes and reads: errors, messages, parameters, data
 * and memory types, buffer attributes, logs and traces. */
#include "host.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>


atomic_int host_log_enabled[4] = {1, 1, 1, 0};

char* host_strdup(const char* text) {
  return text == NULL ? NULL : strdup(text);
}

TRITONSERVER_Error* host_error(TRITONSERVER_Error_Code code, const char* format, ...) {
  TRITONSERVER_Error* error = malloc(sizeof(*error));
  va_list args;
  va_start(args, format);
  if (vasprintf(&error->message, format, args) < 0) error->message = strdup("(no memory)");
  va_end(args);
  error->code = code;
  return error;
}

/* ------------------------------------------------------------------ errors */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code,
                                                      const char* msg) {
  return host_error(code, "%s", msg == NULL ? "" : msg);
}

HOST_EXPORT void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error) {
  if (error == NULL) return;
  free(error->message);
  free(error);
}

HOST_EXPORT TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error* error) {
  return error->code;
}

HOST_EXPORT const char* TRITONSERVER_ErrorCodeString(TRITONSERVER_Error* error) {
  switch (error->code) {
    case TRITONSERVER_ERROR_UNKNOWN: return "Unknown";
    case TRITONSERVER_ERROR_INTERNAL: return "Internal";
    case TRITONSERVER_ERROR_NOT_FOUND: return "Not found";
    case TRITONSERVER_ERROR_INVALID_ARG: return "Invalid argument";
    case TRITONSERVER_ERROR_UNAVAILABLE: return "Unavailable";
    case TRITONSERVER_ERROR_UNSUPPORTED: return "Unsupported";
    case TRITONSERVER_ERROR_ALREADY_EXISTS: return "Already exists";
    case TRITONSERVER_ERROR_CANCELLED: return "Cancelled";
  }
  return "<invalid code>";
}

HOST_EXPORT const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error) {
  return error->message;
}

/* ------------------------------------------------------------------ messages (JSON) */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MessageNewFromSerializedJson(
    TRITONSERVER_Message** message, const char* base, size_t byte_size) {
  HOST_NOT_NULL(message, "message");
  HOST_NOT_NULL(base, "base");
  TRITONSERVER_Message* made = malloc(sizeof(*made));
  made->json = malloc(byte_size + 1);
  memcpy(made->json, base, byte_size);
  made->json[byte_size] = '\0';
  made->size = byte_size;
  *message = made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message) {
  if (message != NULL) {
    free(message->json);
    free(message);
  }
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(
    TRITONSERVER_Message* message, const char** base, size_t* byte_size) {
  HOST_NOT_NULL(message, "message");
  *base = message->json;
  *byte_size = message->size;
  return NULL;
}

/* ------------------------------------------------------------------ data and memory types */
static const char* const DATATYPES[] = {"<invalid>", "BOOL", "UINT8", "UINT16", "UINT32",
                                        "UINT64",    "INT8", "INT16", "INT32",  "INT64",
                                        "FP16",      "FP32", "FP64",  "BYTES",  "BF16"};
static const uint32_t DATATYPE_SIZES[] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0, 2};
#define DATATYPE_COUNT (sizeof(DATATYPES) / sizeof(DATATYPES[0]))

const char* host_datatype_string(TRITONSERVER_DataType datatype) {
  return (unsigned)datatype < DATATYPE_COUNT ? DATATYPES[datatype] : "<invalid>";
}

/* the datatype's name as a Python string (a new reference to one made once; GIL held) */
PyObject* host_datatype_name(TRITONSERVER_DataType datatype) {
  static PyObject* names[DATATYPE_COUNT];
  unsigned index = (unsigned)datatype < DATATYPE_COUNT ? (unsigned)datatype : 0;
  if (names[index] == NULL) names[index] = PyUnicode_InternFromString(DATATYPES[index]);
  Py_XINCREF(names[index]);
  return names[index];
}

HOST_EXPORT const char* TRITONSERVER_DataTypeString(TRITONSERVER_DataType datatype) {
  return host_datatype_string(datatype);
}

HOST_EXPORT TRITONSERVER_DataType TRITONSERVER_StringToDataType(const char* dtype) {
  if (dtype == NULL) return TRITONSERVER_TYPE_INVALID;
  for (unsigned i = 1; i < DATATYPE_COUNT; i++)
    if (strcmp(dtype, DATATYPES[i]) == 0) return (TRITONSERVER_DataType)i;
  return TRITONSERVER_TYPE_INVALID;
}

HOST_EXPORT uint32_t TRITONSERVER_DataTypeByteSize(TRITONSERVER_DataType datatype) {
  return (unsigned)datatype < DATATYPE_COUNT ? DATATYPE_SIZES[datatype] : 0;
}

HOST_EXPORT const char* TRITONSERVER_MemoryTypeString(TRITONSERVER_MemoryType memtype) {
  switch (memtype) {
    case TRITONSERVER_MEMORY_CPU: return "CPU";
    case TRITONSERVER_MEMORY_CPU_PINNED: return "CPU_PINNED";
    case TRITONSERVER_MEMORY_GPU: return "GPU";
  }
  return "<invalid>";
}

HOST_EXPORT const char* TRITONSERVER_InstanceGroupKindString(TRITONSERVER_InstanceGroupKind kind) {
  switch (kind) {
    case TRITONSERVER_INSTANCEGROUPKIND_AUTO: return "AUTO";
    case TRITONSERVER_INSTANCEGROUPKIND_CPU: return "CPU";
    case TRITONSERVER_INSTANCEGROUPKIND_GPU: return "GPU";
    case TRITONSERVER_INSTANCEGROUPKIND_MODEL: return "MODEL";
  }
  return "<invalid>";
}

/* ------------------------------------------------------------------ parameters */
HOST_EXPORT const char* TRITONSERVER_ParameterTypeString(TRITONSERVER_ParameterType paramtype) {
  switch (paramtype) {
    case TRITONSERVER_PARAMETER_STRING: return "STRING";
    case TRITONSERVER_PARAMETER_INT: return "INT";
    case TRITONSERVER_PARAMETER_BOOL: return "BOOL";
    case TRITONSERVER_PARAMETER_DOUBLE: return "DOUBLE";
    case TRITONSERVER_PARAMETER_BYTES: return "BYTES";
  }
  return "<invalid>";
}

HOST_EXPORT TRITONSERVER_Parameter* TRITONSERVER_ParameterNew(const char* name,
                                                             const TRITONSERVER_ParameterType type,
                                                             const void* value) {
  if (name == NULL || value == NULL) return NULL;
  TRITONSERVER_Parameter* p = calloc(1, sizeof(*p));
  p->name = strdup(name);
  p->type = type;
  switch (type) {
    case TRITONSERVER_PARAMETER_STRING: p->string_value = strdup((const char*)value); break;
    case TRITONSERVER_PARAMETER_INT: p->int_value = *(const int64_t*)value; break;
    case TRITONSERVER_PARAMETER_BOOL: p->bool_value = *(const bool*)value; break;
    case TRITONSERVER_PARAMETER_DOUBLE: p->double_value = *(const double*)value; break;
    default: /* BYTES needs ParameterBytesNew */
      free(p->name);
      free(p);
      return NULL;
  }
  return p;
}

HOST_EXPORT TRITONSERVER_Parameter* TRITONSERVER_ParameterBytesNew(const char* name,
                                                                  const void* byte_ptr,
                                                                  const uint64_t size) {
  if (name == NULL) return NULL;
  TRITONSERVER_Parameter* p = calloc(1, sizeof(*p));
  p->name = strdup(name);
  p->type = TRITONSERVER_PARAMETER_BYTES;
  p->bytes = (void*)byte_ptr;
  p->byte_size = size;
  return p;
}

void host_parameter_free(TRITONSERVER_Parameter* parameter) {
  if (parameter == NULL) return;
  free(parameter->name);
  free(parameter->string_value);
  free(parameter);
}

HOST_EXPORT void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter* parameter) {
  host_parameter_free(parameter);
}

/* a parameter's value as Python sees it (GIL held) */
PyObject* host_parameter_value(const TRITONSERVER_Parameter* p) {
  switch (p->type) {
    case TRITONSERVER_PARAMETER_STRING: return PyUnicode_DecodeUTF8(p->string_value, strlen(p->string_value), "replace");
    case TRITONSERVER_PARAMETER_INT: return PyLong_FromLongLong(p->int_value);
    case TRITONSERVER_PARAMETER_BOOL: return PyBool_FromLong(p->bool_value);
    case TRITONSERVER_PARAMETER_DOUBLE: return PyFloat_FromDouble(p->double_value);
    case TRITONSERVER_PARAMETER_BYTES: return PyBytes_FromStringAndSize(p->bytes, (Py_ssize_t)p->byte_size);
  }
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ buffer attributes */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesNew(
    TRITONSERVER_BufferAttributes** buffer_attributes) {
  HOST_NOT_NULL(buffer_attributes, "buffer_attributes");
  *buffer_attributes = calloc(1, sizeof(**buffer_attributes));
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesDelete(
    TRITONSERVER_BufferAttributes* buffer_attributes) {
  free(buffer_attributes);
  return NULL;
}

#define ATTRIBUTE(SET, GET, FIELD, TYPE)                                                   \
  HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributes##SET(                     \
      TRITONSERVER_BufferAttributes* buffer_attributes, TYPE value) {                     \
    HOST_NOT_NULL(buffer_attributes, "buffer_attributes");                                \
    buffer_attributes->FIELD = value;                                                     \
    return NULL;                                                                          \
  }                                                                                       \
  HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributes##GET(                     \
      TRITONSERVER_BufferAttributes* buffer_attributes, TYPE* value) {                    \
    HOST_NOT_NULL(buffer_attributes, "buffer_attributes");                                \
    HOST_NOT_NULL(value, "value");                                                        \
    *value = buffer_attributes->FIELD;                                                    \
    return NULL;                                                                          \
  }

ATTRIBUTE(SetMemoryTypeId, MemoryTypeId, memory_type_id, int64_t)
ATTRIBUTE(SetMemoryType, MemoryType, memory_type, TRITONSERVER_MemoryType)
ATTRIBUTE(SetCudaIpcHandle, CudaIpcHandle, cuda_ipc_handle, void*)
ATTRIBUTE(SetByteSize, ByteSize, byte_size, size_t)

/* ------------------------------------------------------------------ logs */
HOST_EXPORT bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level) {
  return (unsigned)level < 4 && atomic_load_explicit(&host_log_enabled[level], memory_order_relaxed);
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level,
                                                        const char* filename, const int line,
                                                        const char* msg) {
  if (!TRITONSERVER_LogIsEnabled(level) || host_bridge.log == NULL) return NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result = PyObject_CallFunction(host_bridge.log, "isis", (int)level,
                                           filename ? filename : "", line, msg ? msg : "");
  TRITONSERVER_Error* error = host_checked(result, "TRITONSERVER_LogMessage");
  PyGILState_Release(gil);
  return error;
}

/* ------------------------------------------------------------------ traces: never on */
static const char* const ACTIVITIES[] = {
    "REQUEST_START",       "QUEUE_START",          "COMPUTE_START",         "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END",         "REQUEST_END",           "TENSOR_QUEUE_INPUT",
    "TENSOR_BACKEND_INPUT", "TENSOR_BACKEND_OUTPUT", "CUSTOM_ACTIVITY"};

HOST_EXPORT const char* TRITONSERVER_InferenceTraceActivityString(
    TRITONSERVER_InferenceTraceActivity activity) {
  return (unsigned)activity < 11 ? ACTIVITIES[activity] : "<unknown>";
}

HOST_EXPORT const char* TRITONSERVER_InferenceTraceLevelString(
    TRITONSERVER_InferenceTraceLevel level) {
  switch (level) {
    case TRITONSERVER_TRACE_LEVEL_DISABLED: return "DISABLED";
    case TRITONSERVER_TRACE_LEVEL_MIN: return "MIN";
    case TRITONSERVER_TRACE_LEVEL_MAX: return "MAX";
    case TRITONSERVER_TRACE_LEVEL_TIMESTAMPS: return "TIMESTAMPS";
    case TRITONSERVER_TRACE_LEVEL_TENSORS: return "TENSORS";
  }
  return "<unknown>";
}

/* TRITONBACKEND_RequestTrace hands out no trace: a backend reports an activity only to a
 * trace it was given, so one that reports anyway reports to nothing. */
HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceTraceReportActivity(
    TRITONSERVER_InferenceTrace* trace, uint64_t timestamp, const char* activity_name) {
  (void)trace;
  (void)timestamp;
  (void)activity_name;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONSERVER_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = TRITONSERVER_API_VERSION_MAJOR;
  *minor = TRITONSERVER_API_VERSION_MINOR;
  return NULL;
}
