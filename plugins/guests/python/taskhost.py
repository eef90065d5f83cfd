"""Helpers for taskhost task plugins written in Python (componentize-py).

Copy this file next to your plugin's module and build with componentize-py
against the `task-plugin` world of `wit/task-plugin.wit`; see
plugins/guests/docs/python.md. It only wraps the bindings that componentize-py
generates (`wit_world`), so everything it does can also be done by hand.

    import taskhost

    class WitWorld:
        def describe(self):
            return taskhost.info("greet", "0.1.0", description="Greets someone")

        @taskhost.task
        def run(self, input: bytes) -> bytes:
            name = input.decode().strip()
            if not name:
                raise taskhost.Fatal("give me a name with --input NAME")
            taskhost.log.info(f"greeting {name}")
            return f"hello, {name}!\\n"

What the helper hides:

* `run` must return `bytes` or raise `componentize_py_types.Err(TaskError_*)`;
  `@taskhost.task` accepts `bytes`, `bytearray`, `memoryview`, `str` (sent as
  UTF-8) or `None` (no output), and turns `Fail`, `Fatal` and `Canceled`
  (also spelled `Cancelled`) into the right `task-error` case.
* Any other exception escaping `run` becomes a retryable `fail` whose reason
  is `uncaught ExceptionType: message`, and the traceback goes to the task's
  stderr. Without the decorator the same exception traps the instance, which
  the host also reports as a retryable failure, with a less useful reason.
* The WIT spells the error case `canceled` and the sleep status and the host
  function `cancelled`; here `Canceled`, `Cancelled`, `cancelled()` and
  `is_cancelled()` all work.
* Module-level code runs once, at build time (componentize-py snapshots the
  initialised interpreter): call host functions only inside `describe` and
  `run`.
"""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Callable, Dict, Iterable, Optional, Union

from componentize_py_types import Err
from wit_world.imports import host

try:
    from wit_world.imports import types
except ImportError:
    # In a world that also imports wasi:http, whose `types` interface
    # shares the name, componentize-py names ours by its package.
    from wit_world.imports import taskhost_plugin_types as types

__all__ = [
    "Canceled",
    "Cancelled",
    "Fail",
    "Fatal",
    "TaskError",
    "attempt",
    "cancelled",
    "check_cancelled",
    "env",
    "info",
    "is_cancelled",
    "log",
    "network",
    "param",
    "param_int",
    "params",
    "progress",
    "read_dir",
    "sleep",
    "task",
    "write_dir",
]


# --- errors -----------------------------------------------------------------


class TaskError(Exception):
    """Base of the exceptions that `@task` turns into a `task-error`."""

    def to_wit(self) -> types.TaskError:
        raise NotImplementedError


class Fail(TaskError):
    """A failure that may go away on retry: the `fail` case.

    Retried under `--restart on-failure` and `--restart always`.
    """

    def __init__(self, reason: str, exit_code: Optional[int] = None):
        super().__init__(reason)
        self.reason = str(reason)
        self.exit_code = exit_code

    def to_wit(self) -> types.TaskError:
        return types.TaskError_Fail(types.Failure(self.reason, self.exit_code))


class Fatal(TaskError):
    """A failure that retrying cannot fix: the `fatal` case. Never retried."""

    def __init__(self, reason: str, exit_code: Optional[int] = None):
        super().__init__(reason)
        self.reason = str(reason)
        self.exit_code = exit_code

    def to_wit(self) -> types.TaskError:
        return types.TaskError_Fatal(types.Failure(self.reason, self.exit_code))


class Canceled(TaskError):
    """The task stopped because the host asked it to: the `canceled` case."""

    def __init__(self, reason: str = "canceled"):
        super().__init__(reason)

    def to_wit(self) -> types.TaskError:
        return types.TaskError_Canceled()


# The WIT spells the error case with one "l" and the sleep status with two.
Cancelled = Canceled


def _output(value) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(
        f"run must return bytes, str or None, not {type(value).__name__}"
    )


def task(fn: Callable) -> Callable:
    """Decorates `run` (a method of `WitWorld`, or a plain function).

    Converts the return value to bytes and exceptions to `task-error`s.
    """

    @functools.wraps(fn)
    def run(*args):
        try:
            return _output(fn(*args))
        except TaskError as e:
            raise Err(e.to_wit()) from None
        except Err:
            raise  # already a task-error built by hand
        except Exception as e:  # noqa: BLE001 - anything else is a retryable failure
            traceback.print_exc(file=sys.stderr)
            reason = f"uncaught {type(e).__name__}: {e}" if str(e) else f"uncaught {type(e).__name__}"
            raise Err(types.TaskError_Fail(types.Failure(reason, None))) from None

    return run


