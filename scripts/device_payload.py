"""Files across a remote GPU machine's limits: one command carries at most 64 MiB (the working tree included) and brings back
at most 8 files of 16 MiB. So a large file travels in parts, each with the digest of the whole, and is joined and
checked on the other side; and before a call, `size` says what the call would carry.

    python -m scripts.device_payload split FILE DIR --part-mib 30   # DIR/NAME.part00, .part01, ... + NAME.parts.json
    python -m scripts.device_payload join DIR OUT                    # the parts of DIR joined into OUT, digest checked
    python -m scripts.device_payload size [CARRIED ...]              # MiB the working tree and carried paths make
    python -m scripts.device_payload hold assets/smollm2-ngram3.npz   # tracked files kept out of the next calls
    python -m scripts.device_payload release                          # ... and back in the tree as committed

The working tree travels with every call (56 MiB of it is two files in assets/), so a call that carries a large
file first holds tracked files it does not need: `hold` takes them out of git's index (the files stay on disk)
and ignores them, so no call carries them; `release` puts them back in the index as committed. Never commit
while something is held: the commit would delete it. `git status` shows a held file as deleted.

A folder is split too (its files, in order, as one stream in parts): `split assets/smollm2-dart-head $OUT/head`,
and `join` gives the folder back. `comes_back(OUT)` says what of a folder would not come back from a call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

LIMIT_MIB = 64           # what one call carries, the working tree included
BACK_FILE_MIB = 16       # the largest file a call brings back
MANIFEST = "parts.json"


class PayloadError(ValueError):
    """A part missing or damaged, or a file that does not fit: the message says which."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split(source: Path, out: Path, part_mib: float) -> dict:
    """Write `source` (a file, or a folder's files one after another) into `out` as parts of at most part_mib MiB
    (a part may hold the end of one file and the start of the next: the fewest files come back); returns the
    manifest written beside them."""
    size = int(part_mib * 2**20)
    if size < 1:
        raise PayloadError(f"--part-mib must be positive, got {part_mib}")
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    if not files:
        raise PayloadError(f"{source}: nothing to split")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"name": source.name, "folder": source.is_dir(), "files": [], "parts": []}
    stream, offset = [], 0
    for path in files:
        data = path.read_bytes()
        relative = path.name if path == source else str(path.relative_to(source))
        manifest["files"].append({"path": relative, "offset": offset, "bytes": len(data), "sha256": _digest(data)})
        stream.append(data)
        offset += len(data)
    whole = b"".join(stream)
    for n, start in enumerate(range(0, max(len(whole), 1), size)):
        name = f"part{n:02d}"
        (out / name).write_bytes(whole[start: start + size])
        manifest["parts"].append(name)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def join(parts: Path, out: Path) -> Path:
    """The file (or folder) that `split` wrote into `parts`, rebuilt at `out` and checked against its digests."""
    try:
        manifest = json.loads((parts / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise PayloadError(f"{parts}: no readable {MANIFEST} ({exc})") from None
    missing = [p for p in manifest["parts"] if not (parts / p).is_file()]
    if missing:
        raise PayloadError(f"{parts}: lacks {', '.join(missing)} (not carried yet?)")
    whole = b"".join((parts / p).read_bytes() for p in manifest["parts"])
    for entry in manifest["files"]:
        data = whole[entry["offset"]: entry["offset"] + entry["bytes"]]
        if len(data) != entry["bytes"] or _digest(data) != entry["sha256"]:
            raise PayloadError(f"{parts}: {entry['path']} joined to {len(data)} bytes that do not match its digest")
        target = out / entry["path"] if manifest["folder"] else out
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return out


BACK_FILES, BACK_TOTAL_MIB = 8, 64   # what one call brings back: files, and MiB together


def comes_back(out: Path) -> list[str]:
    """What of the folder `out` (a call's $OUT) would not come back from the device: too many files, a file too large,
    too much together, or a file more than two folders down. Empty when all of it comes back."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    mib = {p: p.stat().st_size / 2**20 for p in files}
    problems = [f"{len(files)} files (at most {BACK_FILES} come back)"] if len(files) > BACK_FILES else []
    problems += [f"{p.relative_to(out)}: {m:.1f} MiB (at most {BACK_FILE_MIB})" for p, m in mib.items()
                 if m > BACK_FILE_MIB]
    problems += [f"{p.relative_to(out)}: too deep" for p in files if len(p.relative_to(out).parts) > 3]
    if sum(mib.values()) > BACK_TOTAL_MIB:
        problems.append(f"{sum(mib.values()):.1f} MiB in all (at most {BACK_TOTAL_MIB})")
    return problems


HOLD_RECORD = "device-hold.json"      # in .git/: what is held


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def hold(root: Path, paths: list[str]) -> list[str]:
    """Take tracked `paths` out of the index (kept on disk) and ignore them; returns every path now held."""
    git_dir = Path(_git(root, "rev-parse", "--absolute-git-dir").strip())
    record = git_dir / HOLD_RECORD
    held = json.loads(record.read_text()) if record.is_file() else []
    for path in paths:
        if not _git(root, "ls-files", "--", path).strip():
            raise PayloadError(f"{path}: not tracked (only tracked files are held; an ignored one never travels)")
        _git(root, "rm", "-r", "-q", "--cached", "--", path)
        exclude = git_dir / "info" / "exclude"
        exclude.parent.mkdir(exist_ok=True)
        with open(exclude, "a") as fh:
            fh.write(f"/{path.strip('/')}\n")
        held.append(path)
    record.write_text(json.dumps(held))
    return held


def release(root: Path) -> list[str]:
    """Put every held path back in the index as HEAD has it, and stop ignoring it; returns what was released."""
    git_dir = Path(_git(root, "rev-parse", "--absolute-git-dir").strip())
    record = git_dir / HOLD_RECORD
    held = json.loads(record.read_text()) if record.is_file() else []
    if held:
        _git(root, "reset", "-q", "HEAD", "--", *held)
        exclude = git_dir / "info" / "exclude"
        lines = exclude.read_text().splitlines() if exclude.is_file() else []
        gone = {f"/{p.strip('/')}" for p in held}
        exclude.write_text("".join(f"{line}\n" for line in lines if line not in gone))
    record.unlink(missing_ok=True)
    return held


def travelling_bytes(root: Path, carried: list[str]) -> dict[str, int]:
    """Bytes a remote command would carry: the working tree (tracked files present on disk and untracked files git
    does not ignore) and each carried path."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    tree = sum((root / p).stat().st_size for p in set(listed) if p and (root / p).is_file())
    sizes = {"working tree": tree}
    for c in carried:
        path = root / c
        sizes[c] = path.stat().st_size if path.is_file() else sum(
            p.stat().st_size for p in path.rglob("*") if p.is_file())
    return sizes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("split")
    s.add_argument("source")
    s.add_argument("out")
    s.add_argument("--part-mib", type=float, default=BACK_FILE_MIB - 1)
    j = sub.add_parser("join")
    j.add_argument("parts")
    j.add_argument("out")
    z = sub.add_parser("size")
    z.add_argument("carried", nargs="*")
    h = sub.add_parser("hold")
    h.add_argument("paths", nargs="+")
    sub.add_parser("release")
    args = p.parse_args(argv)
    try:
        if args.action == "split":
            m = split(Path(args.source), Path(args.out), args.part_mib)
            print(f"{args.source}: {len(m['parts'])} parts in {args.out}")
        elif args.action == "join":
            print(f"joined {join(Path(args.parts), Path(args.out))}")
        elif args.action == "hold":
            print(f"held (out of the next calls; `release` before any commit): {', '.join(hold(Path.cwd(), args.paths))}")
        elif args.action == "release":
            print(f"released: {', '.join(release(Path.cwd())) or 'nothing was held'}")
        else:
            sizes = travelling_bytes(Path.cwd(), args.carried)
            total = sum(sizes.values()) / 2**20
            for what, n in sizes.items():
                print(f"{n / 2**20:8.1f} MiB  {what}")
            print(f"{total:8.1f} MiB  in all, of {LIMIT_MIB}: {'fits' if total <= LIMIT_MIB else 'TOO LARGE'}")
            return 0 if total <= LIMIT_MIB else 1
    except subprocess.CalledProcessError as exc:
        print(f"error: git {' '.join(exc.cmd[1:])}: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    except (PayloadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
