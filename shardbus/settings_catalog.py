"""Every setting of every service, for the README's table and the compose check."""

from __future__ import annotations

from pydantic_settings import BaseSettings

from shardbus import registry
from shared.settings import ENV_PREFIX, CommonSettings


def settings_class(service: str) -> type[BaseSettings]:
    """The settings class of ``service`` (its ``settings`` in :mod:`shardbus.registry`)."""
    path = registry.get(service).settings
    cls = registry.load(path)
    if not (isinstance(cls, type) and issubclass(cls, BaseSettings)):
        raise TypeError(f"{path} is not a settings class")
    return cls


def all_settings() -> dict[str, list[tuple[str, object, str]]]:
    """``ENV_NAME -> [(who reads it, default, description), …]`` for every setting: one entry
    when every service reading it agrees, one per service where defaults or meanings differ
    (``SHARDBUS_COMMAND_TIMEOUT_S`` is 5 s to the gateway and 15 s to cleanup)."""
    rows: dict[str, list[tuple[str, object, str]]] = {}
    for name, field in CommonSettings.model_fields.items():
        rows[ENV_PREFIX + name.upper()] = [("all", field.default, field.description or "")]
    for service in registry.NAMES:
        for name, field in settings_class(service).model_fields.items():
            env = ENV_PREFIX + name.upper()
            entries = rows.setdefault(env, [])
            if entries and entries[0][0] == "all":
                continue
            same = next((i for i, (_, default, description) in enumerate(entries)
                         if default == field.default and description == (field.description or "")), None)
            if same is None:
                entries.append((service, field.default, field.description or ""))
            else:
                who, default, description = entries[same]
                entries[same] = (f"{who}, {service}", default, description)
    return rows


def markdown_table() -> str:
    """The settings as a Markdown table (the README embeds it): one row per meaning."""
    lines = ["| variable | read by | default | meaning |", "|---|---|---|---|"]
    for env, entries in sorted(all_settings().items()):
        for who, default, description in entries:
            shown = "(secret)" if "TOKEN" in env or "PASSWORD" in env else f"`{default}`"
            lines.append(f"| `{env}` | {who} | {shown} | {description} |")
    return "\n".join(lines)


START, END = "<!-- settings:start -->", "<!-- settings:end -->"
"""The README's settings table sits between these markers."""


def update_readme(path: str) -> None:
    """Rewrite the table between the markers in ``path`` (``make docs``)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{START}\n{markdown_table()}\n{END}{tail}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--update"]:
        update_readme(sys.argv[2])
    else:
        print(markdown_table())
