"""``@message``: a dataclass with ``message_id``, ``priority`` and ``correlation_id``; its
serialization to bytes and the registry of message types by name."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import uuid
from typing import Any, Dict, Optional, Type, TypeVar, overload

import numpy as np

import resident._resident as _resident
from .errors import MessageDeserializationError, MessageSerializationError

__all__ = [
    "message",
    "Message",
    "RingKernelMessage",
    "get_message_type",
    "deserialize_message",
]

T = TypeVar("T")


class Message:
    """Fields every message has. ``priority`` is 0-255, higher drains first (FIFO within a
    lane); ``message_id`` is unique; a reply sets ``correlation_id`` to its request's
    ``message_id`` (``request.reply(...)`` does).

    A base class for messages, as a dataclass or not::

        @dataclasses.dataclass
        class Request(Message):
            x: float = 0.0

    A subclass gets the three fields after its own (keyword-settable, with defaults: a fresh
    ``message_id``, ``priority`` 128, ``correlation_id`` None), checked when a dataclass
    instance is made; a plain subclass gets them from ``Message.__init__`` (call
    ``super().__init__()``)."""

    message_id: Any
    priority: int
    correlation_id: Optional[Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register(cls)
        known = set()
        for base in cls.__mro__[1:]:
            known.update(getattr(base, "__dataclass_fields__", {}))
        ann = dict(cls.__dict__.get("__annotations__", {}))
        for name, typ, default in (
            ("message_id", Any, None),
            ("priority", int, 128),
            ("correlation_id", Optional[Any], None),
        ):
            if name in known or name in ann:
                continue
            ann[name] = typ
            if name not in cls.__dict__:
                setattr(cls, name, default)
        cls.__annotations__ = ann

    def __init__(
        self, *, message_id: Any = None, priority: int = 128, correlation_id: Any = None
    ) -> None:
        self.message_id = message_id
        self.priority = priority
        self.correlation_id = correlation_id
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.message_id is None:
            self.message_id = new_id()
        _check(self)

    def reply(self, response_class: Optional[type] = None, **fields: Any) -> Any:
        cls = response_class or type(self)
        return cls(correlation_id=self.message_id, **fields)

    def with_correlation(self, correlation_id: Any) -> Any:
        """A copy of this message (the same ``message_id`` and fields) whose
        ``correlation_id`` is ``correlation_id``."""
        if dataclasses.is_dataclass(self):
            return dataclasses.replace(self, correlation_id=correlation_id)  # type: ignore[type-var]
        c = copy.copy(self)
        c.correlation_id = correlation_id
        return c

    def serialize(self) -> bytes:
        """The message as bytes (``deserialize`` and ``deserialize_message`` read them back):
        its type's name and every field its constructor takes (a dataclass's ``init``
        fields; a plain subclass's attributes). A field value may be None, a bool, int, float, str,
        bytes, UUID, a list, tuple or dict of those, a numpy array or scalar (not of Python
        objects) or another message; anything else raises ``MessageSerializationError``
        naming the field. The bytes are self-describing data, never code: reading them runs
        nothing but the message class's own constructor."""
        return _MAGIC + json.dumps(_encode_message(self, type(self).__name__)).encode()

    @classmethod
    def deserialize(cls, data: bytes) -> Any:
        """The message ``serialize`` wrote, as an instance of this class (or of a registered
        subclass the bytes name; ``Message.deserialize`` takes any registered type, as
        ``deserialize_message`` does). Bytes that are not a serialized message, a message of
        another type, or fields this class does not have raise
        ``MessageDeserializationError``."""
        msg = _decode_bytes(data, cls.__name__)
        if cls is not Message and not isinstance(msg, cls):
            raise MessageDeserializationError(
                f"the bytes hold a {type(msg).__name__}, not a {cls.__name__}"
            )
        return msg


RingKernelMessage = Message
"""PyDotCompute's name of the message base class."""

# Message classes by ``__name__`` (the last one defined under a name wins), for
# ``get_message_type`` and ``deserialize_message``.
_registry: Dict[str, type] = {}


