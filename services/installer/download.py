"""Fetching manifests and artifacts over HTTPS from allowed hosts only.

Every URL (the first and each redirect's target) must be https on a host of the
allowlist. A body is read as a stream with a size cap, so an oversized or endless answer
is cut off rather than held; an artifact's chunks go, with its sha256 computed on the way,
to a sink (the installer's inspects the archive as it arrives and writes it to disk). An
unreachable host, a 5xx answer, a body that ends before its Content-Length and a try that
outlasts its deadline (``SHARDBUS_FETCH_TIMEOUT_S`` for the whole try: every redirect, the
headers and the body, so a host trickling a byte at a time is cut there) are retried with
back-off (tenacity) and are a 502 at the end; a 4xx is a 400 at once. Every refusal carries the
upstream body, if any.

The HTTP is httpx's synchronous client (TLS, certificate checks, HTTP/1.1 framing, building a
redirect's request from its ``Location``): security-sensitive work kept by a maintained library
rather than by hand. Redirects are not followed by httpx itself: each hop's URL is checked
against the allowlist before it is requested, and a redirect's body is never read. The fetcher
runs in a worker thread (``asyncio.to_thread``), keeping the event loop free for requests and
lock renewals. Its throughput against ``http.client`` is in docs/installer.md ("Code").
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, Protocol, TypeVar
from urllib.parse import SplitResult, urlsplit

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from services.installer.refusals import BAD_INPUT, UPSTREAM_FAILED, Refused
from shared.errors import ShardbusError
from shared.logs import redact

MAX_REDIRECTS = 5
"""Redirects followed before a fetch is refused."""

BODY_EXCERPT_CHARS = 500
"""How much of an upstream error body a refusal quotes."""

READ_BYTES = 1024 * 1024
"""An artifact's bytes go to the sink (and to progress) in pieces of about this size."""

HEADERS = {
    # identity: the bytes hashed are the bytes the manifest's sha256 is about, and no transfer
    # decoding can expand a small answer into a large one (the body is read raw besides).
    "Accept-Encoding": "identity",
    "User-Agent": "shardbus-installer",
}

Progress = Callable[[int, int | None], None]
"""Called with (bytes received, bytes expected or None) while an artifact downloads."""

T = TypeVar("T")
"""What a retried attempt returns."""


class Sink(Protocol):
    """Receives an artifact's bytes as they arrive; one per download attempt."""

    def write(self, chunk: bytes) -> None: ...

    def close(self) -> None:
        """The whole body arrived."""

    def abort(self) -> None:
        """This attempt failed; forget what was written."""


class _Transient(ShardbusError):
    """A failure worth another try: the host unreachable, a timeout, or a 5xx answer (after the
    last try, the sentence of a 502)."""

    status = UPSTREAM_FAILED


class _Try:
    """One attempt's deadline over its whole course. httpx's timeouts bound each read, and a host
    sending a byte just inside each would hold a read for ever: at the deadline a timer shuts the
    socket in use down, so a read blocked on it returns at once. The socket is learnt from httpx's
    ``trace`` request extension as each connection is made and its TLS set up."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(timeout_s, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> _Try:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def timeout(self) -> httpx.Timeout:
        """Each connect, write and read of the hop about to start, bounded by what is left."""
        return httpx.Timeout(max(min(self.timeout_s, self.remaining()), 0.001))

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's ``trace`` extension: watch the socket of each new connection (keep-alive is
        off, so every hop has its own), then the TLS one wrapped around it."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                self.watch(sock)

    def watch(self, sock: socket.socket) -> None:
        """``sock`` is the one in use from now on (a redirect opens another)."""
        with self._lock:
            self._sock = sock
        if self.expired():
            self._cut()

    def _cut(self) -> None:
        with self._lock:
            sock = self._sock
            if sock is not None:
                try:
                    # The plain socket's shutdown, not the TLS wrapper's: that one would drop
                    # the TLS state under a read running in the fetching thread.
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed

    def timed_out(self, what: str, url: str) -> _Transient:
        return _Transient(f"the {what} {url} timed out: no whole answer within {self.timeout_s:g} s "
                          "(SHARDBUS_FETCH_TIMEOUT_S, for the whole try)")

    def check_whole(self, what: str, url: str, size: int, declared: int | None) -> None:
        """After the body's last read: a try cut by its deadline, or a body shorter than its
        Content-Length, is worth another try, never a sha256 mismatch."""
        if self.expired():
            raise self.timed_out(what, url)
        if declared is not None and size < declared:
            raise _Transient(f"the {what} {url} ended after {size} of its {declared} bytes")


def check_url(url: str, allowed_hosts: list[str], what: str) -> SplitResult:
    """``url`` parsed, or :class:`Refused` (400) unless it is https on an allowed host.
    Messages show the URL with any password masked."""
    shown = redact(url)
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        raise Refused(BAD_INPUT, f"the {what} URL {shown!r} is not a valid URL ({exc})") from None
    if parsed.username is not None or parsed.password is not None:
        raise Refused(BAD_INPUT, f"the {what} URL must not carry credentials")
    if parsed.scheme.lower() != "https":
        raise Refused(BAD_INPUT, f"the {what} URL {shown!r} is not https; only https sources are allowed")
    host = (parsed.hostname or "").lower()
    if not host:
        raise Refused(BAD_INPUT, f"the {what} URL {shown!r} names no host")
    with_port = f"{host}:{port}" if port else host
    if host not in allowed_hosts and with_port not in allowed_hosts:
        raise Refused(BAD_INPUT, f"the {what} URL {shown!r} is on host {with_port}, which is not on the "
                                 "installer's allowed hosts (SHARDBUS_INSTALLER_ALLOWED_HOSTS)")
    return parsed


def _declared_length(response: httpx.Response) -> int | None:
    """The Content-Length the server announced, if it announced a sane one."""
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else None


def _excerpt(body: bytes) -> str:
    """An upstream error body as one line: an HTML page by its title (or its text without
    tags), white space folded; a release host's 404 page is not 13 lines of markup."""
    text = body.decode("utf-8", errors="replace")
    if re.match(r"\s*<", text):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title else re.sub(r"<[^>]*>", " ", re.sub(
            r"<(script|style)[^>]*>.*?</\1>", " ", text, flags=re.IGNORECASE | re.DOTALL))
    text = " ".join(text.split())
    return text[:BODY_EXCERPT_CHARS] + ("…" if len(text) > BODY_EXCERPT_CHARS else "")


