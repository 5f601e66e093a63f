#!/usr/bin/env bash
# scripts/gpu-carry.sh [--here]: pack what the GPU window needs into the ignored folder .gpu-carry/.
#
# Runs on the CPU machine (network to PyPI). The GPU machine has no network, and its image has Python 3.12,
# cupy-cuda13x, numpy, mpi4py, pytest, pytest-timeout and hypothesis but no MPI library, no pytest-mpi and
# no CUDA-aware MPI. This script writes:
#   .gpu-carry/wheels/            cp312 manylinux wheels: the mpich wheel (libmpi.so.12 + hydra mpiexec) and the
#                                 test wheels with all their pure-Python needs, pinned, one version of each
#   .gpu-carry/wheels/fallback/   mpi4py (ABI-portable cp312 wheel), installed there only if the image's mpi4py
#                                 is older than 4 or not the ABI-portable build (scripts/gpu-window.sh checks)
#   .gpu-carry/openmpi-cuda/      the CUDA-aware Open MPI 4.1.4 tarball (shared/gpu/README.md), unpacked there
#   .gpu-carry/MANIFEST.txt       every file with its size and sha256, and the total
# mpicomm itself is not packed: the device tool sends the working tree, and gpu-window.sh puts the repo root
# on the venvs' path. The script is idempotent (the wheels are fetched again only when the pins change), adds
# /.gpu-carry/ to .git/info/exclude, prints the total and fails above GPU_CARRY_LIMIT_MIB (default 60).
#
#   --here   fetch the same pins for this machine's own interpreter instead, into /tmp/gpu-carry-here
#            (or GPU_CARRY_DIR), to try scripts/gpu-window.sh's offline install on the CPU machine:
#              scripts/gpu-carry.sh --here
#              GPU_CARRY_DIR=/tmp/gpu-carry-here OUT=/tmp/gpuout scripts/gpu-window.sh setup
#
# Environment: PYTHON (python3), GPU_CARRY_DIR, GPU_CARRY_LIMIT_MIB, OMPI_CUDA_TARBALL (the tarball; default:
# the first of shared/gpu/, ../shared/gpu/ and /work/shared/gpu/ that has it), GPU_CARRY_PINS, GPU_CARRY_FALLBACK.
set -euo pipefail

here=0
case "${1:-}" in
  --here) here=1 ;;
  "") ;;
  -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--here]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
LIMIT_MIB=${GPU_CARRY_LIMIT_MIB:-60}
if [ "$here" = 1 ]; then
  CARRY=${GPU_CARRY_DIR:-/tmp/gpu-carry-here}
else
  CARRY=${GPU_CARRY_DIR:-$REPO/.gpu-carry}
fi