def _register(cls: type) -> None:
    _registry[cls.__name__] = cls


def get_message_type(name: str) -> Optional[type]:
    """The message class registered under ``name`` (every ``@message`` class and every
    subclass of ``Message``), or None."""
    return _registry.get(name)


def deserialize_message(data: bytes) -> Any:
    """The message ``serialize`` wrote, as an instance of the registered class its bytes
    name; ``MessageDeserializationError`` for bytes that are not a serialized message or
    that name no registered class."""
    return _decode_bytes(data, None)


# Serialized form: these 4 bytes, then JSON in which every object is one tag: ``{"$m":
# [type, [[field, value], ...]]}`` a message, ``{"$u": hex}`` a UUID, ``{"$b": base64}``
# bytes, ``{"$t": [...]}`` a tuple, ``{"$d": [[key, value], ...]}`` a dict, ``{"$a": [dtype,
# shape, base64]}`` a numpy array, ``{"$s": [dtype, base64]}`` a numpy scalar. Lists, str,
# int, float, bool and None are themselves.
_MAGIC = b"RKM\x01"


def _fields_of(msg: Any) -> Dict[str, Any]:
    if dataclasses.is_dataclass(msg):
        return {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg) if f.init}
    return dict(vars(msg))


def _encode_message(msg: Any, where: str) -> Any:
    name = type(msg).__name__
    return {"$m": [name, [[k, _encode(v, f"{where}.{k}")] for k, v in _fields_of(msg).items()]]}


def _dtype_str(dt: np.dtype, where: str) -> Any:
    if dt.hasobject:
        raise MessageSerializationError(
            f"{where}: a numpy array of Python objects cannot be serialized", None, where
        )
    if dt.fields is None:
        return dt.str
    return [[n, _dtype_str(dt.fields[n][0], where), dt.fields[n][1]] for n in dt.names]


def _encode(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, np.generic):
        return v
    if isinstance(v, uuid.UUID):
        return {"$u": v.hex}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, list):
        return [_encode(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, tuple):
        return {"$t": [_encode(x, f"{where}[{i}]") for i, x in enumerate(v)]}
    if isinstance(v, dict):
        return {"$d": [[_encode(k, where), _encode(x, f"{where}[{k!r}]")] for k, x in v.items()]}
    if isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        return {"$a": [_dtype_str(a.dtype, where), list(a.shape), base64.b64encode(a.tobytes()).decode()]}
    if isinstance(v, np.generic):
        a = np.asarray(v)
        return {"$s": [_dtype_str(a.dtype, where), base64.b64encode(a.tobytes()).decode()]}
    if _registry.get(type(v).__name__) is type(v):
        return _encode_message(v, where)
    raise MessageSerializationError(
        f"{where}: a {type(v).__name__} cannot be serialized (None, bool, int, float, str, "
        f"bytes, UUID, list, tuple, dict, numpy arrays and scalars and messages can)",
        None,
        where,
    )


def _dtype(d: Any) -> np.dtype:
    if isinstance(d, str):
        return np.dtype(d)
    return np.dtype({"names": [f[0] for f in d], "formats": [_dtype(f[1]) for f in d],
                     "offsets": [f[2] for f in d]})


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) != 1:
        raise ValueError(f"not a tagged value: {sorted(v)!r}")
    (tag, x), = v.items()
    if tag == "$u":
        return uuid.UUID(hex=x)
    if tag == "$b":
        return base64.b64decode(x, validate=True)
    if tag == "$t":
        return tuple(_decode(e) for e in x)
    if tag == "$d":
        return {_decode(k): _decode(e) for k, e in x}
    if tag == "$a":
        dt, shape, data = x
        return np.frombuffer(base64.b64decode(data, validate=True), _dtype(dt)).reshape(shape).copy()
    if tag == "$s":
        dt, data = x
        return np.frombuffer(base64.b64decode(data, validate=True), _dtype(dt))[0]
    if tag == "$m":
        name, fields = x
        cls = _registry.get(name)
        if cls is None:
            raise LookupError(f"no message type '{name}' is registered")
        kw = {k: _decode(e) for k, e in fields}
        if dataclasses.is_dataclass(cls):
            return cls(**kw)
        obj = cls.__new__(cls)
        obj.__dict__.update(kw)
        return obj
    raise ValueError(f"unknown tag {tag!r}")


