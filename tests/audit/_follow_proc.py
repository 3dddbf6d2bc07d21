"""A Merkle follower in its own process (killed with SIGKILL by the tests)."""

from __future__ import annotations

import sys

from charter.audit.tree import MerkleLog
from charter.ledger import Journal

if __name__ == "__main__":
    with Journal.open(sys.argv[1]) as journal:
        log = MerkleLog(journal)
        print("ready", flush=True)
        while True:
            log.catch_up(chunk=int(sys.argv[2]))
