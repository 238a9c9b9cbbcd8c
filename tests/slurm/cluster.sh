#!/usr/bin/env bash
# A real multi-node Slurm on this one machine, for the tests (and for
# trying peerwasm on Slurm by hand):
#
#     tests/slurm/cluster.sh up DIR [NODES] [CPUS] [MEM_MB] [--watch PID]
#     SLURM_CONF=DIR/slurm.conf sbatch --wrap 'hostname'
#     tests/slurm/cluster.sh down DIR
#
# One slurmctld, and NODES slurmd (default 4), each in its own network
# namespace with its own address on a bridge (10.77.0.1/24; node i is
# 10.77.0.(10+i), named pwnI in /etc/hosts), so that two jobs on two nodes
# can listen on the same port, while every node shares this machine's
# filesystem, munge and cgroups (so --mem is enforced per job). Each node
# declares CPUS cores (default 2) and MEM_MB of memory (default 4096),
# whatever the machine has (config_overrides).
#
# With --watch PID the cluster takes itself down when PID ends (a test
# process that cannot run code at its exit). One cluster per machine at a
# time: a second `up` waits for the first to go (a lock).
#
# Needs root, iproute2, nsenter and Debian's slurm-wlm and munge
# (`apt-get install slurm-wlm munge`). Exit status 2 when this machine
# cannot run it (said on stderr), 1 when starting failed.
#
# Facts behind each choice: ../shared/notes/slurm-local.md in the project's
# workspace (Slurm 22.05, hybrid cgroups, no systemd).
set -euo pipefail

BRIDGE=pwslurm0
NET=10.77.0
LOCK=/run/lock/peerwasm-slurm-test.lock
HOSTS_MARK="# peerwasm-slurm-test"

say() { printf 'slurm cluster: %s\n' "$*" >&2; }
cannot() { say "$*"; exit 2; }

