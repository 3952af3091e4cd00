"""requirements.lock is what `make up` and `make test` install (docs/operations.md, "The lock
file"): every dependency pyproject.toml names is pinned there, within its range, with hashes,
and this environment holds exactly the pinned versions."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"(?P<name>[A-Za-z0-9._-]+)==(?P<version>[^\s;\\]+)(?:\s*;\s*(?P<marker>[^\\]+?))?\s*\\?")


def locked(name: str = "requirements.lock") -> dict[str, tuple[str, str | None, int]]:
    """name → (version, marker, number of hashes), from the lock's own lines."""
    pins: dict[str, tuple[str, str | None, int]] = {}
    current = ""
    for line in (ROOT / name).read_text().splitlines():
        if match := PIN.fullmatch(line.strip()):
            current = canonicalize_name(match["name"])
            pins[current] = (match["version"], match["marker"], 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, marker, hashes = pins[current]
            pins[current] = (version, marker, hashes + 1)
    return pins


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]]


def test_every_declared_dependency_is_pinned_within_its_range_with_hashes():
    pins = locked()
    assert len(pins) > 50
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run `make lock`"
        version, _, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {name}=={version}, outside {requirement.specifier}: run `make lock`")
    unhashed = sorted(name for name, (_, _, hashes) in pins.items() if hashes == 0)
    assert not unhashed, f"pinned without a hash: {unhashed}"


def test_this_environment_holds_exactly_the_locked_versions():
    environment = default_environment()
    differing = []
    for name, (version, marker, _) in locked().items():
        if marker and not Requirement(f"x; {marker}").marker.evaluate(environment):  # type: ignore[union-attr]
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            differing.append(f"{name}: locked {version}, not installed")
            continue
        if Version(installed) != Version(version):
            differing.append(f"{name}: locked {version}, installed {installed}")
    assert not differing, f"not the lock's versions (make installs from requirements.lock): {'; '.join(differing)}"


def test_the_images_lock_is_the_runtime_part_of_the_lock_at_the_same_versions():
    """The Dockerfile installs requirements-runtime.lock: every runtime dependency, hashed, at the
    version the suite ran on (`make lock` writes both)."""
    everything, runtime = locked(), locked("requirements-runtime.lock")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in (Requirement(text) for text in project["dependencies"]):
        assert canonicalize_name(requirement.name) in runtime, f"{requirement.name} is not in requirements-runtime.lock"
    differing = {name: (version, everything.get(name, ("missing",))[0])
                 for name, (version, _, _) in runtime.items() if everything.get(name, ("",))[0] != version}
    assert differing == {}, f"requirements-runtime.lock differs from requirements.lock: {differing}"
    assert all(hashes for _, _, hashes in runtime.values())
    assert "requirements-runtime.lock" in (ROOT / "Dockerfile").read_text()
