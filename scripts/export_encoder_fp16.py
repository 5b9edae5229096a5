"""Save an fp16 copy of an encoder folder, small enough to carry to a GPU machine.

The copy holds the tokenizer, config.json and model.safetensors with every floating tensor in
float16 (half the bytes).
:meth:`model.encoder.sentence.SentenceEncoder.from_config` loads any folder
in float32, so the copy trains in fp32 as before; only the weights' last bits differ (fp16
rounding), so results on the copy are close to, not identical with, the original's.

Usage: python scripts/export_encoder_fp16.py SRC DST
    SRC: ``minilm``, ``mpnet`` or a Hugging Face model folder; DST: a new folder.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from model.encoder.files import quiet_transformers, resolve_encoder_path
from pipeline.errors import PipelineError, run_cli


def export(src: str, dst: Path) -> dict[str, float]:
    """Write the fp16 copy of ``src`` to ``dst`` (whole or not at all); sizes in MiB."""
    from transformers import AutoModel, AutoTokenizer

    path = Path(resolve_encoder_path(src))
    if not path.is_dir():
        raise PipelineError(f"{src} is not a local encoder folder; pass minilm, mpnet or a path")
    if dst.exists():
        raise PipelineError(f"{dst} exists; remove it or choose another destination")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        # add_pooling_layer=False: SentenceEncoder never uses the pooler, so do not carry it.
        model = AutoModel.from_pretrained(path, add_pooling_layer=False, dtype=torch.float16)
        tokenizer = AutoTokenizer.from_pretrained(path)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
        out = Path(tmp) / "encoder"
        with quiet_transformers():
            model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        for f in out.iterdir():
            f.chmod(0o644)  # readable by whoever runs the copy, like the original
        out.rename(dst)  # same file system: the folder appears whole or not at all
    size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    src_size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return {"src_mib": src_size / 2**20, "dst_mib": size / 2**20}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", help="minilm, mpnet or a Hugging Face model folder")
    parser.add_argument("dst", type=Path, help="new folder for the fp16 copy")
    args = parser.parse_args(argv)
    sizes = export(args.src, args.dst)
    print(f"{args.src}: {sizes['src_mib']:.1f} MiB -> {args.dst}: {sizes['dst_mib']:.1f} MiB "
          "(fp16)")


if __name__ == "__main__":
    run_cli(main)
