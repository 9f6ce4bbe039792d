"""Exceptions that end a run with one clear line.

Every error a user can cause (a bad config, a broken input file, an impossible run layout) is a
:class:`HisparseError`. The CLI prints ``hisparse: error: <message>`` for it and exits with status 2;
anything else is a bug and is reported with its type and the rank it happened on.
"""

__all__ = ["HisparseError", "ConfigError", "InputError", "LayoutError", "VerificationError"]


class HisparseError(Exception):
    """Base class of every user-facing error; its message is the one line the user sees."""

    #: True when every rank raises the same error at the same point, so rank 0 alone reports it
    #: and the ranks exit together; otherwise the failing rank aborts the whole job.
    collective = False


class ConfigError(HisparseError):
    """A run configuration is malformed: names the file and the key at fault."""

    def __init__(self, source, key, problem):
        self.source, self.key, self.problem = source, key, problem
        where = f"{source}: " if source else ""
        keypart = f"key '{key}': " if key else ""
        super().__init__(f"{where}{keypart}{problem}")


class InputError(HisparseError):
    """An input file (HDF5, Matrix Market, ...) is missing, malformed or holds invalid values."""


class LayoutError(HisparseError):
    """The requested parallel layout cannot work (e.g. more ranks than rows)."""


class VerificationError(HisparseError):
    """A result disagrees with the reference beyond the configured tolerance (raised on every
    rank once rank 0 has written the results file)."""

    collective = True
