#!/usr/bin/env bash
# scripts/slurm_check.sh - attnbench submit against a real Slurm, on this one machine.
#
# usage (as root, from anywhere; a Python with attnbench installed, e.g. pip install -e '.[slurm]', found as below):
#   scripts/slurm_check.sh [check]   install what is missing, start a private single-node Slurm, run the checks,
#                                    stop everything it started and remove its configuration
#   scripts/slurm_check.sh up        the same cluster, left running (prints `export SLURM_CONF=...`)
#   scripts/slurm_check.sh down      stop and remove whatever an earlier run left
#   scripts/slurm_check.sh python    print the Python it would use, and exit
# options:
#   --keep-on-failure   keep $SLURM_CHECK_ROOT (configs, logs, the submission folders) when a check fails
# env: SLURM_CHECK_ROOT (default /tmp/attnbench-slurm-check),
#      SLURM_CHECK_PORT_BASE (default 6917: slurmctld, +1 slurmd, +2 slurmdbd, +3 mariadb)
#      the Python to run attnbench with, the first of: ATTNBENCH_PYTHON (an interpreter), the virtual environment
#      ATTNBENCH_VENV (default <repo>/.venv) if it holds attnbench, the interpreter of the `attnbench` on PATH
#
# The checks (each prints its figures; the committed output is results/slurm-check-cpu.log):
#   1. `attnbench submit` of a tiny CPU config as a 3-task job array: one sbatch --array, every task COMPLETED in
#      sacct, the merged run holds every case of the config exactly once; the time from submit to merged.
#   2. the same with --gpus-per-task 1 on the node's two (fake) GPUs: each task is given a GPU of its own
#      (sacct AllocTRES gres/gpu=1), the third waits for a free one.
#   3. a task cancelled while it runs (scancel): its finished rows stay, `submit --status` shows the gap,
#      `submit --resume` reruns only that shard and the merged run is complete.
#   4. an sbatch that refuses (an unknown partition): one error line and a hint, exit 2, no folder left.
#
# How (see /work/scratch/slurm/NOTES.md for every finding behind it): Debian's slurmctld, slurmd, slurm-client and
# munge, plus slurmdbd and MariaDB for accounting (without sacct, submitit never learns that a task died). There
# is no systemd here, so each daemon is started directly, and everything it needs (config, munge key and socket,
# state, spool, logs, database) lives under one private directory; nothing in /etc is written and the apt
# packages stay installed. Two fake GPUs are character devices with /dev/null's numbers, declared in gres.conf.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
ROOT=${SLURM_CHECK_ROOT:-/tmp/attnbench-slurm-check}
VENV=${ATTNBENCH_VENV:-$REPO/.venv}
PY=""                             # the Python with attnbench: find_python
PORT_BASE=${SLURM_CHECK_PORT_BASE:-6917}
CTLD_PORT=$PORT_BASE SLURMD_PORT=$((PORT_BASE + 1)) DBD_PORT=$((PORT_BASE + 2)) DB_PORT=$((PORT_BASE + 3))
MARKER=.attnbench-slurm-check     # only a directory carrying this file is ever rm -rf'd
PACKAGES=(slurmctld slurmd slurm-client munge)
DB_PACKAGES=(slurmdbd mariadb-server)
ACCOUNTING=1 GPUS=2               # accounting is not optional: see the header

MODE=check KEEP_ON_FAILURE=0
while (($#)); do
    case $1 in
        check | up | down | python) MODE=$1 ;;
        --keep-on-failure) KEEP_ON_FAILURE=1 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# Poll CMD every 0.2 s until it succeeds or TIMEOUT seconds pass.
wait_for() {
    local what=$1 timeout=$2 start=$EPOCHREALTIME
    shift 2
    until "$@" >/dev/null 2>&1; do
        if awk -v a="$start" -v b="$EPOCHREALTIME" -v t="$timeout" 'BEGIN { exit !(b - a > t) }'; then
            die "timed out after ${timeout}s waiting for $what"
        fi
        sleep 0.2
    done
}

