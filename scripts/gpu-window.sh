#!/usr/bin/env bash
# scripts/gpu-window.sh setup|test|bench|all: the GPU window, run ON the lent GPU machine from the repo root.
#
# The machine has no network, runs commands as root, and its image has Python 3.12 with cupy, numpy and mpi4py
# but no MPI library. Make the carry first on the CPU machine (scripts/gpu-carry.sh writes .gpu-carry/), then
# call the device tool with carry [".gpu-carry"] and the command `bash scripts/gpu-window.sh all`.
#
#   setup  the C extension built in place for the image's Python (optional; mpi4py makes the calls without it),
#          then two offline venvs over the image's packages (--system-site-packages, plus the image's own venv):
#            /tmp/venv-mpich  the mpich wheel (not CUDA-aware: mpicomm's staged path) + test wheels + mpicomm
#            /tmp/venv-ompi   the CUDA-aware Open MPI 4.1.4 unpacked in /tmp/ompi-cuda (OPAL_PREFIX, PATH,
#                             LD_LIBRARY_PATH, MPI4PY_LIBMPI) + test wheels + mpicomm: the direct path
#          then nvidia-smi, the versions each venv sees, `python -m mpicomm info` under each MPI (2 ranks),
#          and raw mpi4py on cupy buffers through the CUDA Open MPI (proves the MPI build, not mpicomm)
#   test   tests/gpu (marker gpu) at 2 and 4 ranks: staged (mpich) and direct (Open MPI), CUDA-awareness
#          decided automatically (MPICOMM_CUDA_AWARE unset; GPU_EXPECT_PATH makes a wrong decision fail);
#          tests/gpu/test_paths_gpu.py reruns the CPU checks of issue 24 (float16/bfloat16, 4K chunks,
#          layouts, subgroups, short receives, failing chunks, batches) on the GPU;
#          GPU_WINDOW_CPU_SUITE=1 adds tests/mpi at 2 ranks on mpich as a sanity check
#   bench  python -m mpicomm.bench --device cuda --json $OUT/bench-{staged,direct}.json at 2 ranks
#   all    setup, test, bench; every step runs even after a failure
# test and bench run setup first when its venvs are missing (a fresh machine).
#
# Every step has a `timeout`, cut so that the whole call ends within GPU_WINDOW_BUDGET_S (530 s: the device
# tool allows 600 s a command) while each later step keeps at least 30 s. What comes back ($OUT, at most 8 files):
#   setup.log test.log bench.log   each step's output, with a header per step
#   summary.json summary.txt       per step: status (PASS, FAIL, TIMEOUT, EMPTY = pytest ran no test), rc, seconds
#   bench-staged.json bench-direct.json
# Exit status: 0 when every step passed, else 1.
#
# Environment: OUT (default /tmp/gpu-window-out), GPU_PYTHON (python3: the image's, which holds cupy),
# GPU_CARRY_DIR (.gpu-carry), GPU_WINDOW_WORK (/tmp), GPU_WINDOW_BUDGET_S, GPU_TEST_NPS ("2 4"),
# GPU_PYTEST_TIMEOUT (120, per test), GPU_PYTEST_ARGS (extra pytest arguments), GPU_BENCH_MODULE
# (mpicomm.bench), GPU_BENCH_ARGS (extra bench arguments, e.g. "--sizes 4K,1M,64M"), GPU_WINDOW_CPU_SUITE (0).
# On the CPU machine, to try the offline install: scripts/gpu-carry.sh --here, then
#   GPU_CARRY_DIR=/tmp/gpu-carry-here OUT=/tmp/gpuout scripts/gpu-window.sh setup
set -uo pipefail

SELF=$(readlink -f "$0")
cd "$(dirname "$SELF")/.." || exit 1
REPO=$PWD
CARRY=${GPU_CARRY_DIR:-$REPO/.gpu-carry}
OUT=${OUT:-/tmp/gpu-window-out}
WORK=${GPU_WINDOW_WORK:-/tmp}
PY=${GPU_PYTHON:-python3}
OMPI_PREFIX=$WORK/ompi-cuda
LOGS=$WORK/gpu-window-logs
read -r -a NPS <<<"${GPU_TEST_NPS:-2 4}"
PYTEST_TIMEOUT=${GPU_PYTEST_TIMEOUT:-120}
BUDGET_S=${GPU_WINDOW_BUDGET_S:-530}
MIN_STEP_S=30
KILL_GRACE_S=10
BENCH_MODULE=${GPU_BENCH_MODULE:-mpicomm.bench}
CPU_SUITE=${GPU_WINDOW_CPU_SUITE:-0}

