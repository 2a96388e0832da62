"""uvicorn's HTTP/1.1 protocol (h11) with a header deadline: a connection must deliver a request's
headers within `header_timeout` seconds of opening (or of its previous response), or it is closed.

uvicorn itself only times out idle keep-alive connections (timeout_keep_alive, reset by every byte
received), so a client sending its headers a byte at a time would hold its connection forever.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # before: a pipelined request handled inside disarms it again
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _expired(self) -> None:
        self._header_timer = None
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()


def protocol_with(header_timeout: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn's `http` option."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": float(header_timeout)})
