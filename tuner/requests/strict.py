"""The base of every request model: unknown fields refused, and every value held to plain data.

Typed numbers refuse ``NaN`` and ``Infinity`` (pydantic's ``allow_inf_nan=False``; JSON's ``1e400`` parses as
infinity); every field's value, free-form objects included (a ds_config, a peft or quantization config, an inline
``config.json``, pins), is walked by :func:`tuner.workload.plain_data.check_plain_data`: no non-finite number, no
control character in any string (PostgreSQL refuses NUL), no absurd nesting. A refusal names the field's path, as
a 422 (the API) or one line with exit 2 (the CLI).

Example:
    >>> class Probe(RequestModel):
    ...     ds_config: dict = {}
    >>> Probe.model_validate({"ds_config": {"gradient_clipping": float("nan")}})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    pydantic_core._pydantic_core.ValidationError: 1 validation error for Probe
    ds_config
      ds_config.gradient_clipping: must be a finite number, got nan ...
"""

from __future__ import annotations

from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from tuner.errors import InputError
from tuner.workload.plain_data import check_plain_data


class RequestModel(BaseModel):
    """A request's schema: extra fields forbidden, non-finite numbers and control characters refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """``true`` is not a number: pydantic's lax mode would read it as 1 for a number field."""
        if isinstance(value, bool) and info.field_name and _numeric_only(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("bool_not_number", "must be a number, not a boolean")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _plain_data(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, BaseModel):  # a nested request checked its own fields
            return value
        try:
            check_plain_data(value, info.field_name or "value")
        except InputError as error:
            raise PydanticCustomError(
                "plain_data", "{field}: {message}", {"field": error.field, "message": error.message}
            ) from None
        return value


def _numeric_only(annotation: Any) -> bool:
    """True when ``annotation`` takes numbers but not booleans (``float | None``, ``Annotated[int, ...]``)."""
    types: set[Any] = set()
    pending = [annotation]
    while pending:
        current = pending.pop()
        origin = get_origin(current)
        if origin is Annotated:
            pending.append(get_args(current)[0])
        elif origin is Union or type(current).__name__ == "UnionType":
            pending.extend(get_args(current))
        else:
            types.add(current)
    return bool(types & {int, float}) and bool not in types


__all__ = ["RequestModel"]