[[ $EUID -eq 0 ]] || die "run as root (daemons, apt-get, mknod)"
[[ $ROOT == /* && $ROOT != / ]] || die "SLURM_CHECK_ROOT must be an absolute path other than /"

export SLURM_CONF=$ROOT/etc/slurm.conf   # every Slurm command and daemon reads this one file
MUNGE_SOCKET=$ROOT/munge/run/munge.socket

# ---------------------------------------------------------------------------------------------
# teardown: by pid file, checking the pid still runs the expected program (pid reuse).
# ---------------------------------------------------------------------------------------------
# True while PID runs; a zombie counts as gone (under a PID 1 that does not reap, e.g. docker
# without --init, a daemon's zombie would otherwise look alive forever).
alive() { [[ -r /proc/$1/stat ]] && [[ $(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) != Z ]]; }

stop_pidfiles() { # NAME=PIDFILE ...   SIGTERM all of them, then wait (SIGKILL after 10 s)
    local arg name pidfile pid i n pids=() names=()
    for arg in "$@"; do
        name=${arg%%=*} pidfile=${arg#*=}
        [[ -s $pidfile ]] || continue
        pid=$(<"$pidfile")
        rm -f "$pidfile"
        if ! [[ $pid =~ ^[0-9]+$ ]] || ! alive "$pid" || [[ $(</proc/"$pid"/comm) != "$name" ]]; then
            continue # already gone, or the pid now belongs to something else
        fi
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid") names+=("$name")
    done
    for i in "${!pids[@]}"; do
        pid=${pids[i]}
        for ((n = 0; n < 100; n++)); do alive "$pid" || break; sleep 0.1; done
        if alive "$pid"; then
            log "${names[i]} ($pid) ignored SIGTERM for 10 s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped ${names[i]} ($pid)"
    done
}

# PIDS of every descendant of PID (children before their parents are listed last).
descendants() {
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        descendants "$child"
        echo "$child"
    done
}

# slurmstepd processes (and the job processes under them) outlive slurmd, e.g. when slurmctld
# died and nothing could be scancel'ed.  Ours are the ones whose environment names our slurm.conf.
stop_stray_stepds() {
    local pid victims
    for pid in $(pgrep -x slurmstepd || true); do
        if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
            victims=$(descendants "$pid")
            log "killing leftover slurmstepd $pid and its processes: ${victims//$'\n'/ }"
            # shellcheck disable=SC2086
            kill -KILL $victims "$pid" 2>/dev/null || true
        fi
    done
}

teardown() {
    local i
    [[ -d $ROOT ]] || return 0
    # Cancel our jobs first so slurmd's steps end cleanly (only if slurmctld still answers).
    if [[ -f $SLURM_CONF ]] && timeout 5 scontrol ping >/dev/null 2>&1; then
        local ids
        ids=$(timeout 5 squeue -h -o %F 2>/dev/null | sort -u || true)
        if [[ -n $ids ]]; then
            log "cancelling leftover jobs: ${ids//$'\n'/ }"
            # shellcheck disable=SC2086
            timeout 10 scancel $ids || true
            for ((i = 0; i < 100; i++)); do [[ -z $(timeout 5 squeue -h 2>/dev/null) ]] && break; sleep 0.2; done
        fi
    fi
    # Slurm daemons first (slurmctld flushes to slurmdbd, slurmdbd to MariaDB), munge last.
    stop_pidfiles slurmd="$ROOT/run/slurmd.pid" slurmctld="$ROOT/run/slurmctld.pid"
    stop_pidfiles slurmdbd="$ROOT/run/slurmdbd.pid"
    stop_pidfiles mariadbd="$ROOT/mysql/mysqld.pid" munged="$ROOT/munge/run/munged.pid"
    stop_stray_stepds
}

remove_root() {
    [[ -d $ROOT ]] || return 0
    [[ -f $ROOT/$MARKER ]] || die "$ROOT exists but lacks $MARKER; not removing it"
    rm -rf -- "$ROOT"
    log "removed $ROOT"
}

# ---------------------------------------------------------------------------------------------
# install: Debian packages (left installed) and the submitit venv.
# ---------------------------------------------------------------------------------------------
POLICY_RC=/usr/sbin/policy-rc.d CREATED_POLICY_RC=0 CHECK_PID=
install_packages() {
    local wanted=("${PACKAGES[@]}") missing=() p
    ((ACCOUNTING)) && wanted+=("${DB_PACKAGES[@]}")
    for p in "${wanted[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || { log "packages present: ${wanted[*]}"; return 0; }
    log "installing ${missing[*]}"
    # Keep the packages' postinst from starting the system-wide services (munge, mariadb):
    # we run private instances instead.  This image already ships such a policy-rc.d.
    if [[ ! -e $POLICY_RC ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC" && chmod 755 "$POLICY_RC" && CREATED_POLICY_RC=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    remove_policy_rc
}
remove_policy_rc() { ((CREATED_POLICY_RC)) && rm -f "$POLICY_RC"; CREATED_POLICY_RC=0; }

# The Python to run attnbench with (PY): ATTNBENCH_PYTHON, else the virtual environment's, else the interpreter of
# the attnbench on PATH; each must import attnbench. The error says what was looked for and what was found.
imports_attnbench() { (cd / && "$@" -c "import attnbench" 2>/dev/null); }  # from /: not the checkout beside it

find_python() {
    local tried=() candidate on_path
    if [[ -n ${ATTNBENCH_PYTHON:-} ]]; then
        candidate=$ATTNBENCH_PYTHON
        if imports_attnbench "$candidate"; then PY=$candidate; return; fi
        tried+=("ATTNBENCH_PYTHON=$candidate (does not import attnbench)")
    else
        tried+=("ATTNBENCH_PYTHON (unset)")
    fi
    if [[ -x $VENV/bin/python ]] && imports_attnbench "$VENV/bin/python"; then PY=$VENV/bin/python; return; fi
    tried+=("the virtual environment $VENV ($([[ -x $VENV/bin/python ]] && echo 'no attnbench in it' || echo 'absent'))")
    on_path=$(command -v attnbench || true)
    if [[ -n $on_path ]]; then
        candidate=$(head -n 1 "$on_path" | sed -n 's/^#! *//p')
        if [[ -n $candidate ]] && imports_attnbench "$candidate"; then PY=$candidate; return; fi
        tried+=("attnbench on PATH ($on_path, whose interpreter ${candidate:-?} does not import attnbench)")
    else
        tried+=("attnbench on PATH (none)")
    fi
    local joined
    joined=$(printf '%s; ' "${tried[@]}")
    die "no Python with attnbench: looked for ${joined%; }. Set ATTNBENCH_PYTHON=/path/to/python, or python3 -m venv .venv && .venv/bin/pip install -e '.[slurm]'"
}

install_python() {
    if ! "$PY" -c "import submitit" 2>/dev/null; then
        log "installing the slurm extra (submitit) for $PY"
        "$PY" -m pip install -q --disable-pip-version-check "submitit>=1.5"
    fi
    log "attnbench $("$PY" -c 'import attnbench; print(attnbench.__version__)'), submitit $("$PY" -c 'import submitit; print(submitit.__version__)'), $("$PY" -V) ($PY)"
}

# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
write_config() {
    mkdir -p "$ROOT" && touch "$ROOT/$MARKER"
    chmod 755 "$ROOT"
    mkdir -p "$ROOT"/{etc,run,log,state/ctld,state/slurmd,jobs}
    # munged refuses a socket directory that is not world-executable, and a key directory that is
    # group/world accessible, so the two are separate.
    install -d -m 755 "$ROOT/munge/run"
    install -d -m 700 "$ROOT/munge/etc"
    mungekey --create --keyfile="$ROOT/munge/etc/munge.key" >/dev/null

    # Node hardware as slurmd itself detects it (a RealMemory above what slurmd reports drains the node).
    local hw
    hw=$(slurmd -C | head -1 | sed -E 's/^NodeName=[^ ]+ //')

    local gres_line="" node_gres=""
    if ((GPUS > 0)); then
        # gres/gpu drops "file-less" GPUs (Count= alone ends as gpu:0 and drains the node), and wants
        # character devices: fake them with /dev/null's major/minor.  No device cgroup is in use,
        # so nothing is ever opened; Slurm only uses the index for CUDA_VISIBLE_DEVICES.
        mkdir -p "$ROOT/fakedev"
        local i
        for ((i = 0; i < GPUS; i++)); do mknod "$ROOT/fakedev/nvidia$i" c 1 3; done
        cat >"$ROOT/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=localhost Name=gpu File=$ROOT/fakedev/nvidia[0-$((GPUS - 1))]
EOF
        gres_line="GresTypes=gpu"
        node_gres="Gres=gpu:$GPUS"
    fi

    local acct
    if ((ACCOUNTING)); then
        # AccountingStoragePass is, for slurmdbd, the munge socket to use on that connection;
        # AuthInfo alone does not cover it (PersistInit fails with "Protocol authentication error").
        acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET"
        # Record GPU allocations in sacct's AllocTRES too.
        ((GPUS > 0)) && acct+=$'\nAccountingStorageTRES=gres/gpu'
    else
        acct="AccountingStorageType=accounting_storage/none"
    fi

    cat >"$SLURM_CONF" <<EOF
# Generated by attnbench scripts/slurm_check.sh - single node, no systemd, no cgroups.
ClusterName=attnbench
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# Run everything as root: no slurm-owned directories to prepare.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$ROOT/state/ctld
SlurmdSpoolDir=$ROOT/state/slurmd
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
# cgroup plugins need a systemd/cgroupfs setup this VM lacks; linuxproc tracks by process tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
$acct
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Default batch_sched_delay=3 holds new batch jobs up to 3 s: a 3-task array on 2 CPUs took
# ~6.3 s submit->done with it, ~2.1 s without.
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, a job asking no memory gets the whole node and array elements serialize.
DefMemPerCPU=1000
# A node that restarts (or registered once with a bad config) comes back by itself.
ReturnToService=2
# Grace between SIGTERM and SIGKILL on scancel/timeout (default 30 s). submitit ignores SIGTERM.
KillWait=5
$gres_line
NodeName=localhost NodeAddr=127.0.0.1 $hw $node_gres State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

    if ((ACCOUNTING)); then
        # slurmdbd looks for slurmdbd.conf next to $SLURM_CONF and insists on mode 600.
        install -m 600 /dev/null "$ROOT/etc/slurmdbd.conf"
        cat >"$ROOT/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$ROOT/run/slurmdbd.pid
LogFile=$ROOT/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=attnbench
StorageLoc=slurm_acct_db
EOF
        mkdir -p "$ROOT/mysql"
        cat >"$ROOT/mysql/my.cnf" <<EOF
[mariadbd]
user=root
datadir=$ROOT/mysql/data
socket=$ROOT/mysql/mysqld.sock
pid-file=$ROOT/mysql/mysqld.pid
log-error=$ROOT/mysql/mysqld.err
bind-address=127.0.0.1
port=$DB_PORT
skip-name-resolve
innodb-buffer-pool-size=64M
innodb-log-file-size=8M
innodb-lock-wait-timeout=900
EOF
    fi
    log "wrote config under $ROOT"
}

# ---------------------------------------------------------------------------------------------
# start
# ---------------------------------------------------------------------------------------------
check_ports_free() {
    local port ports=("$CTLD_PORT" "$SLURMD_PORT")
    command -v ss >/dev/null || { log "no ss (iproute2): skipping the port check"; return 0; }
    ((ACCOUNTING)) && ports+=("$DBD_PORT" "$DB_PORT")
    for port in "${ports[@]}"; do
        if ss -Hltn "sport = :$port" | grep -q .; then
            die "port $port already in use (another Slurm?); set SLURM_CHECK_PORT_BASE"
        fi
    done
}

declare -A T
start_daemons() {
    local t0 t
    t0=$(now)

    t=$(now)
    munged --socket="$MUNGE_SOCKET" --key-file="$ROOT/munge/etc/munge.key" \
        --pid-file="$ROOT/munge/run/munged.pid" --seed-file="$ROOT/munge/etc/munged.seed" \
        --log-file="$ROOT/log/munged.log"
    wait_for munge 10 bash -c "munge -n -S '$MUNGE_SOCKET' | unmunge -S '$MUNGE_SOCKET'"
    T[munged]=$(since "$t")

    if ((ACCOUNTING)); then
        t=$(now)
        mariadb-install-db --no-defaults --user=root --datadir="$ROOT/mysql/data" \
            --auth-root-authentication-method=socket --skip-test-db --innodb-log-file-size=8M \
            >"$ROOT/log/mariadb-install.log" 2>&1
        # mariadbd does not daemonize itself: detach it (own session, no inherited fds).
        setsid mariadbd --defaults-file="$ROOT/mysql/my.cnf" </dev/null >>"$ROOT/log/mariadbd.out" 2>&1 &
        wait_for mariadb 60 mariadb-admin --no-defaults --socket="$ROOT/mysql/mysqld.sock" ping
        mariadb --no-defaults --socket="$ROOT/mysql/mysqld.sock" -u root -e \
            "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'attnbench';
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        T[mariadb]=$(since "$t")

        t=$(now)
        slurmdbd   # daemonizes; reads $ROOT/etc/slurmdbd.conf via $SLURM_CONF's directory
        wait_for slurmdbd 60 sacctmgr -n list cluster
        T[slurmdbd]=$(since "$t")
    fi

    t=$(now)
    slurmctld -f "$SLURM_CONF"   # daemonizes; with accounting it registers the cluster itself
    wait_for slurmctld 60 scontrol ping
    T[slurmctld]=$(since "$t")

    t=$(now)
    # The hostname is not "localhost": -N tells slurmd which NodeName it is.
    slurmd -f "$SLURM_CONF" -N localhost
    # shellcheck disable=SC2016  # expanded by the inner bash, on each poll
    wait_for "node idle" 60 bash -c '[[ $(sinfo -h -n localhost -o %T) == idle ]]'
    T[slurmd_to_idle]=$(since "$t")
    T[all_daemons]=$(since "$t0")
    log "cluster up: $(sinfo -h -N -o '%N %T cpus=%c mem=%m gres=%G')"
    log "start times (s): $(for k in munged mariadb slurmdbd slurmctld slurmd_to_idle all_daemons; do
        [[ -n ${T[$k]:-} ]] && printf '%s=%s ' "$k" "${T[$k]}"; done)"
}

