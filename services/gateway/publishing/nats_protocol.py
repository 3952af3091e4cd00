"""The NATS protocol commands the gateway writes itself, for the pipeline's one write a pass.

nats-py's ``Client.publish`` checks the subject with a regular expression and rebuilds the
headers a byte at a time for each message: about 12 % of the gateway's CPU with 1,000 shards
(py-spy, issue 26). A frame's subject was already checked whole (``shared.subjects``) and its
message id is a shard name and numbers; a command's reply goes to the reply subject and with
the headers its request came with, checked here as nats-py checks them (else None: the caller
uses ``Client.publish``, which says what is wrong).
"""

from __future__ import annotations

import re

HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name nats-py accepts (RFC 7230's token)."""

SUBJECT = re.compile(r"[^\s]+")
"""A subject NATS delivers (no whitespace; the server checked the rest)."""


def hpub(subject: str, reply: str, msg_id: str, data: bytes) -> bytes:
    """A frame's HPUB command with its one header, ``Nats-Msg-Id``, as ``Client.publish``
    writes it."""
    head = b"NATS/1.0\r\nNats-Msg-Id: %s\r\n\r\n" % msg_id.encode()
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(head),
                                               len(head) + len(data), head, data)


def pub(subject: str, reply_to: str, data: bytes) -> bytes:
    """A PUB command with a reply subject and no headers (a fast-ingest batch's end)."""
    return b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply_to.encode(), len(data), data)


def reply(subject: str, data: bytes, headers: dict[str, str] | None, max_payload: int) -> bytes | None:
    """A reply's PUB (or HPUB, with the request's headers) command; None when nats-py's own
    checks should have their say (a header or subject it would refuse, a reply too large)."""
    if not SUBJECT.fullmatch(subject):
        return None
    if not headers:
        if len(data) > max_payload:
            return None
        return b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(data), data)
    lines = [b"NATS/1.0\r\n"]
    for key, value in headers.items():
        if not HEADER_KEY.fullmatch(key) or "\r" in value or "\n" in value:
            return None
        lines.append(b"%s: %s\r\n" % (key.encode(), value.strip().encode()))
    lines.append(b"\r\n")
    head = b"".join(lines)
    if len(head) + len(data) > max_payload:
        return None
    return b"HPUB %s %d %d\r\n%s%s\r\n" % (subject.encode(), len(head), len(head) + len(data), head, data)
