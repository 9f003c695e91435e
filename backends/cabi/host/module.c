/* The Python side of the host: the module inferpool.backends.cabi._tritonserver.
 *
 * Python makes the three levels (capsules over the C structures), calls a backend's entry
 * points with the GIL released (a backend's own threads call back into the host, and each
 * call takes the GIL it needs), and binds the bridge whose methods the host calls. */
#include <string.h>

#include "host.h"

Bridge host_bridge;

/* ------------------------------------------------------------------ shared helpers */
TRITONSERVER_Error_Code host_code_of(const char* name) {
  static const struct {
    const char* name;
    TRITONSERVER_Error_Code code;
  } codes[] = {
      {"UNKNOWN", TRITONSERVER_ERROR_UNKNOWN},         {"INTERNAL", TRITONSERVER_ERROR_INTERNAL},
      {"NOT_FOUND", TRITONSERVER_ERROR_NOT_FOUND},     {"INVALID_ARG", TRITONSERVER_ERROR_INVALID_ARG},
      {"UNAVAILABLE", TRITONSERVER_ERROR_UNAVAILABLE}, {"UNSUPPORTED", TRITONSERVER_ERROR_UNSUPPORTED},
      {"ALREADY_EXISTS", TRITONSERVER_ERROR_ALREADY_EXISTS},
      {"CANCELLED", TRITONSERVER_ERROR_CANCELLED},     {"TIMEOUT", TRITONSERVER_ERROR_UNAVAILABLE},
  };
  for (size_t k = 0; name != NULL && k < sizeof(codes) / sizeof(codes[0]); k++)
    if (strcmp(name, codes[k].name) == 0) return codes[k].code;
  return TRITONSERVER_ERROR_INTERNAL;
}

TRITONSERVER_Error* host_python_error(const char* where) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_INTERNAL;
  PyObject* text = NULL;
  if (value != NULL) { /* an InferpoolError carries its code by name (wire.errors.Code) */
    PyObject* name = PyObject_GetAttrString(value, "code");
    const char* text_code = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (text_code == NULL) PyErr_Clear();
    code = host_code_of(text_code);
    Py_XDECREF(name);
    PyObject* message = PyObject_GetAttrString(value, "message");
    if (message != NULL && PyUnicode_Check(message)) {
      text = message;
    } else {
      PyErr_Clear();
      Py_XDECREF(message);
      text = PyObject_Str(value);
    }
  }
  const char* message = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
  if (message == NULL) PyErr_Clear();
  TRITONSERVER_Error* error = host_error(code, "%s", message ? message : where);
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return error;
}

TRITONSERVER_Error* host_checked(PyObject* result, const char* where) {
  if (result == NULL) return host_python_error(where);
  Py_DECREF(result);
  return NULL;
}

PyObject* host_shape_tuple(const int64_t* shape, uint32_t dims_count) {
  PyObject* tuple = PyTuple_New(dims_count);
  for (uint32_t i = 0; tuple != NULL && i < dims_count; i++)
    PyTuple_SET_ITEM(tuple, i, PyLong_FromLongLong(shape[i]));
  return tuple;
}

int64_t* host_shape_copy(const int64_t* shape, uint32_t dims_count) {
  int64_t* copy = malloc(sizeof(int64_t) * (dims_count ? dims_count : 1));
  if (dims_count) memcpy(copy, shape, sizeof(int64_t) * dims_count);
  return copy;
}

TRITONSERVER_Error* host_buffer_of(PyObject* placed, void** buffer,
                                   TRITONSERVER_BufferAttributes* attributes, const char* where) {
  if (PyTuple_Check(placed)) { /* device memory: (address, memory type, type id) */
    PyObject* address;
    int memory_type;
    long long memory_type_id;
    if (!PyArg_ParseTuple(placed, "O!iL", &PyLong_Type, &address, &memory_type, &memory_type_id))
      return host_python_error(where);
    *buffer = PyLong_AsVoidPtr(address);
    attributes->memory_type = (TRITONSERVER_MemoryType)memory_type;
    attributes->memory_type_id = memory_type_id;
    return NULL;
  }
  Py_buffer view; /* host memory; it stays mapped: the Python response holds its slot */
  if (PyObject_GetBuffer(placed, &view, PyBUF_WRITABLE) < 0) return host_python_error(where);
  *buffer = view.buf;
  PyBuffer_Release(&view);
  attributes->memory_type = TRITONSERVER_MEMORY_CPU;
  attributes->memory_type_id = 0;
  return NULL;
}

