"""Exceptions that cross the handler boundary: what a handler raises, what loading one raises."""

from __future__ import annotations


class Permanent(Exception):
    """Raise from a handler to dead-letter the job at once: retrying cannot help.

    Its message becomes the job's ``last_error`` and its ``error_kind`` is ``permanent``.
    Anything else a handler raises is retried while deliveries remain.
    """


class SoftTimeout(BaseException):
    """Raised inside a handler whose job ran past ``timeout`` in a pool with a
    ``soft_timeout``: the handler may clean up (``finally`` blocks run), and the worker is
    killed ``soft_timeout`` seconds later whatever it does. The job fails as ``timeout``.

    A ``BaseException``, so ``except Exception`` in handler code does not swallow it. Like any
    Python signal handler it runs between bytecodes: a handler stuck in a C call does not see
    it until that call returns, and is then killed.
    """


class HandlerImportError(Exception):
    """A ``"module:function"`` handler spec could not be turned into a callable.

    ``str()`` is one line naming the kind (when known), the spec and the cause, for example
    ``handler 'render' ('app.pdf:render'): module 'app.pdf' not found``.
    """

    def __init__(self, spec: str, cause: str, kind: str | None = None) -> None:
        self.spec = spec
        self.cause = cause
        self.kind = kind
        super().__init__(spec, cause, kind)

    def with_kind(self, kind: str) -> HandlerImportError:
        """The same error, naming the kind it was configured for."""
        return HandlerImportError(self.spec, self.cause, kind)

    def __str__(self) -> str:
        name = f"handler {self.kind!r} ({self.spec!r})" if self.kind else f"handler {self.spec!r}"
        return f"{name}: {self.cause}"


def one_line(exc: BaseException, limit: int = 4000) -> str:
    """``ExcType: message`` on one line, valid UTF-8, at most ``limit`` characters. An
    exception whose ``str()`` itself raises is named by its type alone."""
    try:
        text = " ".join(str(exc).split())
    except Exception:  # a handler's own exception class may break in __str__
        text = ""
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line.encode("utf-8", "replace").decode("utf-8")[:limit]
