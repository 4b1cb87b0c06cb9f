"""What the controller remembers of earlier syncs, to make the next one a single trip.

For each (sources, destination) it keeps, per node, the manifest hash last confirmed
there and the node's filesystem id, plus the manifests those hashes name. The next sync
sends a node only the difference from that manifest, with the hash it expects to find:
the node applies it if its tree is exactly that (one round trip, the common case), or
answers with what it has, and the sync goes the long way. A wrong memory costs time,
never correctness.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpuaccel.jsonsource import loads
from cpuaccel.node.tree import Entry

KEEP_MANIFESTS = 4  # manifests kept per (sources, destination): nodes lag a few syncs at most


def _folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cpuaccel" / "sync"


class SyncMemory:
    def __init__(self, sources: Sequence[str], dest_template: str) -> None:
        key = json.dumps([[os.path.abspath(s) for s in sources], dest_template])
        self.path = _folder() / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")
        self.nodes: dict[str, dict[str, Any]] = {}
        self.manifests: dict[str, dict[str, Entry]] = {}
        try:
            data = loads(self.path.read_text())
            # Only well-formed records: last() must never meet something else.
            self.nodes = {
                k: v
                for k, v in dict(data["nodes"]).items()
                if isinstance(v, dict) and isinstance(v.get("hash"), str)
            }
            self.manifests = {
                h: {rel: tuple(e) for rel, e in entries.items()}
                for h, entries in data["manifests"].items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.nodes, self.manifests = {}, {}  # no memory, or an unreadable one: the long way

    @staticmethod
    def node_key(name: str, address: str, port: int, dest: str) -> str:
        return f"{name} {address}:{port} {dest}"

    def last(self, node: str) -> tuple[str, str, dict[str, Entry]] | None:
        """(hash, fsid, manifest) last confirmed on the node, if remembered in full."""
        seen = self.nodes.get(node)
        if not seen or seen.get("hash") not in self.manifests or not seen.get("fsid"):
            return None
        return seen["hash"], seen["fsid"], self.manifests[seen["hash"]]

    def confirm(self, node: str, digest: str, fsid: str | None, entries: dict[str, Entry]) -> None:
        if fsid is None:
            self.nodes.pop(node, None)
            return
        self.nodes[node] = {"hash": digest, "fsid": fsid}
        self.manifests[digest] = entries

    def forget(self, node: str) -> None:
        self.nodes.pop(node, None)

    def save(self) -> None:
        used = {n["hash"] for n in self.nodes.values()}
        self.manifests = {h: m for h, m in self.manifests.items() if h in used}
        if len(self.manifests) > KEEP_MANIFESTS:
            return  # nodes spread over many versions: not worth remembering
        tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # A new file of random name (O_EXCL): never one placed there, nor a link's target.
            with tempfile.NamedTemporaryFile(
                "w", dir=self.path.parent, prefix=self.path.name, delete=False
            ) as f:
                tmp = f.name
                f.write(json.dumps({"nodes": self.nodes, "manifests": self.manifests}))
            os.replace(tmp, self.path)
        except OSError:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            # a memory that cannot be written only costs time