# ---------------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------------
JOBS=$ROOT/jobs
declare -A FIG

# Run a command in the background and wait for it, so that a signal to this script runs its trap at once (bash
# defers traps while a foreground child runs). Sets RC; never fails the script by itself.
CHECK_PID=
run() {
    set +e
    "$@" &
    CHECK_PID=$!
    wait "$CHECK_PID"
    RC=$?
    CHECK_PID=
    set -e
}

check() { # CONDITION-COMMAND... ; the last argument says what was checked
    local what=${*: -1}
    if "${@:1:$#-1}"; then log "ok: $what"; else die "CHECK FAILED: $what"; fi
}

write_configs() {
    # 4 models x 3 lengths = 12 cases, forward, float32, tiny shapes and a quick timing policy.
    cat >"$JOBS/tiny-cpu.yaml" <<YAML
name: slurm-check
device: cpu
models: [lstm, gru, sdpa-flash, vanilla]
modes: [forward]
dtype: [float32]
grid: {batch: [1], seq_len: [16, 32, 64]}
d_model: 32
heads: 2
layers: 1
timing: {target_ci: 0.05, min_samples: 5, min_time_s: 0.01, max_case_s: 0.2, warmup_max_s: 0.05}
YAML
    # The same cases, slow enough (about 0.5 s each) that a task can be cancelled while it measures.
    sed -e 's/name: slurm-check/name: slurm-check-slow/' \
        -e 's/min_time_s: 0.01, max_case_s: 0.2/min_time_s: 0.5, max_case_s: 0.6/' \
        "$JOBS/tiny-cpu.yaml" >"$JOBS/slow-cpu.yaml"
}

