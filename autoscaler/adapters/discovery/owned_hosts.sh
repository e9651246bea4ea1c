#!/bin/sh
# Horovod host discovery for standalone jobs, shipped by spot-autoscaler (owned mode).
#
# The daemon owns the whole file and writes it atomically, validated and guarded, so printing it
# is all there is to do. Exit 0 even before the file exists: Horovod ends the job if the first
# call fails, and an empty output only makes it wait for hosts.
#
# Then, for the daemon, it reports which hosts run a Horovod worker, i.e. are in Horovod's
# current rank assignment (driver.py _activate_workers -> _start_worker_processes starts them):
# the gloo launcher starts every worker as `env HOROVOD_HOSTNAME=<host> ...`, so a process whose
# command line (remote hosts: the ssh command) or environment (local hosts: after `env` exec'ed
# the worker) holds it is a worker of that host (as discover_hosts.sh, docs/discovery.md). The
# report, REPORT = FILE.assigned: `scanned EPOCH`, then `HOST SINCE-EPOCH` per assigned host
# (since when this script has seen it assigned), replaced atomically at every call. No worker
# seen (no /proc, none started yet): no report, and the daemon falls back to its join_grace.
# One horovodrun per machine: another job's workers of the same host names would count too.
#
# usage: owned_hosts.sh [FILE]   FILE defaults to $SPOT_HOSTS_FILE, else
#                                /var/lib/spot-autoscaler/hosts
# SPOT_ASSIGNED_FILE   the report                  default FILE.assigned
# SPOT_PROC_DIR        the process table           default /proc
file=${1:-${SPOT_HOSTS_FILE:-/var/lib/spot-autoscaler/hosts}}
cat "$file" 2>/dev/null

report=${SPOT_ASSIGNED_FILE:-$file.assigned}
proc=${SPOT_PROC_DIR:-/proc}
LC_ALL=C
export LC_ALL
set -f
# the pattern never matches its own command line: there `HOROVOD_HOSTNAME=` is followed by `\(`
assigned=$(
    cd "$proc" 2>/dev/null || exit 0
    set +f
    cat [0123456789]*/cmdline [0123456789]*/environ 2>/dev/null | tr '\000' '\n' |
        sed -n 's/^\(.* \)\{0,1\}HOROVOD_HOSTNAME=\([A-Za-z0-9_.-]\{1,\}\)\( .*\)\{0,1\}$/\2/p' |
        sort -u
)
if [ -z "$assigned" ]; then
    rm -f "$report" 2>/dev/null
    exit 0
fi
now=$(date +%s)
lines=$(printf '%s\n' "$assigned" | awk -v now="$now" -v old="$report" '
    BEGIN { while ((getline line < old) > 0) { n = split(line, f, " ")
            if (++i > 1 && n == 2) since[f[1]] = f[2] } }
    NF { print $1, (($1 in since) ? since[$1] : now) }' 2>/dev/null)
{ printf 'scanned %s\n%s\n' "$now" "$lines" > "$report.$$" && mv -f "$report.$$" "$report"; } \
    2>/dev/null || rm -f "$report.$$" 2>/dev/null
exit 0
