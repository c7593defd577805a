"""Shared pytest set-up: make the checkout importable as the collection
``ansible_collections.gpufleet.sglang`` and expose the simulator paths."""
from __future__ import annotations

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / ".collections"
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"


def _ensure_collection_link() -> None:
    link = COLLECTIONS / "ansible_collections" / "gpufleet" / "sglang"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(pathlib.Path("..", "..", ".."))


_ensure_collection_link()
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))

# Install Ansible's collection loader so that the checkout imports as
# ansible_collections.gpufleet.sglang, the way ansible-test units does.
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder  # noqa: E402 - after the .collections link is made

_AnsibleCollectionFinder(paths=[str(COLLECTIONS)])._install()

if str(SIM_PY) not in sys.path:
    sys.path.insert(0, str(SIM_PY))