# The merged run holds every case of the config exactly once, in the config's order, and reads as a run.
verify_merged() { # CONFIG SUBMISSION_FOLDER
    "$PY" - "$1" "$2" <<'PYTHON'
import json, subprocess, sys
from pathlib import Path
from attnbench.results.store import load_run
config, folder = sys.argv[1], Path(sys.argv[2])
dry = subprocess.run([sys.executable, "-m", "attnbench", "sweep", config, "--dry-run"], capture_output=True, text=True)
expected = [line for line in dry.stdout.splitlines() if line.startswith("model=")]
merged = load_run(folder / "merged")
keys = [r.case.key for r in merged.results]
shards = sorted(str(s.shard) for s in merged.run.merged_from)
print(f"  merged run {folder / 'merged'}: {len(keys)} rows, {len(set(keys))} distinct cases, config has "
      f"{len(expected)}; state {merged.run.state}; from shards {', '.join(shards)}; statuses "
      f"{sorted({r.status for r in merged.results})}")
sys.exit(0 if keys == expected and merged.run.state == "complete" else 1)
PYTHON
}

array_id() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["job_id"].split("_")[0])' "$1/submission.json"; }

sacct_table() { # ARRAY_ID
    sacct -X -n -j "$1" -P -o JobID,State,Elapsed,AllocTRES | sed 's/^/  sacct: /'
}