# The versions the CPU test environment (.venv) runs, so that both machines run the same test tools.
# pytest 9.2 needs iniconfig, packaging, pluggy and pygments on 3.12 (exceptiongroup and tomli only below
# 3.11); hypothesis needs sortedcontainers; pytest-mpi and pytest-timeout need pytest. Checked below.
PINS=${GPU_CARRY_PINS:-"mpich==5.0.2 pytest==9.2.0 pytest-mpi==0.6 pytest-timeout==2.4.0 hypothesis==6.170.15
iniconfig==2.3.1 pluggy==1.7.0 packaging==26.3 pygments==2.21.0 sortedcontainers==2.4.0"}
FALLBACK=${GPU_CARRY_FALLBACK:-"mpi4py==4.1.2"}
read -r -a pins <<<"$(echo "$PINS" | tr '\n' ' ')"
read -r -a fallback <<<"$(echo "$FALLBACK" | tr '\n' ' ')"

if [ "$here" = 1 ]; then
  target=(--only-binary=:all:)
  target_text="this interpreter: $("$PYTHON" -c 'import sys; print(sys.implementation.name, sys.version.split()[0])')"
else
  target=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
  target_text="cp312 manylinux x86_64 (the GPU image)"
fi

mkdir -p "$CARRY"

# ---- git: keep the folder out of commits (.git/info/exclude, not .gitignore) --------------------------------
if [ "$here" = 0 ] && git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
  exclude=$(git -C "$REPO" rev-parse --git-path info/exclude)
  case "$exclude" in /*) ;; *) exclude=$REPO/$exclude ;; esac
  mkdir -p "$(dirname "$exclude")"
  if ! grep -qxF '/.gpu-carry/' "$exclude" 2>/dev/null; then
    echo '/.gpu-carry/' >>"$exclude"
    echo "added /.gpu-carry/ to $exclude"
  fi
  if [ "$CARRY" = "$REPO/.gpu-carry" ] && ! git -C "$REPO" check-ignore -q .gpu-carry/; then
    echo "error: .gpu-carry/ is not ignored by git; it would travel as part of the working tree" >&2
    exit 1
  fi
fi

# ---- wheels: fetched again only when the pins or the target change ------------------------------------------
stamp_text=$(printf '%s\n' "target: $target_text" "pins: ${pins[*]}" "fallback: ${fallback[*]}")
wheels=$CARRY/wheels
if [ -f "$wheels/.pins" ] && [ "$(cat "$wheels/.pins")" = "$stamp_text" ]; then
  echo "wheels: up to date ($wheels)"
else
  echo "wheels: fetching ${#pins[@]} + ${#fallback[@]} pinned wheels for $target_text"
  tmp=$CARRY/wheels.tmp
  rm -rf "$tmp"
  mkdir -p "$tmp/fallback"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps "${target[@]}" -d "$tmp" "${pins[@]}"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps "${target[@]}" -d "$tmp/fallback" \
    "${fallback[@]}"
  printf '%s\n' "$stamp_text" >"$tmp/.pins"
  rm -rf "$wheels"
  mv "$tmp" "$wheels"
fi

# Every pin has exactly one wheel, and every Requires-Dist of a wheel (evaluated for the target Python on
# Linux, extras left out) is met by a carried wheel or by a package the GPU image already has.
"$PYTHON" - "$wheels" "$here" "${pins[@]}" "${fallback[@]}" <<'PY'
import email.parser
import pathlib
import platform
import sys
import zipfile

from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

folder, here, pins = pathlib.Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
# KINDS.md's list for the GPU image (the ones that matter here); carried wheels shadow them in the venvs.
image = {"numpy", "cupy-cuda13x", "mpi4py", "pytest", "pytest-timeout", "hypothesis", "iniconfig", "pluggy",
         "packaging", "pygments", "sortedcontainers", "attrs", "typing-extensions"}
env = default_environment()
if not here:
    env.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
               platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix")
wheels = sorted(folder.glob("*.whl")) + sorted(folder.glob("fallback/*.whl"))
have, problems = {}, []
for w in wheels:
    have.setdefault(canonicalize_name(w.name.split("-")[0]), []).append(w)
for pin in pins:
    name = canonicalize_name(Requirement(pin).name)
    if len(have.get(name, [])) != 1:
        problems.append(f"{pin}: {len(have.get(name, []))} wheels, expected 1")
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    for text in meta.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in have:
            version = have[name][0].name.split("-")[1]
            if not req.specifier.contains(version, prereleases=True):
                problems.append(f"{w.name}: needs {text}; carried {version}")
        elif name not in image:
            problems.append(f"{w.name}: needs {text}; neither carried nor in the GPU image")
if problems:
    print("wheels: dependency check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"wheels: {len(wheels)} wheels, one per pin, every Requires-Dist met")
PY

# ---- the CUDA-aware Open MPI -------------------------------------------------------------------------------
tarball=${OMPI_CUDA_TARBALL:-}
if [ -z "$tarball" ]; then
  for candidate in "$REPO/shared/gpu" "$REPO/../shared/gpu" /work/shared/gpu; do
    if [ -f "$candidate/openmpi-4.1.4-cuda.tar.xz" ]; then
      tarball=$(readlink -f "$candidate/openmpi-4.1.4-cuda.tar.xz")
      break
    fi
  done
fi
if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
  echo "error: openmpi-4.1.4-cuda.tar.xz not found; set OMPI_CUDA_TARBALL" >&2
  exit 1
fi
ompi=$CARRY/openmpi-cuda
mkdir -p "$ompi"
dest=$ompi/$(basename "$tarball")
if cmp -s "$tarball" "$dest"; then
  echo "openmpi-cuda: up to date ($dest)"
else
  tar tJf "$tarball" | grep '/lib/libmpi\.so\.40$' >/dev/null || {  # not -q: tar would get SIGPIPE
    echo "error: $tarball holds no lib/libmpi.so.40" >&2
    exit 1
  }
  cp "$tarball" "$dest.tmp"
  mv "$dest.tmp" "$dest"
  echo "openmpi-cuda: copied $tarball"
fi
find "$ompi" -maxdepth 1 -type f ! -name "$(basename "$dest")" -delete

# ---- manifest and size --------------------------------------------------------------------------------------
manifest=$CARRY/MANIFEST.txt
{
  echo "# .gpu-carry for scripts/gpu-window.sh; written by scripts/gpu-carry.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# wheels for: $target_text"
  echo "# pins: ${pins[*]}"
  echo "# fallback (installed only if the image's mpi4py is < 4 or not the ABI-portable wheel): ${fallback[*]}"
  echo "# Open MPI from: $tarball"
  echo "# bytes  sha256  path"
  (cd "$CARRY" && find . -type f ! -name 'MANIFEST.txt*' ! -name '.pins' -printf '%P\n' | LC_ALL=C sort |
    while read -r f; do
      printf '%10d  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-64)" "$f"
    done)
} >"$manifest.tmp"
listed=$(awk '!/^#/ {s += $1} END {print s + 0}' "$manifest.tmp")
awk -v b="$listed" 'BEGIN {printf "# total %d bytes (%.1f MiB) in the files above\n", b, b / 1048576}' \
  >>"$manifest.tmp"
mv "$manifest.tmp" "$manifest"

total=$(find "$CARRY" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
total_mib=$(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}')
cat "$manifest"
echo "total: $total bytes ($total_mib MiB) in $CARRY; limit $LIMIT_MIB MiB"
if [ "$here" = 0 ] && git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
  # What else travels on each device call: tracked and untracked, not ignored files (64 MiB with the carry).
  tree=$(cd "$REPO" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  awk -v b="$tree" 'BEGIN {printf "the working tree that travels beside it: %.1f MiB (the device tool\x27s limit: 64 MiB together)\n", b / 1048576}'
fi
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "error: $CARRY is over $LIMIT_MIB MiB" >&2
  exit 1
fi
