"""The one compiled part: inferpool's host of Triton's backend C API (libtritonserver.so).

Everything else is in pyproject.toml.  The extension is optional: where no C compiler
exists, the install still succeeds and a C backend fails to load with a line saying what
to install (backends/cabi/library.py).
"""

from setuptools import Extension, setup

HOST = "backends/cabi/host/"

setup(
    ext_modules=[
        Extension(
            "inferpool.backends.cabi._tritonserver",
            sources=[
                HOST + name
                for name in (
                    "module.c",
                    "server.c",
                    "metrics.c",
                    "levels.c",
                    "statistics.c",
                    "inputs.c",
                    "requests.c",
                    "responses.c",
                    "state.c",
                    "deferred.c",
                    "inference_requests.c",
                    "inference_responses.c",
                    "calls.c",
                    "server_queries.c",
                    "unsupported.c",
                )
            ],
            depends=[HOST + "host.h"],
            include_dirs=["backends/cabi/include"],
            # a backend names the library it imports from: libtritonserver.so
            extra_link_args=["-Wl,-soname,libtritonserver.so"],
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden"],
            optional=True,
        )
    ]
)
