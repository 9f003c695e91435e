"""``inferpool new-backend NAME [--lang python|c] [--dir DIR]``: write a working backend from
the template.

The counterpart of copying Triton's "recommended" example backend and renaming it, without
the renaming: one call writes a model repository entry that loads and serves as it is.

    DIR/NAME/config.pbtxt       backend: "NAME", one INT32 input copied to one output
    DIR/NAME/1/                 the version directory (Triton needs at least one)
    DIR/NAME/NAME.py            the backend: every lifecycle hook, commented
    DIR/NAME/test_NAME.py       its tests, through backends.testing.BackendHarness

With ``--lang c`` the backend is C, against Triton's C API (tritonbackend.h, the project's
own declarations of it: ``inferpool --include-dir``):

    DIR/NAME/src/NAME.c         the backend: the eight calls, model and instance state
    DIR/NAME/Makefile           ``make`` builds DIR/NAME/libtriton_NAME.so
    DIR/NAME/test_NAME.py       its tests: make, then BackendHarness

The backend goes in the model directory, not the version directory: the search finds it there
for every version (adding version 2 copies no code), as Triton finds ``<repo>/M/libtriton_B.so``.
"""

from __future__ import annotations

import argparse
import keyword
import string
import sys
from importlib import resources
from pathlib import Path

from inferpool.wire.errors import Code, InferpoolError

# by language: template file -> path written, relative to DIR/NAME
FILES = {
    "python": {
        "config.pbtxt.tmpl": "config.pbtxt",
        "backend.py.tmpl": "{name}.py",
        "test_backend.py.tmpl": "test_{name}.py",
    },
    "c": {
        "config.pbtxt.tmpl": "config.pbtxt",
        "backend.c.tmpl": "src/{name}.c",
        "Makefile.tmpl": "Makefile",
        "test_c_backend.py.tmpl": "test_{name}.py",
    },
}
# what the config's comment names as the backend
BACKEND_FILES = {"python": "{name}.py", "c": "libtriton_{name}.so (make builds it)"}


def check_name(name: str) -> None:
    """INVALID_ARG unless ``name`` can be a backend, a model and a Python module name."""
    from inferpool.backends.loader import (
        BUILTIN,  # here, not at the top: `inferpool --help` stays light
    )

    if not name.isidentifier() or keyword.iskeyword(name):
        raise InferpoolError(
            Code.INVALID_ARG,
            f"backend name '{name}' is not a Python identifier: use letters, digits and "
            "underscores, not starting with a digit (for example 'my_backend')",
        )
    if name in BUILTIN:
        raise InferpoolError(
            Code.INVALID_ARG, f"'{name}' is the name of a built-in backend; choose another name"
        )
    if name in sys.stdlib_module_names:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"'{name}' is a Python standard library module; a backend of that name would "
            "shadow it in its tests; choose another name",
        )


def create_backend(name: str, directory: str | Path = ".", lang: str = "python") -> list[Path]:
    """Write backend ``name`` into model repository ``directory``; returns the paths written.

    ALREADY_EXISTS if ``directory/name`` exists (nothing is overwritten).
    """
    check_name(name)
    repo = Path(directory)
    if repo.exists() and not repo.is_dir():
        raise InferpoolError(Code.INVALID_ARG, f"{repo} is not a directory")
    model_dir = repo / name
    if model_dir.exists():
        raise InferpoolError(
            Code.ALREADY_EXISTS, f"{model_dir} already exists; choose another name or remove it"
        )
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    fields = {
        "name": name,
        "prefix": "".join(p[:1].upper() + p[1:] for p in name.split("_")),
        "backend_file": BACKEND_FILES[lang].format(name=name),
    }
    templates = resources.files("inferpool.backends.template_files")
    written = [version_dir]
    for template, target in FILES[lang].items():
        text = string.Template(templates.joinpath(template).read_text()).substitute(fields)
        path = model_dir / target.format(name=name)
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """NAME and --dir: shared by ``inferpool new-backend`` and ``python -m backends.template``."""
    parser.add_argument("name", metavar="NAME", help="backend and model name (an identifier)")
    parser.add_argument(
        "--dir", default=".", metavar="DIR", help="model repository to write into (default: .)"
    )
    parser.add_argument(
        "--lang",
        choices=sorted(FILES),
        default="python",
        help="the backend's language (default: python); c: Triton's C API, built with make",
    )


def run(args: argparse.Namespace, prog: str) -> int:
    """Write the backend and say how to test and serve it; 1 (with the reason) if refused."""
    try:
        written = create_backend(args.name, args.dir, args.lang)
    except InferpoolError as err:
        print(f"{prog}: error: {err.message}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}{'/' if path.is_dir() else ''}")
    model_dir = written[0].parent
    print()
    if args.lang == "c":
        print(f"build it:  make -C {model_dir}")
    print(f"test it:   python -m pytest {model_dir}")
    print(f"serve it:  inferpool serve --model-repository {args.dir}")
    print(f"call it:   inferpool infer {args.name} --input IN0=1,2,3,4")
    return 0


DESCRIPTION = "Write a working backend NAME from the template into model repository DIR."


def main(argv: list[str] | None = None, prog: str = "inferpool new-backend") -> int:
    """``python -m inferpool.backends.template``: write a backend from the template."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), prog)


if __name__ == "__main__":
    sys.exit(main())
