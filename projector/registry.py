"""Finding projections: the built-in ones plus those named by import paths in configuration.

`LEDGERFLOW_PROJECTIONS="myapp.read_models:orders,myapp.read_models:ALL"`: each entry is
`module:attribute`, the attribute a Projection or a list of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from eventstore import ConfigurationError, InvalidInputError, NotFoundError
from eventstore.spi import import_object
from projector.catalogue import stream_catalogue
from projector.projection import Projection

BUILT_IN: tuple[Projection, ...] = (stream_catalogue,)


def load_projections(paths: Iterable[str] = (), *, built_in: bool = True) -> list[Projection]:
    found: dict[str, Projection] = {p.name: p for p in BUILT_IN} if built_in else {}
    for path in paths:
        value = import_object(path, "projections")
        for projection in value if isinstance(value, list | tuple) else [value]:
            if not isinstance(projection, Projection):
                raise ConfigurationError(f"{path!r} holds a {type(projection).__name__}, not a Projection")
            if found.get(projection.name, projection) is not projection:
                raise InvalidInputError(f"two projections are named {projection.name!r}")
            found[projection.name] = projection
    return list(found.values())


def find(projections: Iterable[Projection], name: str) -> Projection:
    for p in projections:
        if p.name == name:
            return p
    known = ", ".join(sorted(p.name for p in projections)) or "none"
    raise NotFoundError(f"no projection named {name!r}; known projections: {known}")
