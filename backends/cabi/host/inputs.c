/* Inputs as a C backend reads them: the Python type whose object is a
 * TRITONBACKEND_Input (made once per place in shared memory), and its accessors. */
#include "host.h"

#include <string.h>

/* ================================================================== inputs (Python type) */
static int input_init(HostInput* self, PyObject* args, PyObject* kwds) {
  (void)kwds;
  PyObject *name, *shape, *buffer, *keep = Py_None;
  int datatype, memory_type;
  unsigned long long byte_size;
  long long device_id;
  if (!PyArg_ParseTuple(args, "O!iO!KOiL|O", &PyBytes_Type, &name, &datatype, &PyTuple_Type,
                        &shape, &byte_size, &buffer, &memory_type, &device_id, &keep))
    return -1;
  Py_ssize_t dims = PyTuple_GET_SIZE(shape);
  self->shape = PyMem_Malloc(sizeof(int64_t) * (dims ? dims : 1));
  for (Py_ssize_t i = 0; i < dims; i++) {
    self->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (self->shape[i] == -1 && PyErr_Occurred()) return -1;
  }
  if (PyLong_Check(buffer)) { /* a device address; ``keep`` keeps its memory */
    self->buffer = PyLong_AsVoidPtr(buffer);
    Py_INCREF(keep);
    self->keep = keep;
  } else {
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_SIMPLE) < 0) return -1;
    self->has_view = 1;
    self->buffer = self->view.buf;
  }
  Py_INCREF(name);
  self->name_obj = name;
  self->name = PyBytes_AS_STRING(name);
  self->datatype = (TRITONSERVER_DataType)datatype;
  self->dims_count = (uint32_t)dims;
  self->byte_size = byte_size;
  self->attributes.memory_type = (TRITONSERVER_MemoryType)memory_type;
  self->attributes.memory_type_id = device_id;
  self->attributes.byte_size = byte_size;
  return 0;
}

static void input_dealloc(HostInput* self) {
  if (self->has_view) PyBuffer_Release(&self->view);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->name_obj);
  PyMem_Free(self->shape);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyTypeObject HostInputType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "inferpool.backends.cabi._tritonserver.Input",
    .tp_basicsize = sizeof(HostInput),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TRITONBACKEND_Input: Input(name, datatype, shape, byte_size, buffer, "
              "memory_type, memory_type_id[, keep])",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)input_init,
    .tp_dealloc = (destructor)input_dealloc,
};

/* ================================================================== input accessors */
static TRITONSERVER_Error* input_properties(TRITONBACKEND_Input* input, const char** name,
                                            TRITONSERVER_DataType* datatype, const int64_t** shape,
                                            uint32_t* dims_count, uint64_t* byte_size,
                                            uint32_t* buffer_count) {
  HOST_NOT_NULL(input, "input");
  if (name != NULL) *name = input->name;
  if (datatype != NULL) *datatype = input->datatype;
  if (shape != NULL) *shape = input->shape;
  if (dims_count != NULL) *dims_count = input->dims_count;
  if (byte_size != NULL) *byte_size = input->byte_size;
  if (buffer_count != NULL) *buffer_count = 1;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputProperties(
    TRITONBACKEND_Input* input, const char** name, TRITONSERVER_DataType* datatype,
    const int64_t** shape, uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count) {
  return input_properties(input, name, datatype, shape, dims_count, byte_size, buffer_count);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputPropertiesForHostPolicy(
    TRITONBACKEND_Input* input, const char* host_policy_name, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint32_t* dims_count,
    uint64_t* byte_size, uint32_t* buffer_count) {
  (void)host_policy_name; /* one worker, one host policy: the input is the same for all */
  return input_properties(input, name, datatype, shape, dims_count, byte_size, buffer_count);
}

static TRITONSERVER_Error* input_buffer(TRITONBACKEND_Input* input, const uint32_t index,
                                        const void** buffer, uint64_t* buffer_byte_size,
                                        TRITONSERVER_MemoryType* memory_type,
                                        int64_t* memory_type_id) {
  HOST_NOT_NULL(input, "input");
  if (index != 0)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: input '%s' has 1 buffer", index, input->name);
  *buffer = input->buffer;
  *buffer_byte_size = input->byte_size;
  *memory_type = input->attributes.memory_type; /* where it is, whatever was preferred */
  *memory_type_id = input->attributes.memory_type_id;
  return NULL;
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input,
                                                          const uint32_t index,
                                                          const void** buffer,
                                                          uint64_t* buffer_byte_size,
                                                          TRITONSERVER_MemoryType* memory_type,
                                                          int64_t* memory_type_id) {
  return input_buffer(input, index, buffer, buffer_byte_size, memory_type, memory_type_id);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBufferForHostPolicy(
    TRITONBACKEND_Input* input, const char* host_policy_name, const uint32_t index,
    const void** buffer, uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
    int64_t* memory_type_id) {
  (void)host_policy_name;
  return input_buffer(input, index, buffer, buffer_byte_size, memory_type, memory_type_id);
}

HOST_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBufferAttributes(
    TRITONBACKEND_Input* input, const uint32_t index, const void** buffer,
    TRITONSERVER_BufferAttributes** buffer_attributes) {
  HOST_NOT_NULL(input, "input");
  if (index != 0)
    return host_error(TRITONSERVER_ERROR_INVALID_ARG,
                      "out of bounds index %u: input '%s' has 1 buffer", index, input->name);
  *buffer = input->buffer;
  *buffer_attributes = &input->attributes;
  return NULL;
}
