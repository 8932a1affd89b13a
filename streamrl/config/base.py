"""What every config section shares: the one-line error type, the strict Struct base, and the bounded number
types the fields use (their bounds also make the "allowed: ..." part of an error message)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

PositiveInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]


class ConfigError(ValueError):
    """A config file or override is wrong; the message is one line meant for the user."""


class _Section(Struct, forbid_unknown_fields=True, kw_only=True):
    pass
