"""What a person is told of each status, and its colour: one table for the ledger (which
puts ``word``/``colour`` on every row and ``colour``/``cleanupWord``/``cleanupColour`` on
every run) and for the console (its badges, counts and filters).

The website core seed's words and colours where it quotes them (its run console); shardbus's
own otherwise. Green is resolved, amber wants a person; a colour is never the only signal
(docs/console.md, "Statuses: words and colours", shows the table)."""

from __future__ import annotations

RESOURCE_WORD = {
    "pending": "asked for, not yet confirmed",  # shardbus's words: the seed quotes none
    "confirmed": "still out there",             # the seed's words
    "reverting": "being given back",            # shardbus's words
    "reverted": "given back",                   # the seed's
    "orphaned": "gone",                         # the seed's
    "drifted": "someone else moved it",         # the seed's
    "expired": "ended by the game on time",     # the seed's
}
"""What the console says of each resource status."""

RESOURCE_COLOUR = {
    "pending": "grey", "confirmed": "blue",             # shardbus's: the seed quotes neither
    "reverting": "amber", "drifted": "amber", "orphaned": "amber",  # the seed's amber, '#d9c184'
    "reverted": "green", "expired": "green",           # the seed's green, '#8fc79a'
}
"""The seed's two groups: green is resolved, amber wants a person."""

RUN_COLOUR = {
    "scheduled": "grey", "running": "blue",   # shardbus's: the seed quotes no other
    "completed": "green",                      # the seed's (its STATUS_COLOR, '#8fc79a')
    "cancelled": "grey", "failed": "red",      # red: "this did not work", in the seed's words
    "missed": "amber",                         # it never happened: a person looks
}
"""The colour of a run's status (its word is the status itself)."""

CLEANUP_WORD = {
    "pending": "cleanup pending",
    "complete": "cleaned up",
    "incomplete": "cleanup incomplete: wants a person",  # the seed: "a human's to clear"
}
"""What the console says of a run's cleanup status."""

CLEANUP_COLOUR = {"pending": "grey", "complete": "green", "incomplete": "amber"}
"""Its colour: green resolved, amber wants a person, as for rows."""

WAITING_COLOUR = "amber"
"""A run waiting for its shard or module longer than ``SHARDBUS_AWAY_ALERT_S``: it wants a person
(start the shard or module), so it has the colour of wanting one."""


def waited(seconds: float) -> str:
    """How long, as a person reads it: ``45 s``, ``12 min``, ``1 h 5 min``, ``2 d 3 h``."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min" if minutes else f"{secs} s"


def waiting_words(seconds: float) -> str:
    """What the console and ``shardbus status`` say of a run waiting too long for its shard (or
    a module that gives its rows back): ``waiting 1 h 5 min for its shard``."""
    return f"waiting {waited(seconds)} for its shard"
