"""Loading user code named `module.fn`: reward functions, dataset transforms, rollout functions.

The module is imported with the working directory first on sys.path (as Axolotl does), so
`rewards.my_reward` is `my_reward` in ./rewards.py (or in the package ./rewards/). A failure raises
UserCodeError, whose message already says what is wrong and the fix; callers turn it into their own
error type and put their config key or dataset in front of it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

REASONS = ("no_module", "import_failed", "no_function", "not_callable")


class UserCodeError(Exception):
    """`module.fn` cannot be loaded; the message says what is wrong and the fix.

    `reason` is one of REASONS:
    * "no_module": no such module (or the name is not `module.fn` at all);
    * "import_failed": the module exists but importing it raised (a missing dependency, a SyntaxError...);
    * "no_function": the module has no such attribute;
    * "not_callable": the attribute is not a function.
    `module_name`, `attr` and `module_file` are what was known when it failed (None when not)."""

    def __init__(self, message: str, reason: str, module_name: str | None = None, attr: str | None = None,
                 module_file: str | None = None):
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason
        self.module_name = module_name
        self.attr = attr
        self.module_file = module_file


def import_user_module(module_name: str) -> ModuleType:
    """Import `module_name` with the working directory first on sys.path; raises UserCodeError."""
    return _import(module_name, "")


def load_user_function(dotted: str) -> tuple[Callable[..., Any], str | None]:
    """`module.fn` -> (the function, the module's file or None); raises UserCodeError.

    A name that is not `module.fn` (no dot, or an empty part) is reason "no_module"."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise UserCodeError(f"{dotted!r} is not `module.fn`: name a function in a .py file of {Path.cwd()} as "
                            "`file_name.function_name`, e.g. `rewards.my_reward` for my_reward in rewards.py",
                            "no_module", module_name or None, attr or None)
    module = _import(module_name, f"{dotted!r}: ")
    module_file = getattr(module, "__file__", None)
    if not hasattr(module, attr):
        raise UserCodeError(_missing_attribute_message(module, module_name, attr, dotted, module_file),
                            "no_function", module_name, attr, module_file)
    fn = getattr(module, attr)
    if not callable(fn):
        raise UserCodeError(f"{dotted!r}: {module_name}.{attr} in {module_file} is a {type(fn).__name__}, not a function",
                            "not_callable", module_name, attr, module_file)
    return fn, module_file


def _import(module_name: str, subject: str) -> ModuleType:
    """Import with the working directory first on sys.path; `subject` starts every message."""
    if not module_name:
        raise UserCodeError(f"{subject}no module name given: write `file_name.function_name`", "no_module")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a file written after the last import of this directory
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            top = module_name.split(".")[0]
            raise UserCodeError(
                f"{subject}no module {module_name!r}: looked for {top}.py (or a {top}/ package) in the working directory "
                f"{cwd} and on sys.path. Run rlft from the folder that holds {top}.py or fix the name "
                "(`file_name.function_name`)",
                "no_module", module_name,
            ) from exc
        module_file = _module_file(module_name)
        raise UserCodeError(
            f"{subject}module {module_name} ({module_file}) failed to import: ModuleNotFoundError: {exc}. "
            f"Install the missing package `{missing}` in this environment",
            "import_failed", module_name, module_file=module_file,
        ) from exc
    except Exception as exc:  # SyntaxError, ImportError, anything the module raises at import time
        module_file = _module_file(module_name)
        raise UserCodeError(
            f"{subject}module {module_name} ({module_file}) failed to import: {type(exc).__name__}: {exc}. "
            f"Fix the module; `python -c 'import {module_name}'` in {cwd} shows the error",
            "import_failed", module_name, module_file=module_file,
        ) from exc


def module_origin(module_name: str) -> str | None:
    """The file `module_name` would be imported from (the working directory first, as `_import` does) without running
    it, or None when there is none (no such module, a built-in one, or a broken parent package)."""
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(module_name)
    except Exception:  # noqa: BLE001 - no such module, or a parent package that fails to import
        spec = None
    finally:
        if added:
            sys.path.remove(cwd)
    return spec.origin if spec is not None and spec.origin else None


def _module_file(module_name: str) -> str:
    return module_origin(module_name) or f"{module_name}.py"


def _missing_attribute_message(module, module_name: str, attr: str, name: str, module_file: str | None) -> str:
    functions = sorted(n for n, value in vars(module).items() if callable(value) and not n.startswith("_")
                       and getattr(value, "__module__", None) == module.__name__)
    close = difflib.get_close_matches(attr, functions, n=1)
    hint = f" Did you mean {module_name}.{close[0]}?" if close else ""
    listed = f" It defines: {', '.join(functions)}." if functions else " It defines no functions."
    if attr == "py":
        hint = " Write `file_name.function_name`, not the file name."
    return f"{name!r}: module {module_name} ({module_file}) has no function {attr!r}.{hint}{listed}"
