"""The read buffer of asyncio's TLS connections.

asyncio's ``SSLProtocol`` reads each TLS connection into a buffer of its own of 256 KiB
(``SSLProtocol.max_size``), allocated when the connection opens and held for as long as it
lives. An API server holds about three connections per node agent (its pods' watch, its
Lease renewals, its status), so 768 KiB per agent, nearly all of it never used: a TLS record
is at most 16 KiB, and the buffer is refilled by every read. ``READ_BUFFER`` (two records) is
what gpufleet's servers and clients use instead; a long upload takes more, smaller reads.
"""

from __future__ import annotations

from asyncio import sslproto

READ_BUFFER = 32 * 1024


def use_small_tls_buffers() -> None:
    """Every TLS connection this process opens from now on reads into READ_BUFFER bytes."""
    protocol = getattr(sslproto, "SSLProtocol", None)
    if protocol is not None and getattr(protocol, "max_size", 0) > READ_BUFFER:
        protocol.max_size = READ_BUFFER
