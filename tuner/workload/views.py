"""A read-once attribute for the immutable views of a trial (:class:`tuner.workload.TrialConfig`).

:func:`functools.cached_property` takes a lock on every first read in Python 3.11 (3.12 dropped it); a search resolves
tens of thousands of trials, each reading half a dozen views once, and the lock was a tenth of an estimate's time.
This one computes on first read and stores the value in the instance's ``__dict__``, where later reads find it
without calling anything (two threads reading a view at once both compute it; the views are pure, so either value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class cached_property(Generic[T]):  # named like the functools original it stands in for
    """Compute the decorated method's value on first read and keep it on the instance.

    Example:
        >>> class Box:
        ...     @cached_property
        ...     def size(self) -> int:
        ...         print("computed")
        ...         return 3
        >>> box = Box()
        >>> box.size, box.size
        computed
        (3, 3)
    """

    def __init__(self, read: Callable[[Any], T]) -> None:
        self.read = read
        self.name = read.__name__
        self.__doc__ = read.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached_property[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> T | cached_property[T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.read(instance)
        return value


__all__ = ["cached_property"]
