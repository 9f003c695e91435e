/* Implicit state (sequence batching): TRITONBACKEND_StateNew, StateBuffer, StateUpdate. */
#include "host.h"

#include <string.h>

/* ================================================================== implicit state */
HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateNew(TRITONBACKEND_State** state,
                                                       TRITONBACKEND_Request* request,
                                                       const char* name,
                                                       const TRITONSERVER_DataType datatype,
                                                       const int64_t* shape,
                                                       const uint32_t dims_count) {
  HOST_NOT_NULL(state, "state");
  REQUEST_ARG(request);
  HOST_NOT_NULL(name, "name");
  HostState* made = calloc(1, sizeof(*made));
  made->request = request;
  made->name = strdup(name);
  made->datatype = datatype;
  made->shape = host_shape_copy(shape, dims_count);
  made->dims_count = dims_count;
  pthread_mutex_lock(&request->lock);
  made->next = request->states;
  request->states = made;
  pthread_mutex_unlock(&request->lock);
  *state = (TRITONBACKEND_State*)made;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateBuffer(TRITONBACKEND_State* state,
                                                          void** buffer,
                                                          const uint64_t buffer_byte_size,
                                                          TRITONSERVER_MemoryType* memory_type,
                                                          int64_t* memory_type_id) {
  HOST_NOT_NULL(state, "state");
  HostState* s = (HostState*)state;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* shape = host_shape_tuple(s->shape, s->dims_count);
  PyObject* result =
      shape == NULL ? NULL
                    : PyObject_CallFunction(host_bridge.state_buffer, "OysOK", s->request->py,
                                            s->name, host_datatype_string(s->datatype), shape,
                                            (unsigned long long)buffer_byte_size);
  Py_XDECREF(shape);
  TRITONSERVER_Error* error = NULL;
  if (result == NULL) {
    error = host_python_error("TRITONBACKEND_StateBuffer");
  } else {
    error = host_buffer_of(result, &s->buffer, &s->attributes, "TRITONBACKEND_StateBuffer");
    Py_DECREF(result);
  }
  PyGILState_Release(gil);
  if (error != NULL) return error;
  s->byte_size = buffer_byte_size;
  s->attributes.byte_size = buffer_byte_size;
  *buffer = s->buffer;
  if (memory_type != NULL) *memory_type = s->attributes.memory_type;
  if (memory_type_id != NULL) *memory_type_id = s->attributes.memory_type_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateUpdate(TRITONBACKEND_State* state) {
  HOST_NOT_NULL(state, "state");
  HostState* s = (HostState*)state;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* result =
      PyObject_CallFunction(host_bridge.state_update, "Oy", s->request->py, s->name);
  TRITONSERVER_Error* error = host_checked(result, "TRITONBACKEND_StateUpdate");
  PyGILState_Release(gil);
  return error;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateBufferAttributes(
    TRITONBACKEND_State* state, TRITONSERVER_BufferAttributes** buffer_attributes) {
  HOST_NOT_NULL(state, "state");
  *buffer_attributes = &((HostState*)state)->attributes;
  return NULL;
}
