"""Kernel tables: which kernels a GPU engine launches from a ``kernels_cu`` file, with their
launch signatures derived from the file's own ``extern "C" __global__`` declarations.

A signature typed by hand beside each ``prepare()`` call drifts silently when a kernel gains an
argument (PyCUDA packs the wrong bytes and the kernel reads garbage). Here the engine names only
the kernels it launches; :class:`KernelTable` parses their parameter lists from the source, maps
every C type through one table (:data:`PARAM_CODES`) with the compile-time macros resolved
(``VALUE_T``, ``INDEX_T`` and the file's typedefs), and prepares each function with that
signature. A CI test checks that every declared kernel's parameters map and that every table's
names are declared.

Kernels that take the same group of arrays may spell it once as an object-like macro
(``#define CHUNK_TABLE_PARAMS const int* __restrict__ chunk_sup, ...``) used in their parameter
lists: the parser expands such macros (from the source and the shared headers) before it reads
the parameters. A macro keeps each array a ``__restrict__`` kernel parameter; a struct of pointers
would not (nvcc then stops using the read-only path for their loads).

Also here: the one dtype -> C-type map (:func:`c_type`, :func:`type_defines`) and grid sizing.
"""
import re
from functools import lru_cache

import numpy as np

from ..errors import HisparseError

#: NumPy dtype -> C type name used in ``-DVALUE_T=...`` / ``-DINDEX_T=...``
C_TYPES = {
    np.dtype(np.float64): "double",
    np.dtype(np.float32): "float",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.uint8): "unsigned char",
}

#: scalar C type (after macro and typedef resolution) -> struct code of PyCUDA's ``prepare``
PARAM_CODES = {
    "double": "d", "float": "f",
    "int": "i", "unsigned int": "I", "unsigned": "I",
    "long long": "q", "long long int": "q", "unsigned long long": "Q",
    "unsigned long long int": "Q", "size_t": "Q",
    "short": "h", "unsigned short": "H", "char": "b", "signed char": "b",
    "unsigned char": "B", "bool": "?",
}

_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict)\b")
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                     r'void\s+(\w+)\s*\(([^)]*)\)', re.S)
_TYPEDEF = re.compile(r"\btypedef\s+([\w\s]+?)\s+(\w+)\s*;")
_USING = re.compile(r"\busing\s+(\w+)\s*=\s*([\w\s]+?)\s*;")
_DEFAULT_DEFINE = re.compile(r"#ifndef\s+(\w+)\s*\n\s*#define\s+\1\s+([^\n]+)")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# Object-like macros (a name not followed by "("), continuation lines already joined.
_OBJECT_MACRO = re.compile(r"^[ \t]*#define[ \t]+(\w+)(?!\()[ \t]+(.+)$", re.M)


def c_type(dtype):
    """C type name of a NumPy dtype (``float64`` -> ``double``)."""
    try:
        return C_TYPES[np.dtype(dtype)]
    except KeyError:
        raise HisparseError(f"no CUDA type for dtype {np.dtype(dtype)}") from None


def type_defines(value_dtype, index_dtype=None, **extra):
    """The ``-D`` macros selecting a kernel file's value and index types (plus ``extra``)."""
    defines = {"VALUE_T": c_type(value_dtype)}
    if index_dtype is not None:
        defines["INDEX_T"] = c_type(index_dtype)
    defines.update(extra)
    return defines


def index_scalar(index_dtype):
    """The NumPy scalar type that a kernel's ``INDEX_T`` argument is packed as."""
    return np.int32 if np.dtype(index_dtype) == np.int32 else np.int64


