#!/usr/bin/env bash
# A real Slurm (Debian's slurm-wlm 22.05 + munge) on this one machine, for mpicomm's job tests.
#
#   tests/slurm/slurm-ci.sh install   apt-get slurm-wlm and munge if missing (root, Debian/Ubuntu), and
#                                     Debian's Open MPI with its mpi4py and PMIx (a non-wheel MPI for the
#                                     launcher tests; best effort)
#   tests/slurm/slurm-ci.sh start     write /etc/slurm/slurm.conf, start munged, slurmctld, 3 slurmds
#   tests/slurm/slurm-ci.sh status    what runs, the nodes and the queue
#   tests/slurm/slurm-ci.sh stop      cancel jobs, stop what start started (by pid), restore the files
#
# One configuration, two partitions, so that one start-up (about a second) serves every test:
#   one  node n0, CPUs=8              one node, as on a workstation or a single cluster node
#   two  nodes n1 and n2, CPUs=4 each a real 2-node job: its own slurmd per node (Default=YES, as the
#                                     job scripts in jobs/ ask for 2 nodes)
# Each slurmd runs in its own UTS namespace with the node's hostname, so that MPI libraries see
# distinct hosts; the names resolve through a line added to /etc/hosts (removed by stop).
# The CPUs are declared, not real (SlurmdParameters=config_overrides): 8 ranks run on 2 cores.
# All state, spool, logs and pids live under SLURM_CI_DIR (default /tmp/slurm-ci).
# Recipe and pitfalls: shared/reference/slurm-on-one-machine.md.
set -Eeuo pipefail

DIR=${SLURM_CI_DIR:-/tmp/slurm-ci}
CONF=/etc/slurm/slurm.conf
PORT=${SLURM_CI_PORT:-6817}        # slurmctld; the slurmds take PORT+1, PORT+2, PORT+3
MAXTIME=${SLURM_CI_MAXTIME:-10}    # minutes: the longest any test job may run
NODES=(n0 n1 n2)
HOSTS_TAG="# added by mpicomm slurm-ci"
PIDS=$DIR/run/pids
unset SLURM_CONF  # the commands below must read the file that start writes

say() { echo "slurm-ci: $*"; }
die() { echo "slurm-ci: error: $*" >&2; exit 1; }

installed() {
  local cmd
  for cmd in slurmctld slurmd sbatch srun scontrol sinfo munged munge unmunge; do
    command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null 2>&1 || return 1
  done
}

# Debian's Open MPI, its mpi4py (for /usr/bin/python3) and the PMIx library that srun --mpi=pmix loads: a
# non-wheel MPI, started by srun, for the launcher tests. Best effort: those tests skip without it.
# slurmd must start after libpmix.so exists (else --mpi=pmix fails after 20 s), so this runs before start.
PMIX_LIB=/usr/lib/x86_64-linux-gnu/pmix2/lib
install_open_mpi() {
  if ! /usr/bin/python3 -c 'import mpi4py' 2>/dev/null || [ ! -e "$PMIX_LIB/libpmix.so.2" ]; then
    say "installing Debian's openmpi-bin, python3-mpi4py and libpmix2 (apt-get, no recommends)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openmpi-bin python3-mpi4py libpmix2 >/dev/null || { say "Open MPI not installed: its tests skip"; return 0; }
  fi
  if [ -e "$PMIX_LIB/libpmix.so.2" ] && [ ! -e "$PMIX_LIB/libpmix.so" ]; then
    ln -s libpmix.so.2 "$PMIX_LIB/libpmix.so"  # only libpmix-dev ships it, with a dozen build tools
  fi
}

cmd_install() {
  if installed; then
    say "slurm-wlm and munge already installed"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then install_open_mpi; fi
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "slurm-ci: not root: cannot install slurm-wlm and munge (run as root: make test-slurm)" >&2
    exit 77
  fi
  if ! command -v apt-get >/dev/null; then
    echo "slurm-ci: no apt-get: install Slurm and munge yourself, or run on Debian/Ubuntu as root" >&2
    exit 77
  fi
  say "installing slurm-wlm and munge (apt-get, no recommends)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
    || die "apt-get install slurm-wlm munge failed"
  installed || die "slurm-wlm and munge installed, but their commands are missing"
  install_open_mpi
}

