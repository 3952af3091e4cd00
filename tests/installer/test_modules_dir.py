"""What counts as installed is what a loader would scan, and a swap never leaves the site
with neither version (nor with scratch behind)."""

from __future__ import annotations

import json
from pathlib import Path

from services.installer import modules_dir
from services.installer.modules_dir import InstalledModule


def _module(root: Path, name: str, version: str = "1.0.0", **files: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "module.json").write_text(json.dumps({"id": name.split(".")[0], "version": version}))
    for file, text in files.items():
        (path / file).write_text(text)
    return path


def test_only_a_directory_named_as_a_module_id_holding_module_json_is_installed(tmp_path):
    _module(tmp_path, "uo-events", "1.4.0")
    _module(tmp_path, ".install-uo-vendors-abc123")
    _module(tmp_path, "uo-events.replaced-0a1b2c")
    (tmp_path / "uo-empty").mkdir()
    (tmp_path / "README").write_text("a file is not a module")
    _module(tmp_path, "Not_An_Id")
    (tmp_path / "uo-link").symlink_to(tmp_path / "uo-events")
    assert modules_dir.installed(tmp_path) == [InstalledModule("uo-events", "1.4.0")]


def test_a_missing_modules_dir_holds_nothing(tmp_path):
    assert modules_dir.installed(tmp_path / "absent") == []


def test_swapping_in_replaces_the_old_version_and_leaves_nothing_aside(tmp_path):
    _module(tmp_path, "uo-events", "1.0.0", **{"old.js": "old"})
    scratch = modules_dir.make_scratch(tmp_path, "uo-events")
    new = _module(scratch, "module", "1.1.0", **{"new.js": "new"})
    modules_dir.swap_in(new, tmp_path, "uo-events")
    assert modules_dir.installed(tmp_path) == [InstalledModule("uo-events", "1.1.0")]
    assert sorted(p.name for p in (tmp_path / "uo-events").iterdir()) == ["module.json", "new.js"]
    assert modules_dir.leftovers(tmp_path) == [scratch]  # the caller removes its scratch
    modules_dir.remove_tree(scratch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uo-events"]


def test_leftovers_are_scratch_and_set_aside_directories_only(tmp_path):
    _module(tmp_path, "uo-events")
    a = _module(tmp_path, ".install-uo-events-x1")
    b = _module(tmp_path, "uo-events.replaced-9f")
    assert modules_dir.leftovers(tmp_path) == [a, b]


def test_removing_sets_the_module_aside_then_deletes_it(tmp_path):
    _module(tmp_path, "uo-events")
    modules_dir.set_aside(tmp_path, "uo-events")
    assert list(tmp_path.iterdir()) == []