static char* utf8_copy(PyObject* text) {
  const char* utf8 = PyUnicode_AsUTF8(text);
  return utf8 == NULL ? NULL : strdup(utf8);
}

static PyObject* error_result(TRITONSERVER_Error* error) {
  if (error == NULL) Py_RETURN_NONE;
  PyObject* result = Py_BuildValue("(is)", (int)error->code, error->message);
  TRITONSERVER_ErrorDelete(error);
  return result;
}

/* ------------------------------------------------------------------ levels as capsules */
#define BACKEND_CAPSULE "TRITONBACKEND_Backend"
#define MODEL_CAPSULE "TRITONBACKEND_Model"
#define INSTANCE_CAPSULE "TRITONBACKEND_ModelInstance"

static void backend_free(PyObject* capsule) {
  TRITONBACKEND_Backend* b = PyCapsule_GetPointer(capsule, BACKEND_CAPSULE);
  free(b->name);
  free(b->config_json);
  free(b->directory);
  free(b);
}

static PyObject* new_backend(PyObject* self, PyObject* args) {
  (void)self;
  const char *name, *config, *directory;
  if (!PyArg_ParseTuple(args, "sss", &name, &config, &directory)) return NULL;
  TRITONBACKEND_Backend* b = calloc(1, sizeof(*b));
  b->name = strdup(name);
  b->config_json = strdup(config);
  b->directory = strdup(directory);
  return PyCapsule_New(b, BACKEND_CAPSULE, backend_free);
}

static void model_free(PyObject* capsule) {
  TRITONBACKEND_Model* m = PyCapsule_GetPointer(capsule, MODEL_CAPSULE);
  free(m->name);
  free(m->repository);
  free(m->config_json);
  free(m);
}

static PyObject* new_model(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *backend, *owner;
  const char *name, *repository, *config;
  unsigned long long version;
  int auto_complete;
  if (!PyArg_ParseTuple(args, "O!sKsspO", &PyCapsule_Type, &backend, &name, &version, &repository,
                        &config, &auto_complete, &owner))
    return NULL;
  TRITONBACKEND_Backend* b = PyCapsule_GetPointer(backend, BACKEND_CAPSULE);
  if (b == NULL) return NULL;
  TRITONBACKEND_Model* m = calloc(1, sizeof(*m));
  m->name = strdup(name);
  m->version = version;
  m->repository = strdup(repository);
  m->config_json = strdup(config);
  m->auto_complete = auto_complete;
  m->backend = b;
  m->owner = owner; /* borrowed: the owner holds this capsule */
  return PyCapsule_New(m, MODEL_CAPSULE, model_free);
}

static void instance_free(PyObject* capsule) {
  TRITONBACKEND_ModelInstance* i = PyCapsule_GetPointer(capsule, INSTANCE_CAPSULE);
  host_deferred_free(&i->deferred);
  free(i->name);
  free(i->host_policy_json);
  for (uint32_t k = 0; k < i->secondary_count; k++) free(i->secondary_kinds[k]);
  free(i->secondary_kinds);
  free(i->secondary_ids);
  free(i);
}

static PyObject* new_instance(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *model, *secondary, *owner;
  const char *name, *host_policy;
  int kind, device_id;
  if (!PyArg_ParseTuple(args, "O!siisO!O", &PyCapsule_Type, &model, &name, &kind, &device_id,
                        &host_policy, &PyList_Type, &secondary, &owner))
    return NULL;
  TRITONBACKEND_Model* m = PyCapsule_GetPointer(model, MODEL_CAPSULE);
  if (m == NULL) return NULL;
  TRITONBACKEND_ModelInstance* i = calloc(1, sizeof(*i));
  i->name = strdup(name);
  i->kind = (TRITONSERVER_InstanceGroupKind)kind;
  i->device_id = device_id;
  i->host_policy_json = strdup(host_policy);
  i->model = m;
  i->owner = owner;
  Py_ssize_t n = PyList_GET_SIZE(secondary);
  i->secondary_kinds = calloc(n ? n : 1, sizeof(char*));
  i->secondary_ids = calloc(n ? n : 1, sizeof(int64_t));
  for (Py_ssize_t k = 0; k < n; k++) { /* (kind, device id) */
    PyObject* item = PyList_GET_ITEM(secondary, k);
    const char* device_kind;
    long long id;
    if (!PyArg_ParseTuple(item, "sL", &device_kind, &id)) {
      i->secondary_count = (uint32_t)k;
      instance_free(PyCapsule_New(i, INSTANCE_CAPSULE, NULL));
      return NULL;
    }
    i->secondary_kinds[k] = strdup(device_kind);
    i->secondary_ids[k] = id;
  }
  i->secondary_count = (uint32_t)n;
  return PyCapsule_New(i, INSTANCE_CAPSULE, instance_free);
}