phase_cpu_array() {
    log "1. attnbench submit: a 3-task CPU job array"
    local folder=$JOBS/cpu t0
    t0=$(now)
    run "$PY" -m attnbench submit "$JOBS/tiny-cpu.yaml" --executor slurm --array 3 --partition debug --time 10 \
        --folder "$folder"
    FIG[cpu_submit_to_merged_s]=$(since "$t0")
    check test "$RC" -eq 0 "attnbench submit exited 0"
    local array
    array=$(array_id "$folder")
    check test "$("$PY" -c 'import json,sys; print(len({j["job_id"].split("_")[0] for j in json.load(open(sys.argv[1]))["jobs"]}))' "$folder/submission.json")" -eq 1 \
        "one sbatch: every task is an element of array $array"
    sleep 1 # slurmctld hands the final states to slurmdbd a moment after the tasks end
    sacct_table "$array"
    check test "$(sacct -X -n -j "$array" -o State | grep -c COMPLETED)" -eq 3 "sacct: 3 array elements COMPLETED"
    check verify_merged "$JOBS/tiny-cpu.yaml" "$folder" "the merged run has every case exactly once"
    log "figure: submit -> merged ${FIG[cpu_submit_to_merged_s]} s (wall time of attnbench submit, 3 tasks on 2 CPUs)"
}

