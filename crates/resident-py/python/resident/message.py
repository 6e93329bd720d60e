"""``@message``: a dataclass with ``message_id``, ``priority`` and ``correlation_id``."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Type, TypeVar, overload

import resident._resident as _resident

__all__ = ["message", "Message"]

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
        if not hasattr(c, "reply"):
            c.reply = Message.reply  # type: ignore[attr-defined]
        return dataclasses.dataclass(c, **dataclass_kwargs)

    if cls is not None:
        return wrap(cls)
    return wrap

