"""The request an outward call test makes: a POST to the counting server."""

from __future__ import annotations

import hashlib
import urllib.request

from charter.control.outward import OutwardReply


def digest_of(target: str, key: str) -> str:
    return hashlib.sha256(f"POST {target} {key}".encode()).hexdigest()


def post(target: str, key: str) -> OutwardReply:
    request = urllib.request.Request(target, data=key.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return OutwardReply(response.status, response.read())