export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1

# ============================== steps (each runs in its own bash, under timeout) ==============================

# The versions and devices that one interpreter sees.
pyprobe() {
  "$1" - <<'PY'
import glob, importlib, os, sys
print(f"python {sys.version.split()[0]} at {sys.executable} (prefix {sys.prefix}, base {sys.base_prefix})")
for name in ("numpy", "cupy", "mpi4py", "pytest", "pytest_mpi", "pytest_timeout", "hypothesis", "mpicomm"):
    try:
        m = importlib.import_module(name)
        print(f"  {name:15} {getattr(m, '__version__', '?'):12} {os.path.dirname(m.__file__)}")
    except Exception as exc:
        print(f"  {name:15} MISSING ({type(exc).__name__}: {exc})")
try:
    import mpi4py
    d = os.path.dirname(mpi4py.__file__)
    print("  mpi4py extensions:", " ".join(sorted(os.path.basename(p) for p in glob.glob(d + "/MPI*.so"))))
except Exception:
    pass
try:
    import cupy
    rt = cupy.cuda.runtime
    n = rt.getDeviceCount()
    print(f"  cupy: {n} device(s), CUDA runtime {rt.runtimeGetVersion()}, driver {rt.driverGetVersion()}")
    for i in range(n):
        p = rt.getDeviceProperties(i)
        print(f"    device {i}: {p['name'].decode()}, {p['totalGlobalMem'] / 2**30:.1f} GiB")
except Exception as exc:
    print(f"  cupy: not usable ({type(exc).__name__}: {exc})")
PY
}

s_probe() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); repo: $REPO; carry: $CARRY; out: $OUT"
  uname -a
  echo "cores: $(nproc); memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  nvidia-smi -L || echo "nvidia-smi -L: failed (rc $?)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv ||
    echo "nvidia-smi --query-gpu: failed"
  echo "--- libraries (ldconfig): libmpi, libcuda, libcudart"
  ldconfig -p | grep -E 'libmpi|libcuda\.so|libcudart' || echo "  none"
  echo "--- launchers on PATH: $(command -v mpirun mpiexec ompi_info | tr '\n' ' ')"
  echo "--- shared memory and pinned-memory limit"
  df -h /dev/shm /tmp
  echo "ulimit -l: $(ulimit -l)"
  echo "--- $PY: $(command -v "$PY") -> $(readlink -f "$(command -v "$PY")")"
  pyprobe "$PY"
  "$PY" -m pip --version || echo "pip: missing in the image's python"
  # The C calls of the fast paths (mpicomm/core/_cmpi.c; no MPI headers needed), built in place for this
  # Python: both venvs use this interpreter and the working tree. Optional: without it mpicomm calls MPI
  # through mpi4py (`python -m mpicomm info` says which).
  echo "--- the C extension, built in place for $PY"
  if (cd "$REPO" && "$PY" setup.py -q build_ext --inplace >"$WORK/build-ext.log" 2>&1); then
    ls "$REPO"/mpicomm/core/_cmpi*.so
  else
    echo "not built (mpicomm falls back to mpi4py):"
    tail -5 "$WORK/build-ext.log"
  fi
  echo "--- carry"
  if [ -f "$CARRY/MANIFEST.txt" ]; then grep -v '^#' "$CARRY/MANIFEST.txt"; else echo "no $CARRY/MANIFEST.txt"; fi
  [ -d "$CARRY/wheels" ] && [ -d "$CARRY/openmpi-cuda" ]
}

s_venv() { # mpich | ompi
  local kind=$1 v=$WORK/venv-$1 sp
  local -a pip wheels=()
  if [ ! -d "$CARRY/wheels" ]; then
    echo "no $CARRY/wheels: run scripts/gpu-carry.sh on the CPU machine and carry .gpu-carry"
    return 1
  fi
  rm -rf "$v"
  "$PY" -m venv --without-pip --system-site-packages "$v" || return 1
  sp=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  # The image's python3 is itself a venv (/opt/torch/.venv), and --system-site-packages shows only its base
  # interpreter's packages: add every site dir the image's python3 sees, after the venv's own (so the carried
  # wheels shadow the image's versions while cupy, numpy and mpi4py come from the image).
  "$PY" - "$sp" <<'PY' || return 1
import os, sys
dirs = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]
with open(os.path.join(sys.argv[1], "_gpu_window_image.pth"), "w") as f:
    f.writelines(f"import site; site.addsitedir({d!r})\n" for d in dirs)
