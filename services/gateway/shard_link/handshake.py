"""A shard connection's opening on a TLS listener (docs/gateway.md, "TLS"): the handshake, and
why one failed, in a sentence for the log and a label for
``shardbus_gateway_connections_refused_total``.

The handshake is the gateway's own step (``loop.connect_accepted_socket(ssl=…)`` on each accepted
socket, :class:`TLSHandoff`) rather than the listener's (``start_server(ssl=…)``): asyncio drops a
listener's failed handshakes without a word, and here each is logged once, with its reason, and
counted; and the handshake and the hello share one deadline, ``SHARDBUS_HELLO_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Callable
from http import HTTPStatus
from typing import cast

from shared.errors import ShardbusError
from shared.tls import ReloadingServerContext

REFUSAL_LABELS = ("handshake_timeout", "not_tls", "client_certificate", "gateway_certificate", "handshake_closed",
                  "tls_error", "hello_timeout", "hello_too_long", "hello_refused")
"""The ``reason`` label of ``connections_refused_total``: why a connection was refused before it
became a shard's link."""

_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
                      "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_MESSAGE",
                      "UNEXPECTED_RECORD", "RECORD_LENGTH_MISMATCH", "LENGTH_MISMATCH", "BAD_PACKET_LENGTH",
                      "ENCRYPTED_LENGTH_TOO_LONG", "DATA_LENGTH_TOO_LONG"})
"""OpenSSL's reasons for bytes that are no TLS record: a plaintext shard (its hello in the clear),
an HTTP client, noise."""

_CLIENT_CERTIFICATE = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED",
                                 "TLSV13_ALERT_CERTIFICATE_REQUIRED", "NO_CERTIFICATE_RETURNED"})
"""The shard's certificate is missing or not signed by ``SHARDBUS_SHARD_TLS_CA`` (or expired)."""


class HandshakeRefused(ShardbusError):
    """The TLS handshake failed: ``label`` (one of :data:`REFUSAL_LABELS`) and, as the message,
    why in words (never a secret: OpenSSL's reason, a certificate's verify error)."""

    status = HTTPStatus.UNAUTHORIZED

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(reason)
        self.label = label


def classify(exc: BaseException) -> HandshakeRefused:
    """Why a handshake failed, from what the handshake raised."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return HandshakeRefused("client_certificate",
                                f"the shard's certificate was refused: {exc.verify_message or exc.reason}")
    if isinstance(exc, ConnectionAbortedError) and "longer than" in str(exc):  # asyncio's own deadline
        return HandshakeRefused("handshake_timeout", "no TLS handshake in time")
    if isinstance(exc, ssl.SSLEOFError | ConnectionError | asyncio.IncompleteReadError | EOFError):
        return HandshakeRefused("handshake_closed", "the shard closed the connection during the TLS handshake")
    if isinstance(exc, ssl.SSLError):
        reason = str(exc.reason or "")
        if reason in _CLIENT_CERTIFICATE:
            return HandshakeRefused("client_certificate", "the shard presented no valid client certificate "
                                    f"({reason})")
        if reason in _NOT_TLS:
            return HandshakeRefused("not_tls", f"the shard did not speak TLS ({reason}): a plaintext client "
                                    "on the TLS listener?")
        if reason.startswith(("SSLV3_ALERT_", "TLSV1_ALERT_")) and any(
                word in reason for word in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_", "DECRYPT_ERROR")):
            return HandshakeRefused("gateway_certificate", "the shard refused the gateway's certificate "
                                    f"({reason}): give it the CA that signed SHARDBUS_SHARD_TLS_CERT")
        return HandshakeRefused("tls_error", f"TLS handshake failed ({reason or exc})")
    return HandshakeRefused("tls_error", f"TLS handshake failed ({type(exc).__name__}: {exc})")


async def accept_tls(sock: socket.socket, tls: ReloadingServerContext, limit: int,
                     timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The server's side of the TLS handshake on an accepted socket no byte of which was read yet
    (:class:`TLSHandoff`): the stream pair of the TLS connection. The caller bounds it with the
    hello's deadline (``timeout``); asyncio's own, a second later, is a backstop. Raises
    :class:`HandshakeRefused`; the socket is then closed (it belongs to the transport from the call on)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    try:
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock, ssl=tls.context,
                                                          ssl_handshake_timeout=timeout + 1.0)
    except (ssl.SSLError, OSError, EOFError) as exc:  # ssl's errors are OSErrors; a reset, EOF
        raise classify(exc) from None
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class TLSHandoff(asyncio.Protocol):
    """The TLS listener's protocol: each accepted socket, before a byte of it is read, is handed
    to ``take`` (a copy of its descriptor; this plain transport is closed at once), which runs the
    handshake with :func:`accept_tls`.

    Not ``StreamWriter.start_tls`` on a stream the listener already reads: on uvloop a connection
    starts reading as soon as it is accepted, and a ClientHello read before the handshake began
    was out of the TLS layer's reach (the handshake then waited for it until the deadline)."""

    def __init__(self, take: Callable[[socket.socket], None]) -> None:
        self.take = take

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        try:
            own = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:  # out of descriptors: this connection is dropped, the listener goes on
            own = None
        cast(asyncio.Transport, transport).abort()  # nothing read: both loops read only after this returns
        if own is not None:
            self.take(own)
