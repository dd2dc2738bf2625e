"""Grid and ``sweepconf.py`` files as Python source: read in the encoding they declare, run as
modules, every mistake a ``file:line`` error. Collection and the plugin loader both run
files through here."""

from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tokenize
import traceback
from pathlib import Path

from sweepkit.errors import UsageError, display_path
from sweepkit.grid.declare import GridError, GridErrors

# The per-directory plugin file (pytest's conftest.py): loaded before its directory's grids.
SWEEPCONF = "sweepconf.py"


def grid_usage_error(exc: GridError | GridErrors, rootdir: Path, extra: list[str] = ()) -> UsageError:
    """Each mistake as ``file:line: message`` (``file: message`` where no line applies),
    then the ``extra`` lines."""
    lines = []
    for error in exc.errors if isinstance(exc, GridErrors) else (exc,):
        file, line = display_path(error.location[0], rootdir), error.location[1]
        lines.append(f"{file}:{line}: {error.message}" if line else f"{file}: {error.message}")
    return UsageError(*lines, *extra)


def read_source(path: Path, display: str) -> str:
    """The text of a grid or sweepconf file, in the encoding it declares (UTF-8 by default);
    a file that is no Python source (a NUL byte, bytes of no text) is refused at its line."""
    data = path.read_bytes()
    if b"\0" in data:
        line = data[:data.index(b"\0")].count(b"\n") + 1
        raise UsageError(f"{display}:{line}: not a Python source file: it holds a NUL byte")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:  # bytes of no UTF-8 in its first two lines, or an unknown coding
        encoding = "utf-8"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UsageError(f"{display}:{line}: not a Python source file: byte {data[exc.start]:#04x} is not "
                         f"{encoding} text") from None


def exec_python_file(path: Path, rootdir: Path, module_name: str):
    """Execute a grid or sweepconf file as a module; mistakes become file:line errors."""
    display = display_path(path, rootdir)
    source = read_source(path, display)
    try:
        tree = ast.parse(source, filename=str(path))
        code = compile(tree, str(path), "exec")
    except SyntaxError as exc:
        pointer = ""
        if exc.text:
            pointer = "\n    " + exc.text.rstrip("\n") + "\n    " + " " * max((exc.offset or 1) - 1, 0) + "^"
        where = f"{display}:{exc.lineno}" if exc.lineno else display
        raise UsageError(f"{where}: syntax error: {exc.msg}{pointer}") from None
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__["__sweep_assignments__"] = _assignment_lines(tree)
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except GridError as exc:
        raise grid_usage_error(exc, rootdir) from None
    except Exception as exc:
        raise UsageError(f"{display}:{_line_in(path, exc)}: {type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit(), exit(), quit(): collecting the other files goes on
        stop = f"SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else repr(exc)
        kind = "a sweepconf.py must run to its end to be loaded" if path.name == SWEEPCONF \
            else "a grid file must run to its end to be collected"
        raise UsageError(f"{display}:{_line_in(path, exc)}: {stop} stopped the file before its end; {kind}") from None
    return module


def _line_in(path: Path, exc: BaseException) -> int:
    """The line of ``path`` where ``exc`` was raised (its innermost frame in that file)."""
    return next((f.lineno for f in reversed(traceback.extract_tb(exc.__traceback__))
                 if Path(f.filename) == path), 0)


def _assignment_lines(tree: ast.Module) -> dict[str, int]:
    lines = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    lines[target.id] = node.lineno
    return lines