print("the image's site dirs, added after the venv's:", *dirs, sep="\n  ")
PY
  # mpicomm: the working tree itself (the device tool sends it), so tests and bench run what is checked out.
  echo "$REPO" >"$sp/_gpu_window_mpicomm.pth"

  pip=("$v/bin/python" -m pip)
  "${pip[@]}" --version >/dev/null 2>&1 || pip=("$PY" -m pip --python "$v/bin/python")
  for w in "$CARRY"/wheels/*.whl; do
    case "$(basename "$w")" in mpich-*) [ "$kind" = mpich ] || continue ;; esac
    wheels+=("$w")
  done
  echo "installing ${#wheels[@]} carried wheels into $v (offline, --no-deps)"
  "${pip[@]}" install -q --no-index --no-deps --ignore-installed --no-cache-dir --no-compile "${wheels[@]}" ||
    return 1
  if ! "$v/bin/python" - <<'PY'; then
import glob, os, sys
try:
    import mpi4py
except ImportError:
    print("mpi4py: not importable")
    sys.exit(1)
d = os.path.dirname(mpi4py.__file__)
abi = bool(glob.glob(d + "/MPI.mpich.*.so") and glob.glob(d + "/MPI.openmpi.*.so"))
print(f"mpi4py {mpi4py.__version__} at {d}; ABI-portable wheel (mpich and openmpi variants): {abi}")
sys.exit(0 if int(mpi4py.__version__.split(".")[0]) >= 4 and abi else 1)
PY
    echo "the image's mpi4py will not do here: installing the carried fallback"
    "${pip[@]}" install -q --no-index --no-deps --ignore-installed --no-cache-dir --no-compile \
      "$CARRY"/wheels/fallback/mpi4py-*.whl || return 1
  fi

  if [ "$kind" = mpich ]; then
    cat >"$v/gpu-env.sh" <<EOF
# written by scripts/gpu-window.sh: the MPICH wheel (not CUDA-aware; mpicomm stages device data)
export PATH="$v/bin:\$PATH"
export MPI4PY_LIBMPI="$v/lib/libmpi.so.12"
MPIEXEC="$v/bin/mpiexec"
MPIFLAGS=()
PYV="$v/bin/python"
EOF
  else
    rm -rf "$OMPI_PREFIX"
    mkdir -p "$OMPI_PREFIX"
    tar xJf "$CARRY"/openmpi-cuda/openmpi-4.1.4-cuda.tar.xz -C "$OMPI_PREFIX" --strip-components=1 || return 1
    cat >"$v/gpu-env.sh" <<EOF
# written by scripts/gpu-window.sh: Open MPI 4.1.4 built with CUDA (shared/gpu/README.md), relocated
export OPAL_PREFIX="$OMPI_PREFIX"
export PATH="$OMPI_PREFIX/bin:$v/bin:\$PATH"
export LD_LIBRARY_PATH="$OMPI_PREFIX/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export MPI4PY_LIBMPI="$OMPI_PREFIX/lib/libmpi.so.40"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIEXEC="$OMPI_PREFIX/bin/mpirun"
MPIFLAGS=(--oversubscribe --mca pml ob1 --mca btl self,vader,smcuda)
PYV="$v/bin/python"
EOF
    (
      # shellcheck source=/dev/null
      . "$v/gpu-env.sh"
      echo "--- ompi_info: CUDA"
      ompi_info --parsable --all 2>&1 | grep -E 'built_with_cuda_support:value|^mca:(btl:smcuda|coll:cuda):version:"component'
    ) || return 1
  fi
  echo "--- $v/gpu-env.sh"
  cat "$v/gpu-env.sh"
  echo "--- what $v/bin/python sees"
  pyprobe "$v/bin/python"
  "$v/bin/python" -c 'import mpicomm, pytest, pytest_mpi, pytest_timeout, hypothesis' || return 1
}

# use_path staged|direct: source the MPI's environment; MPICOMM_CUDA_AWARE stays unset (auto decides).
MPIEXEC=
MPIFLAGS=()
PYV=
use_path() {
  local kind aware
  case "$1" in
    staged) kind=mpich aware= ;;  # auto, decided once per process: the mpich wheel says staged
    direct) kind=ompi aware= ;;   # auto: the CUDA Open MPI says direct (tests/gpu checks it)
    mpich | ompi) kind=$1 aware= ;;
    *) echo "use_path: $1?"; return 2 ;;
  esac
  local env=$WORK/venv-$kind/gpu-env.sh
  if [ ! -f "$env" ]; then
    echo "$env is missing: the setup step venv-$kind failed or did not run"
    return 1
  fi
  # shellcheck source=/dev/null
  . "$env"
  if [ -n "$aware" ]; then export MPICOMM_CUDA_AWARE=$aware; else unset MPICOMM_CUDA_AWARE; fi
  # On a real GPU the automatic decision must be $1; in CPU emulation (no nvidia-smi, no driver) it is
  # staged under both MPIs, so nothing is expected there.
  if command -v nvidia-smi >/dev/null && { [ "$1" = staged ] || [ "$1" = direct ]; }; then
    export GPU_EXPECT_PATH=$1
  else
    unset GPU_EXPECT_PATH
  fi
  echo "path $1: MPI $kind, MPICOMM_CUDA_AWARE=${MPICOMM_CUDA_AWARE:-unset (auto)}; $MPIEXEC ${MPIFLAGS[*]}"
}

s_info() { # mpich | ompi (MPICOMM_CUDA_AWARE unset: shows what auto decides)
  use_path "$1" || return 1
  "$MPIEXEC" "${MPIFLAGS[@]}" -n 2 "$PYV" -m mpicomm info
}

s_smoke() { # raw mpi4py on cupy buffers through the CUDA Open MPI, 2 ranks: proves the MPI build
  use_path ompi || return 1
  local code
  # -c, not stdin: mpirun and mpiexec give stdin to rank 0 only.
  code=$(
    cat <<'PY'
import sys
import cupy as cp
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
ok = True
for count in (1, 1000, 1 << 22):  # 4 B to 16 MiB of float32: eager and CUDA IPC sizes
    x = cp.arange(count, dtype=cp.float32) + r
    y = cp.empty_like(x)
    b = cp.full(count, r + 7, dtype=cp.int32)
    s = cp.full(count, r, dtype=cp.int64)
    d = cp.empty_like(s)
    cp.cuda.get_current_stream().synchronize()  # mpi4py does not synchronise
    comm.Allreduce(x, y, op=MPI.SUM)
    comm.Bcast(b, root=0)
    comm.Sendrecv(s, (r + 1) % n, recvbuf=d, source=(r - 1) % n)
    ok &= bool(cp.allclose(y, cp.arange(count, dtype=cp.float32) * n + n * (n - 1) / 2))
    ok &= bool((b == 7).all()) and bool((d == (r - 1) % n).all())
lib = MPI.Get_library_version().splitlines()[0]
print(f"rank {r}/{n}: Allreduce, Bcast, Sendrecv on cupy buffers through {lib}: {'ok' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
  )
  "$MPIEXEC" "${MPIFLAGS[@]}" -n 2 "$PYV" -c "$code"
}

s_test() { # staged|direct NP
  use_path "$1" || return 1
  local -a extra=()
  read -r -a extra <<<"${GPU_PYTEST_ARGS:-}"
  # Plugins by name only: the image's own pytest plugins (xdist, cov, benchmark, jaxtyping, ...) stay out.
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
  "$MPIEXEC" "${MPIFLAGS[@]}" -n "$2" "$PYV" -m mpi4py -m pytest --with-mpi -m gpu tests/gpu -x \
    --timeout "$PYTEST_TIMEOUT" --timeout-method thread --color=no -p no:cacheprovider -ra \
    -p pytest_mpi -p pytest_timeout -p _hypothesis_pytestplugin "${extra[@]}"
}

s_demo() { # staged|direct: the GPU demo at 2 ranks (every call on cupy against numpy, with its path)
  use_path "$1" || return 1
  "$MPIEXEC" "${MPIFLAGS[@]}" -n 2 "$PYV" -m mpi4py -m mpicomm demo --device cuda
}

s_cpu() { # NP: tests/mpi on the mpich wheel, host path only
  use_path staged || return 1
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
  "$MPIEXEC" "${MPIFLAGS[@]}" -n "$1" "$PYV" -m mpi4py -m pytest --with-mpi tests/mpi -x -q \
    --timeout "$PYTEST_TIMEOUT" --timeout-method thread --color=no -p no:cacheprovider \
    -p pytest_mpi -p pytest_timeout -p _hypothesis_pytestplugin
}

s_bench() { # staged|direct, 2 ranks
  use_path "$1" || return 1
  local -a extra=()
  read -r -a extra <<<"${GPU_BENCH_ARGS:-}"
  local rc=0
  "$MPIEXEC" "${MPIFLAGS[@]}" -n 2 "$PYV" -m mpi4py -m "$BENCH_MODULE" --device cuda \
    --json "$OUT/bench-$1.json" "${extra[@]}" || rc=$?
  ls -l "$OUT/bench-$1.json" 2>/dev/null || echo "no $OUT/bench-$1.json written"
  return "$rc"
}

# ============================== the runner ==============================

declare -a RECORDS=() LINES=()
STEPS_LEFT=0
DEADLINE=0
FAILED=0
T_START=$SECONDS
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
COMMAND=${1:-}

json_str() { printf '%s' "$1" | tr -d '\042\134' | tr '\n\t' '  '; }  # drop quotes and backslashes

write_summary() {
  local ok=true gpu
  [ "$FAILED" -eq 0 ] || ok=false
  gpu=$(nvidia-smi -L 2>/dev/null | sed -n 1p)
  {
    printf '{\n  "script": "scripts/gpu-window.sh",\n  "command": "%s",\n  "started": "%s",\n' \
      "$(json_str "$COMMAND")" "$STARTED"
    printf '  "host": "%s",\n  "gpu": "%s",\n  "python": "%s",\n' \
      "$(json_str "$(uname -n)")" "$(json_str "${gpu:-none}")" "$(json_str "$(command -v "$PY")")"
    printf '  "budget_s": %s,\n  "elapsed_s": %s,\n  "ok": %s,\n  "steps": [\n' \
      "$BUDGET_S" "$((SECONDS - T_START))" "$ok"
    local i
    for i in "${!RECORDS[@]}"; do
      [ "$i" -eq 0 ] || printf ',\n'
      printf '    %s' "${RECORDS[$i]}"
    done
    printf '\n  ]\n}\n'
  } >"$OUT/summary.json.tmp" && mv "$OUT/summary.json.tmp" "$OUT/summary.json"
  printf '%s\n' "${LINES[@]}" >"$OUT/summary.txt"
}

# step PHASE NAME WANT_S FUNCTION [ARGS...]: run FUNCTION in a new bash under timeout, log it, record it.
step() {
  local phase=$1 name=$2 want=$3
  shift 3
  STEPS_LEFT=$((STEPS_LEFT - 1))
  local t=$want left=$((DEADLINE - SECONDS - STEPS_LEFT * MIN_STEP_S - KILL_GRACE_S))
  [ "$left" -ge "$t" ] || t=$left
  [ "$t" -ge "$MIN_STEP_S" ] || t=$MIN_STEP_S
  local log=$LOGS/$name.log t0=${EPOCHREALTIME:-$SECONDS} rc secs status pytest=""
  printf '\n===== %s  %s  (timeout %ss): %s =====\n' "$(date +%T)" "$name" "$t" "$*" >>"$OUT/$phase.log"
  printf -- '-- %-18s timeout %3ss ... ' "$name" "$t"
  timeout -k "$KILL_GRACE_S" "$t" bash "$SELF" _do "$@" </dev/null 2>&1 | tee "$log" >>"$OUT/$phase.log"
  rc=${PIPESTATUS[0]}
  secs=$(awk -v a="$t0" -v b="${EPOCHREALTIME:-$SECONDS}" 'BEGIN {printf "%.1f", b - a}')
  case "$rc" in
    0) status=PASS ;;
    124 | 137) status=TIMEOUT ;;
    *) status=FAIL ;;
  esac
  if [ "$1" = s_test ] || [ "$1" = s_cpu ]; then
    # pytest's closing lines, one per rank (the same on every rank when all went well)
    pytest=$(grep -aE '^(=+ )?(no tests ran|[0-9]+ [a-z]+)[^=]* in [0-9.]+s( \([0-9:]+\))?( =+)?$' "$log" |
      sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s( \([0-9:]+\))?$//' | sort | uniq -c |
      sed -E 's/^ *([0-9]+) /\1 rank(s): /' | paste -sd ';' -)
    if [ "$rc" = 5 ] || { [ "$rc" = 0 ] && ! echo "$pytest" | grep -qE '[0-9]+ passed'; }; then
      status=EMPTY
    fi
  fi
  [ "$status" = PASS ] || FAILED=$((FAILED + 1))
  printf '%s rc=%s %ss\n' "$status" "$rc" "$secs"
  if [ "$status" != PASS ]; then
    echo "   last lines of $name (whole log in \$OUT/$phase.log):"
    tail -n 15 "$log" | sed 's/^/   | /'
  fi
  printf '===== %s: %s rc=%s %ss =====\n' "$name" "$status" "$rc" "$secs" >>"$OUT/$phase.log"
  RECORDS+=("$(printf '{"phase": "%s", "name": "%s", "status": "%s", "rc": %s, "seconds": %s, "timeout_s": %s, "pytest": "%s"}' \
    "$phase" "$name" "$status" "$rc" "$secs" "$t" "$(json_str "$pytest")")")
  LINES+=("$(printf '%-7s %-18s rc=%-3s %7ss  (timeout %ss)  %s' "$status" "$name" "$rc" "$secs" "$t" "$pytest")")
  write_summary
}

n_setup=6
n_test=$((2 * ${#NPS[@]} + 2 + (CPU_SUITE == 1 ? 1 : 0)))
n_bench=2

phase_setup() {
  step setup probe 60 s_probe
  step setup venv-mpich 120 s_venv mpich
  step setup venv-ompi 120 s_venv ompi
  step setup info-mpich 60 s_info mpich
  step setup info-ompi 60 s_info ompi
  step setup smoke-ompi 60 s_smoke
}

phase_test() {
  local np
  for np in "${NPS[@]}"; do
    step test "test-staged-np$np" 150 s_test staged "$np"
    step test "test-direct-np$np" 150 s_test direct "$np"
  done
  step test demo-staged 40 s_demo staged
  step test demo-direct 40 s_demo direct
  if [ "$CPU_SUITE" = 1 ]; then step test cpu-mpi-np2 150 s_cpu 2; fi
}

phase_bench() {
  step bench bench-staged 120 s_bench staged
  step bench bench-direct 120 s_bench direct
}

usage() { sed -n '2,33p' "$SELF"; }

case "$COMMAND" in
  _do)
    shift
    case "${1:-}" in
      pyprobe | s_*) "$@"; exit $? ;;
      *) echo "_do: unknown step ${1:-}" >&2; exit 2 ;;
    esac
    ;;
  setup | test | bench | all) ;;
  -h | --help | help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

mkdir -p "$OUT" "$LOGS"
need_setup=0
if [ "$COMMAND" = setup ] || [ "$COMMAND" = all ] ||
  [ ! -f "$WORK/venv-mpich/gpu-env.sh" ] || [ ! -f "$WORK/venv-ompi/gpu-env.sh" ]; then
  need_setup=1
fi
case "$COMMAND" in
  setup) STEPS_LEFT=$n_setup ;;
  test) STEPS_LEFT=$((need_setup * n_setup + n_test)) ;;
  bench) STEPS_LEFT=$((need_setup * n_setup + n_bench)) ;;
  all) STEPS_LEFT=$((n_setup + n_test + n_bench)) ;;
esac
DEADLINE=$((SECONDS + BUDGET_S))

echo "scripts/gpu-window.sh $COMMAND: $STEPS_LEFT steps within ${BUDGET_S}s; logs and summary in $OUT"
echo "expected: setup ~1 min (probe 5 s, 2 offline venvs ~15 s each, mpicomm info and the smoke ~10 s each)"
echo "          test  ~3-5 min (staged and direct at ${NPS[*]} ranks, ~30-60 s each, at most 150 s each)"
echo "          bench ~2-3 min (staged and direct at 2 ranks, at most 120 s each)"
echo "          all   ~6-9 min; every step's timeout is cut to end within ${BUDGET_S}s"
if [ "$need_setup" = 1 ] && [ "$COMMAND" != setup ] && [ "$COMMAND" != all ]; then
  echo "the venvs in $WORK are missing (a fresh machine): running setup first"
fi

[ "$need_setup" = 1 ] && phase_setup
case "$COMMAND" in
  test) phase_test ;;
  bench) phase_bench ;;
  all) phase_test; phase_bench ;;
esac

write_summary
echo
echo "== summary: $COMMAND, $((SECONDS - T_START)) s, $FAILED step(s) not passed"
printf '%s\n' "${LINES[@]}"
files=$(find "$OUT" -type f | wc -l)
echo "files in $OUT: $files (the device tool brings back at most 8): $(find "$OUT" -type f -printf '%P ')"
[ "$FAILED" -eq 0 ]
