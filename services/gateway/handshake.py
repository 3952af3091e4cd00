"""A shard connection's opening on a TLS listener (docs/gateway.md, "TLS"): the handshake, and
why one failed, in a sentence for the log and a label for
``shardbus_gateway_connections_refused_total``.

The handshake is the gateway's own step (``StreamWriter.start_tls`` on the accepted
connection) rather than the listener's (``start_server(ssl=…)``): asyncio drops a listener's
failed handshakes without a word, and here each is logged once, with its reason, and counted;
and the handshake and the hello share one deadline, ``SHARDBUS_HELLO_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
import ssl

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


class HandshakeRefused(Exception):
    """The TLS handshake failed: ``label`` (one of :data:`REFUSAL_LABELS`) and, as the message,
    why in words (never a secret: OpenSSL's reason, a certificate's verify error)."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(reason)
        self.label = label


def classify(exc: BaseException) -> HandshakeRefused:
    """Why a handshake failed, from what ``start_tls`` raised."""
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


async def handshake(writer: asyncio.StreamWriter, tls: ReloadingServerContext, timeout: float) -> None:
    """Run the server's side of the TLS handshake on the accepted connection. The caller bounds
    it with the hello's deadline (``timeout``); asyncio's own, a second later, is a backstop.
    Raises :class:`HandshakeRefused`."""
    try:
        await writer.start_tls(tls.context, ssl_handshake_timeout=timeout + 1.0)
    except (ssl.SSLError, OSError, EOFError) as exc:  # ssl's errors are OSErrors; a reset, EOF
        raise classify(exc) from None