# --- pids: one "name pid" line per daemon that start launched ---------------------------------------

record() { echo "$1 $2" >>"$PIDS"; }

alive() {  # alive PID NAME: the process exists, is not a zombie and runs NAME
  local stat comm
  read -r stat comm < <(ps -o stat=,comm= -p "$1" 2>/dev/null) || return 1
  [ "${stat:0:1}" != Z ] && [ "$comm" = "$2" ]
}

stop_pid() {  # stop_pid PID NAME: SIGTERM, wait up to 20 s, then SIGKILL
  local pid=$1 name=$2 i
  alive "$pid" "$name" || return 0
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do alive "$pid" "$name" || return 0; sleep 0.2; done
  say "$name ($pid) ignored SIGTERM for 20 s: SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s
  local seconds=$1 what=$2 i
  shift 2
  for ((i = 0; i < seconds * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "slurm-ci: error: $what not reached after $seconds s" >&2
  return 1
}

# --- configuration ---------------------------------------------------------------------------------

write_conf() {
  local host=$1
  cat <<EOF
# Generated by mpicomm tests/slurm/slurm-ci.sh start; the previous file (if any) comes back at stop.
ClusterName=mpicomm-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
EnforcePartLimits=ALL
MpiDefault=pmi2
KillWait=5
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MailProg=/bin/true
FirstJobId=$(first_job_id)
NodeName=n0 NodeHostname=n0 NodeAddr=127.0.0.1 Port=$((PORT + 1)) CPUs=8 RealMemory=4000 State=UNKNOWN
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=$((PORT + 2)) CPUs=4 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.1 Port=$((PORT + 3)) CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=one Nodes=n0 Default=NO DefaultTime=5 MaxTime=$MAXTIME State=UP
PartitionName=two Nodes=n1,n2 Default=YES DefaultTime=5 MaxTime=$MAXTIME State=UP
EOF
}

# Job ids go on from the last start-up (and from the clock), never from 1 again: MPICH names its shared
# memory segments after the PMI job and step, and a segment leaked by an aborted job would make a later
# job with the same id fail in MPI_Init ("MPIDI_POSIX_comm_bootstrap: Out of memory").
first_job_id() {
  local saved=0 clock=$(($(date +%s) % 50000000 + 1))
  if [ -s "$DIR/next-job-id" ]; then saved=$(cat "$DIR/next-job-id"); fi
  echo $((saved > clock ? saved : clock))
}

save_next_job_id() {
  local last
  last=$(scontrol show job -o 2>/dev/null | grep -o 'JobId=[0-9]*' | cut -d= -f2 | sort -n | tail -1 || true)
  if [ -n "$last" ]; then echo $((last + 1)) >"$DIR/next-job-id"; fi
}

install_conf() {
  mkdir -p /etc/slurm
  if [ ! -e "$DIR/run/conf-saved" ]; then
    if [ -e "$CONF" ]; then cp -p "$CONF" "$DIR/run/slurm.conf.orig"; fi
    touch "$DIR/run/conf-saved"
  fi
  write_conf "$(hostname -s)" >"$CONF"
}

restore_conf() {
  [ -e "$DIR/run/conf-saved" ] || return 0
  if [ -e "$DIR/run/slurm.conf.orig" ]; then
    cp -p "$DIR/run/slurm.conf.orig" "$CONF" && rm -f "$DIR/run/slurm.conf.orig"
  else
    rm -f "$CONF"
  fi
  rm -f "$DIR/run/conf-saved"
}

add_hosts() {  # the node names (and this host, if it does not resolve) -> 127.0.0.1
  local names=() name
  for name in "${NODES[@]}" "$(hostname -s)"; do
    getent hosts "$name" >/dev/null 2>&1 || names+=("$name")
  done
  [ ${#names[@]} -gt 0 ] || return 0
  echo "127.0.0.1 ${names[*]} $HOSTS_TAG" >>/etc/hosts
}

remove_hosts() {  # rewrite in place: /etc/hosts is often a bind mount that cannot be replaced
  grep -q -- "$HOSTS_TAG" /etc/hosts 2>/dev/null || return 0
  local kept
  kept=$(grep -v -- "$HOSTS_TAG" /etc/hosts || true)
  printf '%s\n' "$kept" >/etc/hosts
}

# --- start / stop ----------------------------------------------------------------------------------

all_idle() {
  local states
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(grep -c ' idle$' <<<"$states")" = "${#NODES[@]}" ]
}

start_munged() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "reusing the munged that already answers"
    return 0
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F >"$DIR/log/munged.stdout" 2>&1 &
  record munged $!
  wait_for 10 "munged answering" sh -c 'munge -n </dev/null | unmunge'
}

start_slurmd() {  # in its own UTS namespace, named after its node, where the kernel lets us
  local node=$1
  mkdir -p "$DIR/spool/$node" "$DIR/tmp/$node"
  if [ -e "$DIR/run/shared-hostname" ]; then
    /usr/sbin/slurmd -D -N "$node" >"$DIR/log/slurmd-$node.stdout" 2>&1 &
  else
    unshare --uts sh -c "hostname $node && exec /usr/sbin/slurmd -D -N $node" \
      >"$DIR/log/slurmd-$node.stdout" 2>&1 &
  fi
  record slurmd $!
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "start needs root (it writes $CONF and /etc/hosts)"
  installed || die "slurm-wlm or munge missing: run '$0 install' first"
  if [ -s "$PIDS" ]; then
    local n pid
    while read -r n pid; do
      if alive "$pid" "$n"; then die "already started ($n $pid runs): run '$0 stop' first"; fi
    done <"$PIDS"
    say "cleaning up after an earlier start whose daemons are gone"
    cmd_stop
  fi
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/tmp" "$DIR/log" "$DIR/run/shared-hostname"
  mkdir -p "$DIR"/{state,log,run,jobs}
  : >"$PIDS"
  install_conf
  add_hosts
  trap 'echo "slurm-ci: start failed; logs in $DIR/log; stopping" >&2; cmd_stop >&2' ERR
  start_munged
  /usr/sbin/slurmctld -D >"$DIR/log/slurmctld.stdout" 2>&1 &
  record slurmctld $!
  wait_for 20 "slurmctld answering" scontrol ping
  if ! unshare --uts true 2>/dev/null; then
    # e.g. a container without CAP_SYS_ADMIN: MPICH still tells the nodes apart through PMI.
    say "unshare --uts not permitted: every node keeps the host name $(hostname -s)"
    touch "$DIR/run/shared-hostname"
  fi
  local node
  for node in "${NODES[@]}"; do start_slurmd "$node"; done
  wait_for 30 "every node idle" all_idle
  trap - ERR
  say "up: partitions one (n0, 8 CPUs) and two (n1+n2, 4 CPUs each, default); state in $DIR"
}

cmd_stop() {
  if [ -s "$PIDS" ]; then
    if scontrol ping >/dev/null 2>&1; then
      save_next_job_id
      scancel --user="$(id -un)" >/dev/null 2>&1 || true
      wait_for 15 "empty queue" sh -c '[ -z "$(squeue -h 2>/dev/null)" ]' || true
    fi
    local name pid
    for name in slurmd slurmctld munged; do  # slurmd first: without its controller it lingers 10 s
      while read -r n pid; do
        if [ "$n" = "$name" ]; then stop_pid "$pid" "$name"; fi
      done <"$PIDS"
    done
    rm -f "$PIDS"
    say "stopped"
  fi
  remove_hosts
  restore_conf
}

cmd_status() {
  local n pid
  if [ -s "$PIDS" ]; then
    while read -r n pid; do
      if alive "$pid" "$n"; then echo "$n $pid running"; else echo "$n $pid gone"; fi
    done <"$PIDS"
    sinfo -N -o '%N %P %c %T' 2>/dev/null || true
    squeue 2>/dev/null || true
  else
    echo "not started (no $PIDS)"
    return 3
  fi
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 install|start|stop|status   (state under SLURM_CI_DIR=$DIR)" >&2; exit 2 ;;
esac
