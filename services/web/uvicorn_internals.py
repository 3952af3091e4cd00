"""The one place shardbus goes beneath uvicorn's public API (docs/adr/0008 says why, with the
measurements): the web door serves HTTP with uvicorn's own httptools protocol class
(``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, not part of uvicorn's API), each
connection's transport wrapped before uvicorn sees it (services/web/http_wire.py says what the
wrapper does); and its server leaves SIGTERM and SIGINT to ``shardbus run`` by replacing
``Server.capture_signals``, and is stopped through ``Server.should_exit``.

uvicorn is pinned exactly in pyproject.toml. :func:`incompatibilities` names each class,
method and attribute used here that a release lacks or has changed;
``tests/shared/test_library_fences.py`` fails on any, so a new uvicorn is taken only with this
file checked against it (what cannot be checked by name, such as the WebSocket upgrade handing
the same transport on, is checked by the pin and the web door's tests)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

PINNED = "0.55.0"
"""The uvicorn release this file was checked against (pyproject.toml pins the same)."""

Wrap = Callable[[asyncio.Transport, asyncio.AbstractEventLoop], Any]
"""What makes a connection's transport from uvicorn's (and the connection's event loop)."""


def http_protocol(wrap: Wrap) -> type[asyncio.Protocol]:
    """uvicorn's httptools HTTP protocol (for ``uvicorn.Config(http=…)``) on ``wrap(transport,
    loop)`` instead of each connection's own transport; a WebSocket upgrade keeps it (uvicorn
    hands the same transport on)."""

    class WrappedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(wrap(transport, self.loop))

    return WrappedHttpToolsProtocol


class QuietServer(uvicorn.Server):
    """uvicorn's server without its own signal handling: ``shardbus run`` owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def ask_to_stop(server: uvicorn.Server) -> None:
    """Ask a serving server to stop: it stops accepting, then finishes what is in flight within
    its ``timeout_graceful_shutdown``."""
    server.should_exit = True


def incompatibilities(protocol: type[Any] = HttpToolsProtocol, server: type[Any] = uvicorn.Server,
                      installed: str | None = None) -> list[str]:
    """What this file uses that the installed uvicorn lacks or has changed (empty: all there)."""
    found = []
    version = installed if installed is not None else importlib.metadata.version("uvicorn")
    if version != PINNED:
        found.append(f"uvicorn {version} is installed; this file was checked against {PINNED}")
    if not (isinstance(protocol, type) and issubclass(protocol, asyncio.Protocol)):
        found.append("HttpToolsProtocol is not an asyncio.Protocol")
    elif list(inspect.signature(protocol.connection_made).parameters) != ["self", "transport"]:
        found.append(f"HttpToolsProtocol.connection_made{inspect.signature(protocol.connection_made)} changed")
    elif list(inspect.signature(protocol.__init__).parameters) != ["self", "config", "server_state",
                                                                     "app_state", "_loop"]:
        found.append(f"HttpToolsProtocol.__init__{inspect.signature(protocol.__init__)} changed")
    else:
        loop = asyncio.new_event_loop()
        try:
            make: Any = protocol  # any class here, checked above to take uvicorn's arguments
            instance = make(config=uvicorn.Config(_no_app, log_config=None), server_state=ServerState(),
                            app_state={}, _loop=loop)
            if getattr(instance, "loop", None) is not loop:
                found.append("HttpToolsProtocol().loop is not the connection's event loop")
        finally:
            loop.close()
    capture = getattr(server, "capture_signals", None)
    if not callable(capture) or list(inspect.signature(capture).parameters) != ["self"]:
        found.append("Server.capture_signals(self) is missing or changed")
    try:
        made_server = server(uvicorn.Config(_no_app, log_config=None))
    except TypeError:
        made_server = None
    if not isinstance(getattr(made_server, "should_exit", None), bool):
        found.append("Server(config).should_exit is not a bool")
    return found


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app for the checks' Config (never called)."""