down() {
    local dir="$1"
    # Jobs first, while Slurm can still end them cleanly.
    if [ -e "$dir/slurm.conf" ] && [ -e "$dir/run/slurmctld.pid" ]; then
        SLURM_CONF="$dir/slurm.conf" scancel --full --signal=KILL --user=root 2>/dev/null || true
        SLURM_CONF="$dir/slurm.conf" scancel --user=root 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    for pidfile in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid; do
        [ -e "$pidfile" ] || continue
        local pid
        pid="$(cat "$pidfile" 2>/dev/null || true)"
        if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    done
    # Jobs still running are the slurmstepd's children: they go with their
    # cgroup once slurmd is gone; give the daemons a moment to stop.
    for _ in $(seq 50); do
        local alive=0
        for pidfile in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid; do
            [ -e "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pidfile in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid; do
        [ -e "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    done
    # Whatever a job left behind in its nodes' cgroups.
    local procs
    for procs in /sys/fs/cgroup/memory/slurm_pwn*/uid_*/job_*/step_*/cgroup.procs \
                 /sys/fs/cgroup/memory/slurm_pwn*/uid_*/job_*/step_*/task_*/cgroup.procs; do
        [ -e "$procs" ] || continue
        xargs -r kill -9 < "$procs" 2>/dev/null || true
    done
    if [ -e "$dir/run/munged.pid" ]; then
        kill "$(cat "$dir/run/munged.pid")" 2>/dev/null || true
        rm -f "$dir/run/munged.pid"
    fi
    # And any daemon without a pidfile (one killed before writing it).
    leftovers
    if grep -q "$HOSTS_MARK" /etc/hosts 2>/dev/null; then
        # /etc/hosts may be a bind mount: rewrite it in place.
        local kept
        kept="$(grep -v "$HOSTS_MARK" /etc/hosts)"
        printf '%s\n' "$kept" > /etc/hosts
    fi
    if [ -e "$dir/run/lock.pid" ]; then
        kill "$(cat "$dir/run/lock.pid")" 2>/dev/null || true
        rm -f "$dir/run/lock.pid"
    fi
}

# What a test cluster whose owner was killed left behind (called under the
# lock: no other test cluster is live). A daemon still running in a node's
# namespace keeps the namespace, and its veth, alive after `ip netns del`:
# the next `ip link add pwsv1` would fail with "File exists".
leftovers() {
    local pid conf ns link
    # Our daemons: started with -f a conf naming our cluster, or since deleted.
    for pid in $(pgrep -x 'slurmd|slurmctld' || true); do
        conf="$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n '/^-f$/{n;p;q}')"
        [ -n "$conf" ] || continue
        if [ ! -e "$conf" ] || grep -qx 'ClusterName=peerwasm-test' "$conf" 2>/dev/null; then
            say "killing a test cluster's daemon that no pidfile named: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    for ns in $(ip netns list 2>/dev/null | awk '/^pwslurm-/ {print $1}'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -x 'pwsv[0-9]*' || true); do
        ip link del "$link" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
}

up() {
    local dir="$1" nodes="${2:-4}" cpus="${3:-2}" mem="${4:-4096}" watch="${5:-}"
    [ "$(id -u)" = 0 ] || cannot "needs root (network namespaces, slurmd); skipped"
    for cmd in slurmctld slurmd munged munge unmunge sbatch squeue sinfo ip nsenter flock; do
        command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] ||
            cannot "\`$cmd\` is missing (apt-get install slurm-wlm munge iproute2 util-linux); skipped"
    done
    [ -d /sys/fs/cgroup/memory ] || cannot "needs the cgroup v1 memory controller at /sys/fs/cgroup/memory; skipped"
    mkdir -p "$dir/run" "$dir/log" "$dir/state"
    dir="$(cd "$dir" && pwd)"

    # One cluster per machine: the lock is held by a sleeper until `down`.
    mkdir -p "$(dirname "$LOCK")"
    local waited=0
    until (
        exec 9>>"$LOCK"
        flock -n 9 || exit 1
        # Hold the lock in a process that outlives this script.
        setsid bash -c 'exec sleep infinity' 9>>"$LOCK" </dev/null >/dev/null 2>&1 &
        echo $! > "$dir/run/lock.pid"
    ); do
        [ "$waited" -ge 600 ] && { say "another test cluster has held $LOCK for 10 minutes"; exit 1; }
        [ "$waited" = 0 ] && say "waiting for another test cluster on this machine to go"
        sleep 1
        waited=$((waited + 1))
    done
    trap 'say "starting failed; taking it down"; down "$dir"' ERR

    leftovers

    # munge: the one already running, else ours.
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        [ -e /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=128 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
        runuser -u munge -- /usr/sbin/munged --force
        for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
        cp /run/munge/munged.pid "$dir/run/munged.pid" 2>/dev/null || true
        munge -n | unmunge >/dev/null || { say "munged does not answer"; exit 1; }
    fi

    # The network: a bridge, and a namespace per node behind it.
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local host nodelines="" i
    host="$(hostname)"
    for i in $(seq "$nodes"); do
        local ns="pwslurm-n$i" addr="$NET.$((10 + i))"
        ip netns add "$ns"
        ip link add "pwsv$i" type veth peer name "pwsv${i}n"
        ip link set "pwsv$i" master "$BRIDGE" up
        ip link set "pwsv${i}n" netns "$ns"
        ip -n "$ns" addr add "$addr/24" dev "pwsv${i}n"
        ip -n "$ns" link set "pwsv${i}n" up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$NET.1"
        echo "$addr pwn$i $HOSTS_MARK" >> /etc/hosts
        nodelines+="NodeName=pwn$i NodeHostname=$host NodeAddr=$addr Port=$((16820 + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"$'\n'
        mkdir -p "$dir/spool/pwn$i"
    done

    cat > "$dir/slurm.conf" <<EOF
ClusterName=peerwasm-test
SlurmctldHost=$host($NET.1)
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000
KillWait=5
MinJobAge=30
$nodelines
PartitionName=debug Nodes=pwn[1-$nodes] Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=256
EOF
    cat > "$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
ConstrainRAMSpace=yes
ConstrainCores=no
ConstrainSwapSpace=no
EOF

    /usr/sbin/slurmctld -D -f "$dir/slurm.conf" </dev/null >"$dir/log/slurmctld.out" 2>&1 &
    for i in $(seq "$nodes"); do
        nsenter --net="/run/netns/pwslurm-n$i" /usr/sbin/slurmd -D -N "pwn$i" -f "$dir/slurm.conf" \
            </dev/null >"$dir/log/slurmd-pwn$i.out" 2>&1 &
    done
    export SLURM_CONF="$dir/slurm.conf"
    local idle=0
    for _ in $(seq 300); do
        idle="$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle' || true)"
        [ "$idle" = "$nodes" ] && break
        sleep 0.1
    done
    if [ "$idle" != "$nodes" ]; then
        say "only $idle of $nodes nodes came up idle in 30 s; logs in $dir/log:"
        tail -n 5 "$dir"/log/*.log >&2 || true
        exit 1
    fi
    trap - ERR
    echo "SLURM_CONF=$dir/slurm.conf" > "$dir/env"
    if [ -n "$watch" ]; then
        setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down "$3"' _ "$watch" "$0" "$dir" \
            </dev/null >>"$dir/log/watch.out" 2>&1 &
    fi
    say "$nodes nodes up; SLURM_CONF=$dir/slurm.conf"
}

case "${1:-}" in
    up)
        shift
        dir="$1"; shift
        pos=(); watch=""
        while [ $# -gt 0 ]; do
            case "$1" in
                --watch) watch="$2"; shift 2 ;;
                *) pos+=("$1"); shift ;;
            esac
        done
        up "$dir" "${pos[0]:-4}" "${pos[1]:-2}" "${pos[2]:-4096}" "$watch"
        ;;
    down) down "$2" ;;
    *) echo "usage: $0 up DIR [NODES] [CPUS] [MEM_MB] [--watch PID] | down DIR" >&2; exit 64 ;;
esac