def grid_1d(threads, block):
    """``(blocks, 1)`` covering ``threads`` threads with ``block`` per block (at least one)."""
    return (max(1, (int(threads) + int(block) - 1) // int(block)), 1)


def _source_text(path):
    from ._compile import kernel_source_dir
    return (kernel_source_dir() / path).read_text()


@lru_cache(maxsize=None)
def _source_and_headers(source_name):
    """The texts of a source and the shared headers it includes, comments dropped and
    continuation lines joined."""
    from ._compile import kernel_source_dir
    texts = [_source_text(f"{source_name}.cu")]
    texts += [header.read_text() for header in sorted(kernel_source_dir().glob("*.cuh"))]
    return tuple(_COMMENT.sub("", text).replace("\\\n", " ") for text in texts)


@lru_cache(maxsize=None)
def _aliases(source_name):
    """Typedefs, ``using`` aliases and ``#ifndef X / #define X default`` macros of a source and
    the shared headers it includes, as ``{name: replacement}``."""
    aliases = {}
    for text in _source_and_headers(source_name):
        for value, name in _TYPEDEF.findall(text):
            aliases[name] = " ".join(value.split())
        for name, value in _USING.findall(text):
            aliases[name] = " ".join(value.split())
        for name, value in _DEFAULT_DEFINE.findall(text):
            aliases.setdefault(name, " ".join(value.split()))
    return aliases


@lru_cache(maxsize=None)
def _object_macros(source_name):
    """``{name: replacement}`` of the object-like macros of a source and the shared headers,
    those a compilation may override excepted."""
    macros, overridable = {}, set()
    for text in _source_and_headers(source_name):
        overridable.update(name for name, _ in _DEFAULT_DEFINE.findall(text))
        for name, body in _OBJECT_MACRO.findall(text):
            macros.setdefault(name, " ".join(body.split()))
    # ``#ifndef X / #define X default`` (VALUE_T, INDEX_T, ...) stay: the compilation's -D
    # macros choose them, and param_code resolves them under those.
    return {name: body for name, body in macros.items() if name not in overridable}


def _expand_macros(text, macros):
    """``text`` with every whole-word use of a macro of ``macros`` replaced (nested ones too)."""
    for _ in range(8):  # nesting is shallow; bounded so a self-reference cannot spin
        expanded = re.sub(r"\b\w+\b", lambda m: macros.get(m.group(0), m.group(0)), text)
        if expanded == text:
            return text
        text = expanded
    return text


@lru_cache(maxsize=None)
def kernel_declarations(source_name):
    """``{kernel name: [parameter declaration, ...]}`` of ``kernels_cu/<source_name>.cu``, the
    macros of its parameter lists expanded."""
    text = _COMMENT.sub("", _source_text(f"{source_name}.cu"))
    macros = _object_macros(source_name)
    declarations = {}
    for name, params in _KERNEL.findall(text):
        params = " ".join(_expand_macros(params, macros).split())
        declarations[name] = [p.strip() for p in params.split(",")] if params.strip() else []
    return declarations


def _resolve(type_name, aliases, defines):
    for _ in range(8):  # alias chains are short; bounded so a cycle cannot spin
        replaced = defines.get(type_name, aliases.get(type_name, type_name))
        if replaced == type_name:
            return type_name
        type_name = " ".join(str(replaced).strip('"').split())
    return type_name


def param_code(declaration, aliases=None, defines=None):
    """PyCUDA struct code of one parameter declaration (``"const INDEX_T* __restrict__ p"``).

    Pointers are ``P``; scalars map through :data:`PARAM_CODES` after ``defines`` (the ``-D``
    macros of this compilation) and ``aliases`` (typedefs, macro defaults) are applied.
    """
    text = _QUALIFIERS.sub(" ", declaration)
    if "*" in text or "[" in text:
        return "P"
    words = text.split()
    if len(words) < 2:
        raise HisparseError(f"cannot parse kernel parameter '{declaration}'")
    type_name = _resolve(" ".join(words[:-1]), aliases or {}, defines or {})
    try:
        return PARAM_CODES[type_name]
    except KeyError:
        raise HisparseError(f"kernel parameter '{declaration}' has type '{type_name}', which has "
                            f"no launch code in hisparse.gpu._kernels.PARAM_CODES") from None


def signature(source_name, kernel, defines=None):
    """The ``prepare()`` signature of ``kernel`` in ``kernels_cu/<source_name>.cu``."""
    declarations = kernel_declarations(source_name)
    if kernel not in declarations:
        raise HisparseError(f"kernel '{kernel}' is not declared extern \"C\" __global__ in "
                            f"kernels_cu/{source_name}.cu")
    aliases = _aliases(source_name)
    defines = {k: str(v) for k, v in (defines or {}).items()}
    return "".join(param_code(p, aliases, defines) for p in declarations[kernel])


class KernelTable:
    """The kernels a GPU engine launches from one source file.

    Parameters
    ----------
    source : str
        ``kernels_cu/<source>.cu``.
    names : sequence of str
        Kernel names; their signatures come from the source (see module docstring).

    Examples
    --------
    >>> TABLE = KernelTable("spmv_csr", ["spmv_csr_vector"])
    >>> kernels = TABLE.load(ctx, type_defines(np.float64, np.int32, THREADS_PER_ROW=4))
    >>> kernels.spmv_csr_vector.prepared_async_call(grid, block, stream, ...)
    """

    def __init__(self, source, names):
        self.source = source
        self.names = tuple(names)

    def signatures(self, defines=None):
        """``{name: prepare signature}`` under ``defines``."""
        return {name: signature(self.source, name, defines) for name in self.names}

    def load(self, ctx, defines=None, extra_options=()):
        """Compile (cached) and load the source with ``defines``; returns :class:`Kernels`."""
        module = ctx.load_kernels(self.source, defines, extra_options=extra_options)
        return Kernels(module, self.signatures(defines))


class Kernels:
    """Prepared PyCUDA functions of one loaded module, by attribute or by ``[name]``."""

    def __init__(self, module, signatures):
        self.module = module
        self._functions = {}
        for name, sig in signatures.items():
            function = module.get_function(name)
            function.prepare(sig)
            self._functions[name] = function

    def __getitem__(self, name):
        return self._functions[name]

    def __getattr__(self, name):
        try:
            return self.__dict__["_functions"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __contains__(self, name):
        return name in self._functions
