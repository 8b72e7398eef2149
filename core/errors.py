"""The error meant for the user.

Anything raised as :class:`UserError` is shown as one line (CLI: on stderr, exit 2;
GUI: in a message) and nothing is lost. Any other exception is a bug and is logged
with its traceback.

Every error that ends a request carries an :class:`ErrorKind`, so each front end (the
HTTP API, the command line, the window) maps the kind to its own answer instead of
reading the message.
"""

from enum import StrEnum


class ErrorKind(StrEnum):
    """What kind of failure ended a request (the value is what the API's ``code`` says).

    Front ends read ``.value`` or compare members; as a StrEnum, ``str()`` and f-strings
    give the value too (a ``(str, Enum)`` gave ``ErrorKind.NAME``, which nothing printed)."""

    CONTEXT_TOO_LONG = "context_length_exceeded"  # the prompt does not fit the model's context
    BAD_REQUEST = "bad_request"  # anything else wrong with what was asked
    OUT_OF_MEMORY = "out_of_memory"  # the machine ran out of memory serving it
    MODEL_NOT_LOADED = "model_not_loaded"  # no model (yet, or it failed to load)
    # the client (an API key) has as many prompts waiting as the server queues for one
    TOO_MANY_WAITING = "too_many_waiting_requests"
    INTERNAL = "internal_error"  # a bug: logged with its traceback


class UserError(Exception):
    """A problem the user can fix: a missing or corrupt file, a locked database, no network."""

    kind = ErrorKind.BAD_REQUEST

    def __str__(self) -> str:  # one line, always
        return " ".join(str(self.args[0] if self.args else "").split())


class ModelLoadError(UserError):
    """A model spec that cannot be loaded (missing, truncated, unsupported)."""

    kind = ErrorKind.MODEL_NOT_LOADED


class ContextLengthError(UserError):
    """A prompt longer than the model's context window."""

    kind = ErrorKind.CONTEXT_TOO_LONG


class TooManyWaitingError(UserError):
    """A client already has as many prompts waiting for prefill as the server queues for one
    (``core.engine.turns``): retry once one of them has started."""

    kind = ErrorKind.TOO_MANY_WAITING


class OutOfMemoryError(UserError):
    """The machine ran out of memory for a request (a smaller prompt or model may fit)."""

    kind = ErrorKind.OUT_OF_MEMORY


class StoreError(UserError):
    """A chat or cache database that cannot be opened or written."""
