#!/usr/bin/env bash
# Carry an encoder folder larger than one device call can take (64 MiB) in several calls.
#
#   bash scripts/carry_parts.sh split .enc/mpnet .enc/mp     # here: .enc/mp1 .. .enc/mpN
#   # device call i (i = 1..N), each within 30 s of the last so the machine stays warm:
#   #   carry [".enc/mp<i>"], command: mkdir -p /tmp/mp && cp .enc/mp<i>/* /tmp/mp/
#   bash scripts/carry_parts.sh join /tmp/mp /tmp/mpnet      # there, in the last call
#
# split cuts model.safetensors into parts of PART_SIZE (default 52M, which leaves room for
# the working tree and the data in the same call) and puts one part in each folder; the last
# folder also holds the small files and a SHA256SUMS of the whole weights. join concatenates
# the parts, checks the checksum and only then moves the folder into place.
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
[ $# -eq 3 ] || die "usage: carry_parts.sh split SRC_FOLDER DEST_PREFIX | join PARTS_FOLDER DEST"
cmd=$1 src=$2 dst=$3
case "$cmd" in
split)
  [ -f "$src/model.safetensors" ] || die "$src/model.safetensors not found; export the encoder first (scripts/export_encoder_fp16.py)"
  compgen -G "$dst[0-9]*" >/dev/null && die "$dst<N> folders exist; remove them or choose another prefix"
  tmp=$(mktemp -d "${dst}.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  split -b "${PART_SIZE:-52M}" -d -a 2 "$src/model.safetensors" "$tmp/model.safetensors.part"
  parts=("$tmp"/model.safetensors.part*)
  n=${#parts[@]}
  for i in $(seq 1 "$n"); do
    mkdir "$tmp/$i"
    mv "${parts[$((i - 1))]}" "$tmp/$i/"
  done
  find "$src" -maxdepth 1 -type f ! -name model.safetensors -exec cp {} "$tmp/$n/" \;
  (cd "$src" && sha256sum model.safetensors) >"$tmp/$n/SHA256SUMS"
  for i in $(seq 1 "$n"); do mv "$tmp/$i" "$dst$i"; done
  du -sh "$dst"[0-9]*
  ;;
join)
  compgen -G "$src/model.safetensors.part*" >/dev/null || die "no model.safetensors.part* in $src; copy every part there first"
  [ -f "$src/SHA256SUMS" ] || die "$src/SHA256SUMS missing; copy the last part's folder there too"
  [ -e "$dst" ] && die "$dst exists; remove it or choose another destination"
  tmp=$(mktemp -d "${dst}.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cat "$src"/model.safetensors.part* >"$tmp/model.safetensors"
  find "$src" -maxdepth 1 -type f ! -name 'model.safetensors.part*' ! -name SHA256SUMS \
    -exec cp {} "$tmp/" \;
  (cd "$tmp" && sha256sum --quiet -c "$(cd "$src" && pwd)/SHA256SUMS" >/dev/null 2>&1) ||
    die "the joined weights do not match SHA256SUMS; a part is missing or damaged, copy the parts again"
  mv "$tmp" "$dst"
  trap - EXIT
  echo "$dst: $(du -sh "$dst" | cut -f1)"
  ;;
*) die "unknown command $cmd; use split or join" ;;
esac
