"""The workflows a process knows, by name and version, and the limits their nodes share. Registration
validates a workflow and then freezes it; apart from the definitions themselves, which stay pure values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from eventstore import NotFoundError
from workflows.definition import Workflow
from workflows.definition_checks import DefinitionError, check_name


@dataclass(frozen=True)
class Limit:
    """A limit shared by every worker: at most `concurrency` nodes naming it run at once, and at most
    `per_minute` of them start in any sliding minute (None: no bound of that kind)."""

    name: str
    concurrency: int | None = None
    per_minute: int | None = None

    def __post_init__(self) -> None:
        check_name("limit", self.name)
        for bound in ("concurrency", "per_minute"):
            value = getattr(self, bound)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise DefinitionError(f"limit {self.name!r}: {bound} must be a whole number of at least 1")
        if self.concurrency is None and self.per_minute is None:
            raise DefinitionError(f"limit {self.name!r} bounds nothing: give concurrency, per_minute or both")


_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def version_order(version: str) -> tuple[tuple[int, int, str], ...]:
    """Which of two versions is newer: numbers by value, the rest as text ("2" < "10" < "10b")."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|\D+", version)
    )


def _check_version(wf: Workflow) -> str:
    """`wf.version` as the text runs record (a whole number written as a number is taken as its text)."""
    version: object = wf.version
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        version = wf.version = str(version)
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise DefinitionError(
            f"workflow {wf.name!r}: invalid version {version!r}: use 1 to 63 letters, digits, '.', '_' or '-'"
        )
    return version


class WorkflowRegistry:
    """The workflows a process knows, by name and version. Registration validates and then freezes a
    workflow; several versions of one name may be registered, so that runs started with an older
    version go on with it."""

    def __init__(self) -> None:
        #: By name, the newest version; `_versions`: by name, every version.
        self._workflows: dict[str, Workflow] = {}
        self._versions: dict[str, dict[str, Workflow]] = {}
        self._limits: dict[str, Limit] = {}

    def limit(self, name: str, *, concurrency: int | None = None, per_minute: int | None = None) -> Limit:
        """Declare a limit that nodes name in `limits=[...]`: at most `concurrency` of them running at
        once and at most `per_minute` starts in any sliding minute, across every worker and host."""
        declared = Limit(name, concurrency, per_minute)
        if self._limits.get(name, declared) != declared:
            raise DefinitionError(f"limit {name!r} is already declared as {self._limits[name]!r}")
        self._limits[name] = declared
        return declared

    @property
    def limits(self) -> Mapping[str, Limit]:
        """The declared limits by name (read-only)."""
        return MappingProxyType(self._limits)

    def register(self, wf: Workflow) -> Workflow:
        """Register `wf`: a new workflow, or another version of one already registered (a run goes on
        with the version it started with; new runs start with the newest)."""
        version = _check_version(wf)
        versions = self._versions.setdefault(wf.name, {})
        existing = versions.get(version)
        if existing is wf:
            return wf
        if existing is not None:
            raise DefinitionError(
                f"a different workflow named {wf.name!r} is already registered with version {version!r}; "
                "give the changed definition a new version"
            )
        wf.validate()
        wf._sealed = True
        versions[version] = wf
        # By name, the newest version: what new runs start with.
        self._workflows[wf.name] = versions[max(versions, key=version_order)]
        return wf

    def get(self, name: str, version: str | None = None) -> Workflow:
        """The workflow's newest version, or the `version` named (NotFoundError if it is not here)."""
        if name not in self._workflows:
            known = ", ".join(map(repr, self.names())) or "none"
            raise NotFoundError(f"no workflow named {name!r} is registered; known workflows: {known}")
        if version is None:
            return self._workflows[name]
        found = self._versions[name].get(str(version))
        if found is None:
            raise NotFoundError(
                f"workflow {name!r} has no version {version!r} here; registered versions: "
                f"{', '.join(map(repr, self.versions(name)))}"
            )
        return found

    def versions(self, name: str) -> list[str]:
        """The registered versions of `name`, oldest first (empty if it is not registered)."""
        return sorted(self._versions.get(name, {}), key=version_order)

    def name_versions(self) -> list[tuple[str, str]]:
        """(name, version) of every registered workflow version: what a worker claims nodes of."""
        return [(wf.name, wf.version) for wf in self.definitions()]

    def definitions(self) -> list[Workflow]:
        """Every registered workflow, every version: by name, oldest version first."""
        return [self._versions[n][v] for n in self.names() for v in self.versions(n)]

    def names(self) -> list[str]:
        return sorted(self._workflows)
