"""The error meant for the user.

Anything raised as :class:`UserError` is shown as one line (CLI: on stderr, exit 2;
GUI: in a message) and nothing is lost. Any other exception is a bug and is logged
with its traceback.
"""


class UserError(Exception):
    """A problem the user can fix: a missing or corrupt file, a locked database, no network."""

    def __str__(self) -> str:  # one line, always
        return " ".join(str(self.args[0] if self.args else "").split())


class ModelLoadError(UserError):
    """A model spec that cannot be loaded (missing, truncated, unsupported)."""


class ContextLengthError(UserError):
    """A prompt longer than the model's context window."""


class StoreError(UserError):
    """A chat or cache database that cannot be opened or written."""
