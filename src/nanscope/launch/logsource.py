"""A job log's bytes, as the reader (launch.logs) takes them: UTF-8 text, whatever the file is.

    gzip            decompressed as a stream (a `.log.gz` from a cluster's log store), up to MAX_INFLATED bytes
    UTF-16 LE / BE  decoded and re-encoded as UTF-8 as a stream (a log saved by a Windows editor or PowerShell's
                    `>`), told by its byte-order mark or by NUL bytes in every other place
    anything else   as it is (undecodable bytes are replaced where a line is read)

Each is said in one note. Standard input is read the same way; a closed one (`<&-`) is one UserError line.

    chunks, notes = open_log("job.log.gz", "traceback")
"""

from __future__ import annotations

import codecs
import sys
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from nanscope import inputs
from nanscope.errors import UserError

CHUNK = 4 * inputs.MiB
MAX_INFLATED = 16 << 30  # bytes decompressed at most (a gzip bomb of 100 MB stops here, said so)
_GZIP = b"\x1f\x8b"
_SNIFF = 4096  # bytes looked at to tell UTF-16 without a byte-order mark


def open_log(path: str, what: str) -> tuple[Iterator[bytes], list[str], BinaryIO | None]:
    """(the log's bytes as UTF-8 chunks, what was done to read them, the file to close: None for stdin).

    Raises:
        UserError: not a regular file, unreadable, or a closed standard input.
    """
    if path == "-":
        stream = sys.stdin.buffer if sys.stdin is not None and not sys.stdin.closed else None
        if stream is None:
            raise UserError("standard input: traceback: standard input is closed: nothing to read (pass a file)")
        raw = stream
        handle = None
    else:
        inputs.check_file(path, what)
        try:
            raw = handle = open(path, "rb")  # noqa: SIM115 -- closed by the caller, after the stream is read
        except OSError as error:
            raise UserError(f"{path}: {what}: cannot read: {error.strerror or error}") from None
    head = _read(raw, _SNIFF, path, what)
    kind = _kind(head)
    if kind == "gzip":
        return _inflated(head, raw, path, what), ["the log is gzip-compressed: read decompressed"], handle
    if kind is not None:
        return _decoded(head, raw, kind, path, what), [f"the log is {kind}: read decoded"], handle
    return _plain(head, raw, path, what), [], handle


def _read(raw: BinaryIO, size: int, path: str, what: str) -> bytes:
    try:
        return raw.read(size)
    except OSError as error:
        raise UserError(f"{path}: {what}: cannot read: {error.strerror or error}") from None


def _kind(head: bytes) -> str | None:
    """'gzip', 'UTF-16 LE', 'UTF-16 BE' or None (read as it is)."""
    if head.startswith(_GZIP):
        return "gzip"
    if head.startswith(codecs.BOM_UTF16_LE):
        return "UTF-16 LE"
    if head.startswith(codecs.BOM_UTF16_BE):
        return "UTF-16 BE"
    pairs = len(head) // 2
    if pairs >= 8:  # ASCII text in UTF-16: a NUL in every odd (LE) or even (BE) place
        if head[1 : 2 * pairs : 2].count(0) == pairs and head[0 : 2 * pairs : 2].count(0) == 0:
            return "UTF-16 LE"
        if head[0 : 2 * pairs : 2].count(0) == pairs and head[1 : 2 * pairs : 2].count(0) == 0:
            return "UTF-16 BE"
    return None


def _plain(head: bytes, raw: BinaryIO, path: str, what: str) -> Iterator[bytes]:
    yield head
    while chunk := _read(raw, CHUNK, path, what):
        yield chunk


def _inflated(head: bytes, raw: BinaryIO, path: str, what: str) -> Iterator[bytes]:
    """The decompressed bytes of a gzip stream (several members too), at most MAX_INFLATED of them."""
    inflater, total = zlib.decompressobj(16 + zlib.MAX_WBITS), 0
    for chunk in _plain(head, raw, path, what):
        while chunk:
            try:
                out = inflater.decompress(chunk, CHUNK)
            except zlib.error as error:
                raise UserError(f"{path}: {what}: gzip-compressed, but not readable as gzip: {error}") from None
            total += len(out)
            if total > MAX_INFLATED:
                raise UserError(f"{path}: {what}: gzip-compressed to over {MAX_INFLATED >> 30} GiB: not read")
            yield out
            chunk = inflater.unconsumed_tail
            if inflater.eof:  # the next member, if any
                chunk, inflater = inflater.unused_data + chunk, zlib.decompressobj(16 + zlib.MAX_WBITS)
                if not chunk.startswith(_GZIP):
                    return


def _decoded(head: bytes, raw: BinaryIO, kind: str, path: str, what: str) -> Iterator[bytes]:
    """UTF-16 re-encoded as UTF-8, chunk by chunk (a character split between chunks is kept for the next)."""
    encoding = "utf-16-le" if kind.endswith("LE") else "utf-16-be"
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    for chunk in _plain(head, raw, path, what):
        yield decoder.decode(chunk).lstrip("\ufeff").encode("utf-8")
    yield decoder.decode(b"", final=True).encode("utf-8")