def _decode_bytes(data: Any, expect: Optional[str]) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MessageDeserializationError(
            f"deserialize takes the bytes serialize returned, got {type(data).__name__}"
        )
    data = bytes(data)
    if not data.startswith(_MAGIC):
        raise MessageDeserializationError("these bytes are not a serialized message")
    try:
        tree = json.loads(data[len(_MAGIC):].decode())
        if not (isinstance(tree, dict) and list(tree) == ["$m"]):
            raise ValueError("no message at the top")
        return _decode(tree)
    except MessageDeserializationError:
        raise
    except Exception as e:  # a damaged or foreign payload, a field the class refuses
        what = expect or "message"
        raise MessageDeserializationError(f"cannot deserialize the {what}: {e}") from e


# Fresh ids are version-4 UUIDs like ``uuid.uuid4()``'s (122 random bits), made in the
# extension (``resident._resident.new_id``: one call, no Python frame) from a generator seeded
# from ``os.urandom`` (again in a forked child) instead of one system call each: a message id
# must be unique, not secret, and ``uuid4()`` costs several times a message's other work.
_resident.seed_ids(os.urandom(32))


def _reseed() -> None:
    _resident.seed_ids(os.urandom(32))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)

new_id = _resident.new_id
"""new_id() -> uuid.UUID: a fresh message id, a random (version 4) UUID as ``uuid.uuid4()``
makes."""


def _check(self: Any) -> None:
    p = self.priority
    if not isinstance(p, int) or not 0 <= p <= 255:
        raise ValueError(f"priority must be an int in 0-255, got {p!r}")


@overload
def message(cls: Type[T]) -> Type[T]: ...
@overload
def message(cls: None = None, **dataclass_kwargs: Any) -> Any: ...


def message(cls: Optional[type] = None, **dataclass_kwargs: Any) -> Any:
    """Turns a class into a dataclass message with ``message_id`` (a fresh random UUID, see ``new_id``),
    ``priority`` (default 128) and ``correlation_id`` (default None), keyword-settable.

    >>> @message
    ... class Request:
    ...     value: float
    >>> Request(value=1.0, priority=255).priority
    255
    """

    def wrap(c: type) -> type:
        # The three fields go last, with defaults, so the class's own fields (with or without
        # defaults) keep their positions.
        ann = dict(c.__dict__.get("__annotations__", {}))
        ann.setdefault("message_id", Any)
        ann.setdefault("priority", int)
        ann.setdefault("correlation_id", Optional[Any])
        c.__annotations__ = ann
        if "message_id" not in c.__dict__:
            c.message_id = dataclasses.field(default_factory=new_id)  # type: ignore[attr-defined]
        if "priority" not in c.__dict__:
            c.priority = 128  # type: ignore[attr-defined]
        if "correlation_id" not in c.__dict__:
            c.correlation_id = None  # type: ignore[attr-defined]
        user_post = c.__dict__.get("__post_init__")

        def __post_init__(self: Any, *a: Any) -> None:
            if self.message_id is None:  # a ``Message`` subclass's default
                self.message_id = new_id()
            p = self.priority
            if p.__class__ is not int or not 0 <= p <= 255:  # the usual case costs no call
                _check(self)
            if user_post is not None:
                user_post(self, *a)

        c.__post_init__ = __post_init__  # type: ignore[attr-defined]
        for name in ("reply", "with_correlation", "serialize", "deserialize"):
            if not hasattr(c, name):
                setattr(c, name, Message.__dict__[name])
        out = dataclasses.dataclass(c, **dataclass_kwargs)
        _register(out)
        return out

    if cls is not None:
        return wrap(cls)
    return wrap

