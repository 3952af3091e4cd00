"""A release's install manifest: parsed and checked before anything else is fetched.

A manifest is a JSON object::

    {"id": "uo-events", "version": "1.4.0", "coreApi": "^1.10.0",
     "artifactUrl": "https://releases.example.org/uo-events-1.4.0.tar.gz",
     "sha256": "<64 hex digits>", "size": 1234567}

``size`` is optional. The core API range is an npm-style range matched by
``semantic_version.NpmSpec`` (a tested implementation of npm's range grammar).
"""

from __future__ import annotations

import json

import semantic_version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.installer.refusals import BAD_INPUT, Refused
from shared.contracts.ids import ModuleId
from shared.contracts.ids import is_module_id as is_module_id  # re-exported (tests/shared checks it)
from shared.replies import describe_validation_error

MODULE_API_VERSION = "1.11.0"
"""The core module API this site offers; a module's ``coreApi`` range must accept it."""


class Manifest(BaseModel):
    """What a release says about itself: which module, which version, where its artifact is."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    id: ModuleId
    version: str = Field(max_length=64)
    core_api: str = Field(alias="coreApi", max_length=128)
    artifact_url: str = Field(alias="artifactUrl", max_length=2048)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    size: int | None = Field(default=None, gt=0)

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        try:
            semantic_version.Version(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a semantic version (e.g. 1.4.0)") from None
        return value

    @field_validator("core_api")
    @classmethod
    def _range(cls, value: str) -> str:
        try:
            semantic_version.NpmSpec(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an npm-style version range (e.g. ^1.10.0)") from None
        return value

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


def api_satisfies(core_api: str, api_version: str = MODULE_API_VERSION) -> bool:
    """True when the npm-style range ``core_api`` accepts ``api_version``."""
    return bool(semantic_version.NpmSpec(core_api).match(semantic_version.Version(api_version)))


def parse_manifest(body: bytes, source: str) -> Manifest:
    """The manifest in ``body`` (fetched from ``source``), or :class:`Refused` (400) saying
    what is wrong with it. The core API range is checked here; the artifact URL's host by
    the fetcher."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused(BAD_INPUT, f"the manifest at {source} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Refused(BAD_INPUT, f"the manifest at {source} is not a JSON object")
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        detail = describe_validation_error(exc).removeprefix("invalid request: ")
        raise Refused(BAD_INPUT, f"the manifest at {source} is invalid: {detail}") from None
    if not api_satisfies(manifest.core_api):
        raise Refused(BAD_INPUT, f"module {manifest.id} {manifest.version} needs core API "
                                 f"{manifest.core_api}, but this site offers {MODULE_API_VERSION}")
    return manifest
