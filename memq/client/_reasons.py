"""Network failures in words a user can act on ("connection refused"), not library reprs."""

from __future__ import annotations

import os
import urllib.error

import aiohttp


def reason(e: BaseException) -> str:
    """The cause of a failed network call, in words: the OS error's text when there is one."""
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException):
        return reason(e.reason)
    if isinstance(e, aiohttp.ClientConnectorError):
        return reason(e.os_error)
    if isinstance(e, aiohttp.ClientResponseError):
        return f"HTTP {e.status} {e.message}"
    if isinstance(e, OSError) and (e.errno or e.strerror):
        text = os.strerror(e.errno) if e.errno else str(e.strerror)   # asyncio's strerror is an address
        return text[:1].lower() + text[1:]
    return str(e) or type(e).__name__
