"""The manifest of a checkpoint: every file's size and the CRC-32 of each 64 MiB block, written last.

Ranks write ``manifest_rank_<r>.json`` for their data files (:class:`dlrm.checkpoint.writers.ManifestWriter`);
rank 0 merges them into ``manifest.json`` (:func:`write_manifest`). Before a resume or an export the ranks check
the files against it together (:func:`verify_checkpoint`).
"""

from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from dlrm.checkpoint.layout import MANIFEST, META

MANIFEST_FORMAT = "dlrm-checkpoint-manifest/1"
BLOCK = 64 * 2**20  # bytes per checksum block: blocks are verified in parallel, across ranks and threads


def _block_crcs(path: str, start: int = 0, stop: Optional[int] = None) -> List[int]:
    """crc32 of each ``BLOCK`` of ``path`` from block ``start`` to ``stop`` (zlib releases the GIL: threads run
    in parallel)."""
    out = []
    with open(path, "rb") as f:
        f.seek(start * BLOCK)
        i = start
        while stop is None or i < stop:
            data = f.read(BLOCK)
            if not data:
                break
            out.append(zlib.crc32(data))
            i += 1
    return out


def file_entry(path: str, threads: int = 1) -> Dict[str, Any]:
    """The manifest entry of one file: its size in bytes and the crc32 of each ``BLOCK``."""
    size = os.path.getsize(path)
    n = max(1, -(-size // BLOCK))
    if threads <= 1 or n == 1:
        return {"size": size, "crc32": _block_crcs(path)}
    with ThreadPoolExecutor(max_workers=threads) as pool:
        parts = pool.map(lambda i: _block_crcs(path, i, i + 1), range(n))
        return {"size": size, "crc32": [c for p in parts for c in p]}


def write_manifest(path: str) -> Dict[str, Any]:
    """Merge the ranks' ``manifest_rank_<r>.json`` (their data files) with entries for the small files (DCP's
    ``.metadata``, ``meta.json``, ``plan.json``, every ``rank_<r>.pt``) into ``manifest.json``, written last (to a
    temporary name, then renamed), and remove the parts. Returns the manifest."""
    files: Dict[str, Any] = {}
    for name in sorted(os.listdir(path)):
        if name.startswith("manifest_rank_") and name.endswith(".json"):
            with open(os.path.join(path, name), encoding="utf-8") as f:
                files.update(json.load(f))
    for name in sorted(os.listdir(path)):
        if name not in files and not name.startswith("manifest") and os.path.isfile(os.path.join(path, name)):
            files[name] = file_entry(os.path.join(path, name))
    manifest = {"format": MANIFEST_FORMAT, "block_bytes": BLOCK, "files": files}
    with open(os.path.join(path, MANIFEST + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(path, MANIFEST + ".tmp"), os.path.join(path, MANIFEST))
    for name in os.listdir(path):
        if name.startswith("manifest_rank_"):
            os.remove(os.path.join(path, name))
    return manifest


def rank_manifest_path(path: str, rank: int) -> str:
    return os.path.join(path, f"manifest_rank_{rank}.json")


def crc_threads() -> int:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(8, (os.cpu_count() or 1) // local))


def verify_checkpoint(path: str, rank: int = 0, world: int = 1, full: bool = True) -> Optional[str]:
    """Check this rank's share of a checkpoint's files against its manifest.

    Every rank checks that every file exists with its recorded size (cheap); the checksums are read by one rank
    per block, blocks dealt out over ``world`` ranks and a few threads each, so a job reads each byte once. With
    ``full=False`` only the sizes are checked.

    Returns:
        None when this rank's share is intact, or ``path`` is a bare DCP checkpoint (``.metadata`` without this
        trainer's ``meta.json``, e.g. a ``dcp.save`` of one's own), which has no manifest; else one line naming the
        file and what is wrong.
    """
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        if not os.path.isfile(os.path.join(path, META)):
            return None
        return f"{MANIFEST} is missing (every save writes one: the checkpoint was copied or written incompletely)"
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    try:  # a damaged manifest or a file that vanishes mid-check is a verdict, so every rank reaches the gather
        return _verify_files(path, files, rank, world, full)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} does not describe the files ({type(e).__name__}: {e})"


def _verify_files(path: str, files: Dict[str, Any], rank: int, world: int, full: bool) -> Optional[str]:
    for name, entry in sorted(files.items()):
        fpath = os.path.join(path, name)
        if not os.path.isfile(fpath):
            return f"{name} is missing"
        size = os.path.getsize(fpath)
        if size != entry["size"]:
            return f"{name} has {size:,} bytes where the manifest records {entry['size']:,}"
    if not full:
        return None
    blocks = [(name, i, crc) for name, entry in sorted(files.items()) for i, crc in enumerate(entry["crc32"])]
    mine = blocks[rank::world]

    def check(item: Tuple[str, int, int]) -> Optional[str]:
        name, i, crc = item
        got = _block_crcs(os.path.join(path, name), i, i + 1)
        if got != [crc]:
            return f"{name} differs from its manifest checksum at bytes {i * BLOCK:,}-{(i + 1) * BLOCK - 1:,}"
        return None

    with ThreadPoolExecutor(max_workers=crc_threads()) as pool:
        for err in pool.map(check, mine):
            if err is not None:
                return err
    return None
