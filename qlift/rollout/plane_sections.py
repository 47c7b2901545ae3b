"""The spec's data-plane sections, found through the planes table.

A shipped plane's section is a field of the spec (typed, with its flags and schema); a plane registered since
(``planes.register_plane``) has its section validated by its entry's model and kept beside the fields, dumped
with them, so a journaled spec holds it and reads it back.
"""

from __future__ import annotations

from typing import Any, Self, cast

from pydantic import (
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails
from pydantic_core import ValidationError as CoreValidationError

from qlift.rollout.planes import PLANES, PlaneKind
from qlift.rollout.spec_sections import PlaneSection, StrictSpec


class WithPlaneSections(StrictSpec):
    """A spec whose data-plane section is read by the plane's table entry (``plane_section``)."""

    _registered_sections: dict[str, PlaneSection] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _take_registered_sections(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """Validate the sections of registered planes that are no field here (before the spec's own rules run,
        which read them)."""
        taken: dict[str, PlaneSection] = {}
        for plane in PLANES.values():
            key = plane.section
            if key is None or plane.settings is None or key in cls.model_fields or not isinstance(data, dict) \
                    or key not in data:
                continue
            raw, data = data[key], {k: v for k, v in data.items() if k != key}
            try:
                taken[key] = plane.settings.model_validate(raw)
            except ValidationError as exc:  # its errors, located under its key
                raise CoreValidationError.from_exception_data(cls.__name__, [_under(key, e) for e in exc.errors()]) \
                    from None
        spec = handler(data)
        spec._registered_sections = taken
        return spec

    @model_serializer(mode="wrap")
    def _dump_registered_sections(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        out = handler(self)
        for key, section in self._registered_sections.items():
            out[key] = section.model_dump(mode=info.mode, exclude_unset=info.exclude_unset,
                                          exclude_none=info.exclude_none)
        return out

    def plane_section(self, plane: PlaneKind) -> PlaneSection | None:
        """``plane``'s settings section in this spec (None: not given, or the plane has none)."""
        if plane.section is None:
            return None
        if plane.section in self._registered_sections:
            return self._registered_sections[plane.section]
        return cast(PlaneSection | None, dict(self).get(plane.section))


def _under(key: str, error: ErrorDetails) -> InitErrorDetails:
    out: InitErrorDetails = {"type": error["type"], "loc": (key, *error["loc"]), "input": error["input"]}
    if "ctx" in error:
        out["ctx"] = error["ctx"]
    return out