def _untrusted(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed under an httpx error, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class _Body:
    """A 2xx answer whose body is being read: its chunks as they arrive, counted, with the
    network's failures (and the try's deadline) turned into :class:`_Transient`."""

    def __init__(self, response: httpx.Response, what: str, url: str, this_try: _Try) -> None:
        self.response, self.what, self.url, self.this_try = response, what, url, this_try
        self.declared = _declared_length(response)
        self.size = 0

    def chunks(self) -> Iterator[bytes]:
        try:
            for chunk in self.response.iter_raw():
                self.size += len(chunk)
                yield chunk
        except httpx.TransportError as exc:
            if self.this_try.expired() or isinstance(exc, httpx.TimeoutException):
                raise self.this_try.timed_out(self.what, self.url) from None
            if self.declared is not None and self.size < self.declared:
                raise _Transient(f"the {self.what} {self.url} ended after {self.size} of its {self.declared} bytes "
                                 f"({type(exc).__name__})") from None
            raise _Transient(f"{self.response.url.host} cut the {self.what} off ({type(exc).__name__}: {exc})") \
                from None
        self.this_try.check_whole(self.what, self.url, self.size, self.declared)


class Fetcher:
    """Fetches from allowed hosts with a timeout, retries and caps; one per service."""

    def __init__(self, allowed_hosts: list[str], *, ca_file: str = "", timeout_s: float = 20.0,
                 attempts: int = 3, retry_wait_s: float = 0.5) -> None:
        self.allowed_hosts = allowed_hosts
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.retry_wait_s = retry_wait_s
        self._tls = ssl.create_default_context()
        if ca_file:
            self._tls.load_verify_locations(ca_file)
        self.fetched_bytes = 0
        """Bytes read from release servers since the service started (its metrics)."""
        self._counting = threading.Lock()  # fetches run in threads, several at once

    def close(self) -> None:
        """Nothing is pooled: each try has its own client and connections."""

    def _client(self) -> httpx.Client:
        """A client for one try. trust_env off: no proxy, netrc credentials or CA bundle from the
        environment (only SHARDBUS_INSTALLER_CA_FILE adds trust); no cookies kept or sent; no
        keep-alive, so each hop has its own connection (the socket a try's deadline shuts down).
        Fetches are a few a day: nothing is worth sharing between them."""
        return httpx.Client(verify=self._tls, trust_env=False, follow_redirects=False, headers=HEADERS,
                            cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
                            limits=httpx.Limits(max_keepalive_connections=0))

    def _fetched(self, n: int) -> None:
        with self._counting:
            self.fetched_bytes += n

    def fetch_manifest(self, url: str, max_bytes: int) -> bytes:
        """The manifest's bytes (at most ``max_bytes``), fetched within the timeout."""
        check_url(url, self.allowed_hosts, "manifest")

        def attempt() -> bytes:
            chunks: list[bytes] = []
            with _Try(self.timeout_s) as this_try, self._open(url, "manifest", this_try) as body:
                if (body.declared or 0) > max_bytes:
                    raise Refused(BAD_INPUT, f"the manifest at {url} is larger than {max_bytes} bytes")
                for chunk in body.chunks():
                    self._fetched(len(chunk))
                    if body.size > max_bytes:
                        raise Refused(BAD_INPUT, f"the manifest at {url} is larger than {max_bytes} bytes")
                    chunks.append(chunk)
            return b"".join(chunks)

        return self._retrying(attempt, url, "manifest")

    def fetch_artifact(self, url: str, max_bytes: int, make_sink: Callable[[], Sink],
                       progress: Progress | None = None) -> tuple[str, int]:
        """Stream the artifact into a fresh sink per attempt; its (sha256 hex, size). Over
        ``max_bytes`` is refused as soon as it is known (from Content-Length, or while reading)."""
        check_url(url, self.allowed_hosts, "artifact")

        def attempt() -> tuple[str, int]:
            # shape: one streamed read: the cap, the digest, the sink and the progress for each chunk.
            digest = hashlib.sha256()
            sink = make_sink()
            piece: list[bytes] = []  # the network's reads (a TLS record, 16 KiB) gathered into ~READ_BYTES
            gathered = 0
            try:
                with _Try(self.timeout_s) as this_try, self._open(url, "artifact", this_try) as body:
                    total = body.declared
                    if total is not None and total > max_bytes:
                        raise Refused(BAD_INPUT, f"the artifact at {url} is {total} bytes, over the cap of "
                                                 f"{max_bytes} bytes")
                    for chunk in body.chunks():
                        self._fetched(len(chunk))
                        if body.size > max_bytes:
                            raise Refused(BAD_INPUT, f"the artifact at {url} is over the cap of {max_bytes} bytes")
                        digest.update(chunk)
                        piece.append(chunk)
                        gathered += len(chunk)
                        if gathered >= READ_BYTES:
                            sink.write(b"".join(piece))
                            piece, gathered = [], 0
                            if progress is not None:
                                progress(body.size, total)
                    if piece:
                        sink.write(b"".join(piece))
                    if progress is not None:
                        progress(body.size, total)
                    size = body.size
            except BaseException:
                sink.abort()
                raise
            sink.close()
            return digest.hexdigest(), size

        return self._retrying(attempt, url, "artifact")

    def _retrying(self, attempt: Callable[[], T], url: str, what: str) -> T:
        """Run ``attempt`` with retries on transient failures; a 502 once they are spent."""
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.retry_wait_s, max=max(self.retry_wait_s * 8, 0.001)),
            retry=retry_if_exception_type(_Transient),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Transient as exc:
            tries = f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}"
            raise Refused(UPSTREAM_FAILED, f"could not fetch the {what} {url} after {tries}: {exc.sentence}") \
                from None

    @contextmanager
    def _open(self, url: str, what: str, this_try: _Try) -> Iterator[_Body]:
        """A 2xx answer for ``url`` (body unread), following redirects only to allowed https hosts,
        each checked before it is requested. Network failures, also while the caller reads the
        body, become :class:`_Transient`; so does the try's deadline passing."""
        with self._client() as client:
            yield from self._hops(client, url, what, this_try)

    def _hops(self, client: httpx.Client, url: str, what: str, this_try: _Try) -> Iterator[_Body]:
        try:
            request = client.build_request("GET", url, extensions={"trace": this_try.trace})
        except httpx.InvalidURL as exc:
            raise Refused(BAD_INPUT, f"the {what} URL {redact(url)!r} is not a valid URL ({exc})") from None
        for hop in range(MAX_REDIRECTS + 1):
            current = str(request.url)
            check_url(current, self.allowed_hosts, f"{what} redirect" if hop else what)
            if this_try.expired():
                raise this_try.timed_out(what, url)
            request.extensions["timeout"] = this_try.timeout().as_dict()
            response = self._send(client, request, what, this_try, url)
            try:
                if response.next_request is not None:  # a redirect with a Location: its body unread
                    request = response.next_request
                    continue
                if response.status_code >= HTTPStatus.BAD_REQUEST or response.status_code < HTTPStatus.OK:
                    said = f"{current} answered {response.status_code}"
                    excerpt = _excerpt(self._read_excerpt(_Body(response, "answer", url, this_try)))
                    said += f": {excerpt}" if excerpt else ""
                    if response.status_code >= HTTPStatus.INTERNAL_SERVER_ERROR:
                        raise _Transient(said)
                    raise Refused(BAD_INPUT, f"the {what} could not be fetched: {said}")
                yield _Body(response, what, url, this_try)
                return
            finally:
                response.close()
        raise Refused(BAD_INPUT, f"the {what} URL {url} redirected more than {MAX_REDIRECTS} times")

    @staticmethod
    def _send(client: httpx.Client, request: httpx.Request, what: str, this_try: _Try, url: str) -> httpx.Response:
        """The answer's status and headers (body unread); a certificate not trusted is a 502 at once."""
        try:
            return client.send(request, stream=True)
        except httpx.TransportError as exc:
            untrusted = _untrusted(exc)
            if untrusted is not None:
                raise Refused(UPSTREAM_FAILED, f"the {what} host {request.url.host} has a TLS certificate this "
                                               f"installer does not trust ({untrusted.verify_message})") from None
            if this_try.expired() or isinstance(exc, httpx.TimeoutException):
                raise this_try.timed_out(what, url) from None
            raise _Transient(f"{request.url.host} unreachable ({type(exc).__name__}: {exc})") from None

    @staticmethod
    def _read_excerpt(body: _Body) -> bytes:
        """The first bytes of an error answer, enough to quote it."""
        read = bytearray()
        for chunk in body.chunks():
            read += chunk
            if len(read) >= 4 * BODY_EXCERPT_CHARS:
                break
        return bytes(read)