phase_gpu_array() {
    log "2. one (fake) GPU per task: --gpus-per-task 1 on a node with 2"
    local folder=$JOBS/gpu t0 array
    t0=$(now)
    run "$PY" -m attnbench submit "$JOBS/tiny-cpu.yaml" --executor slurm --array 3 --device cpu --gpus-per-task 1 \
        --time 10 --folder "$folder"
    FIG[gpu_submit_to_merged_s]=$(since "$t0")
    check test "$RC" -eq 0 "attnbench submit --gpus-per-task 1 exited 0"
    array=$(array_id "$folder")
    sleep 1
    sacct_table "$array"
    check test "$(sacct -X -n -j "$array" -P -o AllocTRES | grep -c 'gres/gpu=1')" -eq 3 \
        "sacct: each of the 3 tasks was given one GPU of its own"
    check verify_merged "$JOBS/tiny-cpu.yaml" "$folder" "the merged run has every case exactly once"
    log "figure: submit -> merged ${FIG[gpu_submit_to_merged_s]} s (3 tasks, 2 GPUs: two waves)"
}

phase_cancel_and_resume() {
    log "3. a task cancelled while it runs, then attnbench submit --resume"
    local folder=$JOBS/cancel array victim t0 i state
    run "$PY" -m attnbench submit "$JOBS/slow-cpu.yaml" --executor slurm --array 3 --time 10 --folder "$folder" --no-wait
    check test "$RC" -eq 0 "attnbench submit --no-wait exited 0"
    array=$(array_id "$folder")
    # The victim: the largest shard's element, once it has written a row (so it is measuring, not starting).
    victim=$("$PY" - "$folder" <<'PYTHON'
import json, sys
from pathlib import Path
from attnbench.config.experiment import load_experiment
from attnbench.core.shards import split
folder = Path(sys.argv[1])
sub = json.loads((folder / "submission.json").read_text())
sizes = [len(s) for s in split(load_experiment(folder / "config.yaml").cases("cpu"), sub["shards"])]
job = max(sub["jobs"], key=lambda j: sizes[j["shard"]])
print(job["job_id"], job["shard"], sizes[job["shard"]])
PYTHON
)
    read -r victim vshard vsize <<<"$victim"
    log "cancelling $victim (shard $vshard/3, $vsize cases) once it has written a row"
    for ((i = 0; i < 600; i++)); do
        state=$(squeue -h -r -j "$victim" -o %T 2>/dev/null || true)
        if [[ $state == RUNNING ]] && grep -qs '"key"' "$folder"/shards/*/results.jsonl &&
            "$PY" - "$folder" "$vshard" <<'PYTHON'
import sys
from pathlib import Path
from attnbench.core.shards import Shard
from attnbench.cluster.submission import shard_run
run = shard_run(Path(sys.argv[1]) / "shards", Shard(int(sys.argv[2]), 3))
sys.exit(0 if run is not None and (run / "results.jsonl").exists() and (run / "results.jsonl").stat().st_size else 1)
PYTHON
        then break; fi
        sleep 0.2
    done
    scancel "$victim"
    log "scancel $victim"
    for ((i = 0; i < 300; i++)); do [[ -z $(squeue -h -j "$array" 2>/dev/null) ]] && break; sleep 0.2; done
    sleep 1
    sacct_table "$array"
    check test "$(sacct -X -n -j "$victim" -o State | grep -c CANCELLED)" -eq 1 "sacct: $victim CANCELLED"
    run "$PY" -m attnbench submit --status "$folder"
    check test "$RC" -eq 0 "attnbench submit --status shows the gap"
    t0=$(now)
    run "$PY" -m attnbench submit --resume "$folder"
    FIG[resume_to_merged_s]=$(since "$t0")
    check test "$RC" -eq 0 "attnbench submit --resume exited 0"
    check test "$("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"]; print(sum(x["attempt"]==2 for x in j), len(j))' "$folder/submission.json")" = "1 4" \
        "only the cancelled shard was submitted again"
    check verify_merged "$JOBS/slow-cpu.yaml" "$folder" "after --resume the merged run has every case exactly once"
    log "figure: --resume -> merged ${FIG[resume_to_merged_s]} s"
}

phase_sbatch_refuses() {
    log "4. an sbatch that refuses the array"
    local out
    set +e
    out=$("$PY" -m attnbench submit "$JOBS/tiny-cpu.yaml" --executor slurm --array 2 --partition no-such-partition \
        --folder "$JOBS/refused" 2>&1)
    RC=$?
    set -e
    printf '%s\n' "$out" | sed 's/^/  | /'
    check test "$RC" -eq 2 "exit 2"
    check grep -q "^error: .*refused the job array.*invalid partition" <<<"$out" "one error line with sbatch's words"
    check grep -q "^hint: " <<<"$out" "and a hint"
    check test ! -e "$JOBS/refused" "no folder left behind"
}

# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    remove_policy_rc
    if [[ -n ${CHECK_PID:-} ]] && kill -0 "$CHECK_PID" 2>/dev/null; then
        kill -TERM "$CHECK_PID" 2>/dev/null || true
        wait "$CHECK_PID" 2>/dev/null || true
    fi
    if [[ $MODE == up && $rc -eq 0 ]]; then return; fi
    if ((rc != 0)) && [[ -d $ROOT/log ]]; then
        log "failed (rc=$rc); last log lines:"
        tail -n 5 "$ROOT"/log/*.log 2>/dev/null || true
    fi
    local t
    t=$(now)
    teardown
    if ((rc != 0 && KEEP_ON_FAILURE)); then log "kept $ROOT for inspection"; else remove_root; fi
    log "teardown took $(since "$t") s"
    exit "$rc"
}

if [[ $MODE == down ]]; then
    teardown
    remove_root
    exit 0
fi

find_python
if [[ $MODE == python ]]; then
    echo "$PY"
    exit 0
fi

START=$(now)
# Idempotency: whatever a previous (possibly killed) run left is stopped and removed first.
teardown
remove_root
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t=$(now)
install_packages
FIG[install_s]=$(since "$t")
install_python
check_ports_free
write_config
log "Slurm $(sinfo -V 2>/dev/null | awk '{print $2}'), $(munged -V 2>&1 | head -1), $(mariadbd --version 2>/dev/null | awk '{print $3}')"
start_daemons
FIG[daemons_s]=${T[all_daemons]}

if [[ $MODE == up ]]; then
    log "leaving the cluster running; stop it with: $0 down"
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
fi

write_configs
# Tasks run in the submitter's working directory (sbatch's default) with its environment (--export=ALL).
cd "$JOBS"
phase_cpu_array
phase_gpu_array
phase_cancel_and_resume
phase_sbatch_refuses
log "ALL CHECKS PASSED"
log "figures (s): install ${FIG[install_s]}, daemons up ${FIG[daemons_s]}, 3-task CPU array submit -> merged ${FIG[cpu_submit_to_merged_s]}, with one GPU per task ${FIG[gpu_submit_to_merged_s]}, --resume after a cancel -> merged ${FIG[resume_to_merged_s]}; whole check so far $(since "$START")"