# --- describe ---------------------------------------------------------------

_POLICIES = {
    "queue": types.Policy.QUEUE,
    "replace": types.Policy.REPLACE,
    "drop-if-running": types.Policy.DROP_IF_RUNNING,
    "drop_if_running": types.Policy.DROP_IF_RUNNING,
}


def read_dir(guest_path: str) -> types.Capability:
    """Needs read access to the directory granted at `guest_path`."""
    return types.Capability_ReadDir(guest_path)


def write_dir(guest_path: str) -> types.Capability:
    """Needs read and write access to the directory granted at `guest_path`."""
    return types.Capability_WriteDir(guest_path)


def env(name: str) -> types.Capability:
    """Needs the environment variable `name` (granted with `--env NAME=VALUE`)."""
    return types.Capability_Env(name)


def network() -> types.Capability:
    """Needs the network. This host never grants it."""
    return types.Capability_Network()


def info(
    name: str,
    version: str = "0.1.0",
    *,
    description: str = "",
    resource: Optional[str] = None,
    policy: Union[str, types.Policy] = "queue",
    capabilities: Iterable[types.Capability] = (),
) -> types.PluginInfo:
    """Builds the `plugin-info` record that `describe` returns.

    `policy` is "queue", "replace" or "drop-if-running" (or a `types.Policy`).
    """
    if isinstance(policy, str):
        try:
            policy = _POLICIES[policy]
        except KeyError:
            raise ValueError(
                f"unknown policy {policy!r}: use queue, replace or drop-if-running"
            ) from None
    return types.PluginInfo(
        name=name,
        version=version,
        description=description,
        resource=resource,
        default_policy=policy,
        capabilities=list(capabilities),
    )


# --- host calls -------------------------------------------------------------


def attempt() -> types.AttemptInfo:
    """Facts of this attempt: `task_id`, `name`, `slot`, `attempt` (1, 2, ...), `params`."""
    return host.attempt()


def params() -> Dict[str, str]:
    """The submission's `--param K=V` pairs as a dict (the last value of a key wins)."""
    return dict(host.attempt().params)


def param(name: str, default: Optional[str] = None) -> Optional[str]:
    """One param, or `default` when it was not given."""
    return params().get(name, default)


def param_int(name: str, default: int) -> int:
    """One integer param, or `default`. A value that is not an integer raises `Fatal`."""
    value = param(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise Fatal(f"param {name} must be an integer, got {value!r}", 2) from None


def is_cancelled() -> bool:
    """True once the host has asked this attempt to stop."""
    return host.is_cancelled()


cancelled = is_cancelled


def check_cancelled() -> None:
    """Raises `Canceled` if the host has asked this attempt to stop."""
    if host.is_cancelled():
        raise Canceled()


def sleep(ms: Union[int, float]) -> bool:
    """Sleeps `ms` milliseconds on the host, waking early on cancellation.

    Returns True when the whole duration elapsed and False when cancellation
    cut it short: `if not taskhost.sleep(50): raise taskhost.Canceled()`.
    Use this rather than `time.sleep`, which does not wake on cancel.
    """
    return host.sleep(max(0, int(ms))) == types.SleepStatus.ELAPSED


def progress(done: int, total: int = 0) -> None:
    """Reports `done` units out of `total` (0 if unknown)."""
    host.progress(max(0, int(done)), max(0, int(total)))


_LEVELS = {
    "trace": types.Level.TRACE,
    "debug": types.Level.DEBUG,
    "info": types.Level.INFO,
    "warn": types.Level.WARN,
    "warning": types.Level.WARN,
    "error": types.Level.ERROR,
}


class _Log:
    """`log.info("...")` and friends: structured lines in the task's log."""

    def __call__(self, level: Union[str, types.Level], message: str) -> None:
        if isinstance(level, str):
            level = _LEVELS[level]
        host.log(level, str(message))

    def trace(self, message: str) -> None:
        host.log(types.Level.TRACE, str(message))

    def debug(self, message: str) -> None:
        host.log(types.Level.DEBUG, str(message))

    def info(self, message: str) -> None:
        host.log(types.Level.INFO, str(message))

    def warn(self, message: str) -> None:
        host.log(types.Level.WARN, str(message))

    warning = warn

    def error(self, message: str) -> None:
        host.log(types.Level.ERROR, str(message))


log = _Log()
