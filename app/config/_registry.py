"""The settings registry: typed, documented keys with defaults, choices and checks.

A schema is a nested ``dict`` whose leaves are :class:`Setting` objects. :func:`validate_section`
walks a user mapping against it, fills defaults, and raises :class:`~hisparse.errors.ConfigError`
naming the file, the dotted key and what was expected (with a "did you mean" for unknown keys).
"""
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import ConfigError

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               list: "a list", dict: "a mapping"}


@dataclass(frozen=True)
class Setting:
    """One configuration key.

    Parameters
    ----------
    type : type or tuple of types
        Accepted Python type(s) after YAML parsing. ``float`` also accepts integers.
    default : object
        Value used when the key is absent.
    doc : str
        One-line description, shown in ``docs/config.md`` and in error messages.
    choices : tuple, optional
        Allowed values.
    check : callable, optional
        ``check(value) -> str or None``; a returned string describes why the value is invalid.
    nullable : bool
        Whether ``null`` is accepted.
    """

    type: Any
    default: Any
    doc: str
    choices: Optional[tuple] = None
    check: Optional[Callable[[Any], Optional[str]]] = None
    nullable: bool = False
    #: a file or directory path: ``~`` and ``$VAR`` / ``${VAR}`` are expanded (:func:`expand_path`)
    path: bool = False

    def expected(self):
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        text = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        return text + (" or null" if self.nullable else "")

    def validate(self, value, source, key):
        if value is None:
            if self.nullable:
                return None
            raise ConfigError(source, key, f"expected {self.expected()}, got null")
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        ok = isinstance(value, types)
        # YAML users think of true/false apart from numbers: True is not accepted as an integer.
        if isinstance(value, bool) and bool not in types:
            ok = False
        if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok and float in types and isinstance(value, str):
            # PyYAML reads 1e-12 (no dot) as a string; accept what float() accepts.
            try:
                value, ok = float(value), True
            except ValueError:
                pass
        if not ok:
            raise ConfigError(source, key,
                              f"expected {self.expected()}, got {type(value).__name__} {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and \
                not INT64_MIN <= value <= INT64_MAX:
            # Stored as an HDF5 attribute and handed to NumPy: beyond 64 bits both fail late.
            raise ConfigError(source, key, f"{value} does not fit in a 64-bit integer")
        if self.choices is not None and value not in self.choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in self.choices], n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise ConfigError(source, key, f"expected {self.expected()}, got {value!r}{extra}")
        if self.path and isinstance(value, str):
            try:
                value = expand_path(value)
            except ValueError as exc:
                raise ConfigError(source, key, str(exc)) from None
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(source, key, f"{problem}, got {value!r}")
        return value


#: The range of an integer setting (every one is written to the results file as int64).
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def at_most(limit, why):
    """A :class:`Setting` check: the value must be <= ``limit`` (``why`` says what the limit
    protects, in the message)."""
    def check(value):
        return None if value <= limit else f"must be at most {limit:,} ({why})"
    check.limit = limit
    return check


def all_of(*checks):
    """A :class:`Setting` check passing when every one of ``checks`` does (the first problem)."""
    def check(value):
        for one in checks:
            problem = one(value)
            if problem:
                return problem
        return None
    return check


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(value):
    """``value`` with a leading ``~`` (or ``~user``) and every ``$VAR`` / ``${VAR}`` expanded,
    as a shell would: a config or a quoted argument otherwise made folders named ``~``.

    Raises
    ------
    ValueError
        A variable is not set (naming it), or ``~user`` names no user.
    """
    import os
    missing = [name.strip("{}") for name in _VARIABLE.findall(value)
               if name.strip("{}") not in os.environ]
    if missing:
        raise ValueError(f"{value!r} uses the environment variable {missing[0]}, which is not "
                         f"set")
    expanded = os.path.expanduser(os.path.expandvars(value))
    if expanded.startswith("~"):
        raise ValueError(f"{value!r}: cannot expand {expanded.split('/')[0]!r} (no such user)")
    return expanded


def positive(value):
    """Check for :class:`Setting`: the value must be > 0."""
    return None if value > 0 else "must be positive"


def non_negative(value):
    """Check for :class:`Setting`: the value must be >= 0."""
    return None if value >= 0 else "must be >= 0"


def positive_integers(value):
    """Check for :class:`Setting`: a non-empty list of positive integers (a shape: a tensor's
    dimensions, a grid's extents)."""
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                            for v in value):
        return "must be a non-empty list of positive integers"
    return None


#: The longest file name most file systems take (NAME_MAX), in bytes.
NAME_MAX = 255


def file_name_problem(name):
    """Why ``name`` is not a plain file name (one path component), or ``None``.

    Refused: empty, ``.`` and ``..``, a ``/``, NUL and other control characters, and more than
    :data:`NAME_MAX` bytes in UTF-8.
    """
    if name in ("", ".", ".."):
        return "is not a file name"
    if "/" in name:
        return "contains '/' (a file name cannot name a directory)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > NAME_MAX:
        return f"is {size} bytes long (file names take at most {NAME_MAX})"
    return None


def file_name_part(value):
    """Check for :class:`Setting`: text that becomes part of a file name (see
    :func:`file_name_problem`; an empty value is allowed)."""
    if value == "":
        return None
    problem = file_name_problem(value)
    return f"must be usable in a file name: it {problem}" if problem else None


def validate_section(schema, data, source, prefix=""):
    """Validate ``data`` against ``schema`` and return a new dict with defaults filled in.

    Parameters
    ----------
    schema : dict
        Nested mapping of key -> :class:`Setting` or sub-schema ``dict``.
    data : dict or None
        The user's values for this section.
    source : str
        File name used in error messages.
    prefix : str
        Dotted path of this section (with a trailing dot), used in error messages.

    Returns
    -------
    dict
        Validated values, defaults filled in, in schema order.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, prefix.rstrip(".") or None,
                          f"expected a mapping, got {type(data).__name__} {data!r}")
    for key in data:
        if key not in schema:
            hint = difflib.get_close_matches(str(key), list(schema), n=1)
            extra = f"; did you mean '{prefix}{hint[0]}'?" if hint else \
                f"; known keys here: {', '.join(sorted(schema)) or '(none)'}"
            raise ConfigError(source, f"{prefix}{key}", f"unknown key{extra}")
    out = {}
    for key, spec in schema.items():
        if isinstance(spec, dict):
            out[key] = validate_section(spec, data.get(key), source, f"{prefix}{key}.")
        elif key in data:
            out[key] = spec.validate(data[key], source, f"{prefix}{key}")
        else:
            out[key] = spec.default
    return out


@dataclass
class Config:
    """A validated, resolved run configuration.

    Values are read with dotted keys: ``cfg["run.repeats"]``. ``cfg.source`` names the YAML file.
    """

    data: dict
    source: str = "<config>"
    overrides: list = field(default_factory=list)

    def __getitem__(self, dotted):
        node = self.data
        for part in dotted.split("."):
            node = node[part]
        return node

    def get(self, dotted, default=None):
        try:
            return self[dotted]
        except (KeyError, TypeError):
            return default

    def to_yaml(self):
        """The resolved configuration as YAML text (stored verbatim in every results file)."""
        import yaml
        return yaml.safe_dump(self.data, sort_keys=False)
