"""Dataclasses without their cost at every start.

`@dataclass` and `@dataclass(frozen=True)` from here give a class `__init__`,
`__repr__` and `__eq__` (and `__hash__` when frozen) from its annotated fields, as the
standard library's do, and `field()`, `replace()`, `asdict()` and `fields()` work as
theirs, for the options chload uses (default, default_factory, repr, compare). Type
checkers read it as a dataclass (PEP 681, `dataclass_transform`).

Why not `dataclasses`: it writes the source of every method of every class and
compiles it at import, 1-1.4 ms per class on these machines, and imports `inspect`
(with ast, dis and tokenize). chload's two dozen records cost 35-45 ms of each start,
about 3% of a 10M-row load into a server (bench/server_http.py), where the rest of the
start is Python itself. Here every class shares the same few functions: nothing is
compiled, and a class costs microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

_R = TypeVar("_R")
_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    """One field of a record: its name, default, and whether repr and == show it."""

    __slots__ = ("name", "default", "default_factory", "repr", "compare")

    def __init__(self, default: Any = _MISSING,
                 default_factory: Callable[[], Any] | None = None,
                 repr: bool = True, compare: bool = True) -> None:
        self.name = ""
        self.default, self.default_factory = default, default_factory
        self.repr, self.compare = repr, compare


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None,
          repr: bool = True, compare: bool = True) -> Any:
    return Field(default, default_factory, repr, compare)


@dataclass_transform(field_specifiers=(field,))
def dataclass(cls: type[_R] | None = None, /, *, frozen: bool = False) -> Any:
    def make(cls: type[_R]) -> type[_R]:
        return _make(cls, frozen)

    return make if cls is None else make(cls)


def fields(thing: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order."""
    return thing.__record_fields__


def replace(obj: _R, /, **changes: Any) -> _R:
    """A copy of `obj` with `changes`; `__post_init__` runs again."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    return type(obj)(**{**values, **changes})


def asdict(obj: Any) -> dict[str, Any]:
    """Fields as a dict, records inside lists, tuples and dicts too."""
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


def _plain(value: Any) -> Any:
    if hasattr(type(value), "__record_fields__"):
        return asdict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def _make(cls: Any, frozen: bool) -> Any:
    inherited = [f for base in reversed(cls.__mro__[1:])
                 for f in base.__dict__.get("__record_fields__", ())]
    own = []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, _MISSING)
        spec = value if isinstance(value, Field) else Field(value)
        spec.name = name
        if spec.default is not _MISSING:
            setattr(cls, name, spec.default)  # as dataclasses: the default on the class
        elif isinstance(value, Field):
            delattr(cls, name)
        own.append(spec)
    specs = tuple({f.name: f for f in [*inherited, *own]}.values())
    cls.__record_fields__ = specs
    cls.__match_args__ = tuple(f.name for f in specs)  # type: ignore[misc]
    cls.__init__ = _init
    cls.__repr__ = _repr
    cls.__eq__ = _eq
    if frozen:
        cls.__setattr__ = _refuse
        cls.__delattr__ = _refuse
        cls.__hash__ = _hash
    else:
        cls.__hash__ = None  # mutable and compared by value: unhashable, as dataclasses
    return cls


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    specs = type(self).__record_fields__
    name = type(self).__name__
    if len(args) > len(specs):
        raise TypeError(f"{name}() takes {len(specs)} arguments but {len(args)} were given")
    for spec, value in zip(specs, args, strict=False):
        if spec.name in kwargs:
            raise TypeError(f"{name}() got multiple values for argument {spec.name!r}")
        object.__setattr__(self, spec.name, value)
    for spec in specs[len(args):]:
        if spec.name in kwargs:
            value = kwargs.pop(spec.name)
        elif spec.default is not _MISSING:
            value = spec.default
        elif spec.default_factory is not None:
            value = spec.default_factory()
        else:
            raise TypeError(f"{name}() missing required argument: {spec.name!r}")
        object.__setattr__(self, spec.name, value)
    if kwargs:
        raise TypeError(f"{name}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                      for f in type(self).__record_fields__ if f.repr)
    return f"{type(self).__qualname__}({shown})"


def _compared(obj: Any) -> tuple:
    return tuple(getattr(obj, f.name) for f in type(obj).__record_fields__ if f.compare)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _hash(self: Any) -> int:
    return hash(_compared(self))


def _refuse(self: Any, name: str, *value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen "
                              f"{type(self).__name__}")