static PyObject* model_config(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Model* m = PyCapsule_GetPointer(capsule, MODEL_CAPSULE);
  return m == NULL ? NULL : PyUnicode_FromString(m->config_json);
}

static PyObject* set_model_config(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *json;
  if (!PyArg_ParseTuple(args, "O!U", &PyCapsule_Type, &capsule, &json)) return NULL;
  TRITONBACKEND_Model* m = PyCapsule_GetPointer(capsule, MODEL_CAPSULE);
  char* copy = m == NULL ? NULL : utf8_copy(json);
  if (copy == NULL) return NULL;
  free(m->config_json);
  m->config_json = copy;
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ calling a backend */
typedef TRITONSERVER_Error* (*LevelFn)(void*);
typedef TRITONSERVER_Error* (*ExecuteFn)(TRITONBACKEND_ModelInstance*, TRITONBACKEND_Request**,
                                         uint32_t);
typedef TRITONSERVER_Error* (*AttributeFn)(TRITONBACKEND_Backend*, TRITONBACKEND_BackendAttribute*);

static void* level_pointer(PyObject* capsule) {
  const char* name = PyCapsule_GetName(capsule);
  return name == NULL ? NULL : PyCapsule_GetPointer(capsule, name);
}

static PyObject* call_level(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *function, *capsule;
  if (!PyArg_ParseTuple(args, "O!O!", &PyLong_Type, &function, &PyCapsule_Type, &capsule))
    return NULL;
  LevelFn fn = (LevelFn)PyLong_AsVoidPtr(function);
  void* level = level_pointer(capsule);
  if (fn == NULL || level == NULL) return NULL;
  TRITONSERVER_Error* error;
  Py_BEGIN_ALLOW_THREADS error = fn(level);
  Py_END_ALLOW_THREADS return error_result(error);
}

static PyObject* backend_attribute(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *function, *capsule;
  if (!PyArg_ParseTuple(args, "O!O!", &PyLong_Type, &function, &PyCapsule_Type, &capsule))
    return NULL;
  AttributeFn fn = (AttributeFn)PyLong_AsVoidPtr(function);
  TRITONBACKEND_Backend* b = PyCapsule_GetPointer(capsule, BACKEND_CAPSULE);
  if (fn == NULL || b == NULL) return NULL;
  struct TRITONBACKEND_BackendAttribute attribute = {false};
  TRITONSERVER_Error* error;
  Py_BEGIN_ALLOW_THREADS error = fn(b, &attribute);
  Py_END_ALLOW_THREADS return Py_BuildValue("(NN)", error_result(error),
                                            PyBool_FromLong(attribute.parallel_instance_loading));
}

#define STACK_REQUESTS 64

static PyObject* execute(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *function, *capsule, *requests, *maker;
  if (!PyArg_ParseTuple(args, "O!O!O!O", &PyLong_Type, &function, &PyCapsule_Type, &capsule,
                        &PyList_Type, &requests, &maker))
    return NULL;
  ExecuteFn fn = (ExecuteFn)PyLong_AsVoidPtr(function);
  TRITONBACKEND_ModelInstance* instance = PyCapsule_GetPointer(capsule, INSTANCE_CAPSULE);
  if (fn == NULL || instance == NULL) return NULL;
  Py_ssize_t n = PyList_GET_SIZE(requests);
  TRITONBACKEND_Request* stack[STACK_REQUESTS];
  TRITONBACKEND_Request** handed = n <= STACK_REQUESTS ? stack : malloc(n * sizeof(*handed));
  for (Py_ssize_t k = 0; k < n; k++) {
    handed[k] = host_request_new(PyList_GET_ITEM(requests, k), maker);
    if (handed[k] == NULL) {
      while (k-- > 0) Py_DECREF((PyObject*)handed[k]);
      if (handed != stack) free(handed);
      return NULL;
    }
    handed[k]->instance = instance;
    host_request_hand_over(handed[k]);
  }
  TRITONSERVER_Error* error;
  Py_BEGIN_ALLOW_THREADS host_deferred = &instance->deferred;
  error = fn(instance, handed, (uint32_t)n);
  host_deferred = NULL;
  Py_END_ALLOW_THREADS;
  int drained = host_drain(&instance->deferred, instance->owner);
  for (Py_ssize_t k = 0; k < n; k++) { /* what the backend holds is its own */
    if (error != NULL) host_request_reclaim(handed[k]);
    Py_DECREF((PyObject*)handed[k]);
  }
  if (handed != stack) free(handed);
  if (drained < 0) {
    TRITONSERVER_ErrorDelete(error);
    return NULL;
  }
  return error_result(error);
}

/* ------------------------------------------------------------------ the bridge */
static PyObject* bind(PyObject* self, PyObject* bridge) {
  (void)self;
  struct {
    PyObject** slot;
    const char* name;
  } methods[] = {
      {&host_bridge.output, "output"},
      {&host_bridge.send, "send"},
      {&host_bridge.cancelled, "cancelled"},
      {&host_bridge.state_buffer, "state_buffer"},
      {&host_bridge.state_update, "state_update"},
      {&host_bridge.statistics, "statistics"},
      {&host_bridge.batch, "batch"},
      {&host_bridge.log, "log"},
      {&host_bridge.set_config, "set_config"},
      {&host_bridge.metric_family, "metric_family"},
      {&host_bridge.metric, "metric"},
      {&host_bridge.metric_op, "metric_op"},
      {&host_bridge.memory, "memory"},
      {&host_bridge.response_statistics, "response_statistics"},
      {&host_bridge.infer, "infer"},
      {&host_bridge.query, "query"},
      {&host_bridge.labels, "labels"},
  };
  for (size_t k = 0; k < sizeof(methods) / sizeof(methods[0]); k++) {
    PyObject* method = PyObject_GetAttrString(bridge, methods[k].name);
    if (method == NULL) return NULL;
    Py_XSETREF(*methods[k].slot, method);
  }
  Py_RETURN_NONE;
}

static PyObject* set_log_levels(PyObject* self, PyObject* args) {
  (void)self;
  int info, warn, error, verbose;
  if (!PyArg_ParseTuple(args, "pppp", &info, &warn, &error, &verbose)) return NULL;
  atomic_store(&host_log_enabled[TRITONSERVER_LOG_INFO], info);
  atomic_store(&host_log_enabled[TRITONSERVER_LOG_WARN], warn);
  atomic_store(&host_log_enabled[TRITONSERVER_LOG_ERROR], error);
  atomic_store(&host_log_enabled[TRITONSERVER_LOG_VERBOSE], verbose);
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"new_backend", new_backend, METH_VARARGS, "new_backend(name, config_json, directory)"},
    {"new_model", new_model, METH_VARARGS,
     "new_model(backend, name, version, repository, config_json, auto_complete, owner)"},
    {"new_instance", new_instance, METH_VARARGS,
     "new_instance(model, name, kind, device_id, host_policy_json, secondary, owner)"},
    {"model_config", model_config, METH_O, "the model's config JSON, as the backend sees it"},
    {"set_model_config", set_model_config, METH_VARARGS, "set_model_config(model, json)"},
    {"call", call_level, METH_VARARGS,
     "call(function, level): a lifecycle entry point; None or (code, message)"},
    {"backend_attribute", backend_attribute, METH_VARARGS,
     "backend_attribute(function, backend): (None or (code, message), parallel loading)"},
    {"execute", execute, METH_VARARGS,
     "execute(function, instance, requests, maker): None or (code, message); the host makes "
     "each request's C side (maker: backends/cabi/requests.py), and when the backend fails "
     "takes back those it still holds"},
    {"bind", bind, METH_O, "bind(bridge): the object whose methods the host calls"},
    {"deliver", host_deliver, METH_VARARGS,
     "deliver(request, outputs, parameters, error, final): a reply to a request a backend "
     "made, handed to its allocator and callbacks"},
    {"set_log_levels", set_log_levels, METH_VARARGS, "set_log_levels(info, warn, error, verbose)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tritonserver",
    "inferpool's host of Triton's backend C API (libtritonserver.so)", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

int host_requests_init(void);

PyMODINIT_FUNC PyInit__tritonserver(void) {
  if (PyType_Ready(&HostInputType) < 0 || PyType_Ready(&HostRequestType) < 0 ||
      host_requests_init() < 0)
    return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&HostInputType);
  PyModule_AddObject(m, "Input", (PyObject*)&HostInputType);
  PyModule_AddIntConstant(m, "API_VERSION_MAJOR", TRITONBACKEND_API_VERSION_MAJOR);
  PyModule_AddIntConstant(m, "API_VERSION_MINOR", TRITONBACKEND_API_VERSION_MINOR);
  return m;
}
