#!/bin/sh
# Horovod host discovery for et-operator and mpi-operator jobs, shipped by spot-autoscaler
# (overlay mode).
#
# Prints et-operator's hostfile (or what mpi-operator's discover_hosts.sh prints, with
# SPOT_BASE_SCRIPT) minus the hosts spot-autoscaler drained, so Horovod removes a
# doomed host gracefully (no rollback) before its pod goes. Horovod runs this every second and
# ends the job if the first call fails, so it always exits 0, and (docs/discovery.md):
#   - it never prints a torn hostfile: the operator rewrites it in place (`echo ... > hostfile`:
#     truncate, then write), so a view counts only when two whole-file reads in a row agree, it
#     ends with a newline, holds a valid line, and the file was not written from a quiet time
#     (0.05 s) before the first read until after the second; otherwise it waits for that and
#     reads again (for up to ~0.2 s, or ~1 s while it has no last good view yet), then uses the
#     last good view;
#   - it prints only lines Horovod parses as meant (`^[A-Za-z0-9_.-]+:[0-9]+$`, slots > 0), the
#     first of a repeated host, and never blank lines or comments (`# x` would be a host);
#   - it keeps a host of the previous output (the anchor) until a host it prints is settled in
#     Horovod's rank assignment: Horovod stops the job when a new assignment keeps no host of
#     the previous one, and a removal it announces while a new worker starts is lost;
#   - it re-announces a hidden host whose worker still runs SPOT_SETTLE_SECONDS later (shows it
#     for one call): Horovod drops a removal notice that reaches a worker during a reset.
# Who is assigned: Horovod starts every worker as `env HOROVOD_HOSTNAME=<host> ...`, so a process
# whose command line (remote hosts: the ssh/kubexec command) or environment (local hosts: after
# `env` exec'ed the worker) holds it is a worker of that host. With no such process (no /proc, or
# none seen), a host counts as settled once printed for SPOT_JOIN_SECONDS.
#
# SPOT_HOSTFILE        et-operator's hostfile                 default /etc/edl/hostfile
# SPOT_DRAIN_FILE      hosts to hide, one per line            default /etc/edl/drained-hosts
# SPOT_CACHE_FILE      the last output; CACHE.view (the last  default /etc/edl/last-hosts
#                      good hostfile) and CACHE.times (per-host times) beside it. They belong to
#                      one horovodrun run: remove CACHE* before starting it (CACHE.quiet only
#                      marks a time: the start of the last quiet wait)
# SPOT_ASSIGNED_FILE   hosts running a worker, sorted, one    default /etc/edl/assigned-hosts
#                      per line (the sidecar publishes it); written while any is seen
# SPOT_SETTLE_SECONDS  assigned this long: its worker runs   default 15
# SPOT_JOIN_SECONDS    no process evidence: printed this long default 60
# SPOT_PROC_DIR        process table and uptime clock         default /proc
# SPOT_BASE_SCRIPT     run this discovery script instead of   (unset: read SPOT_HOSTFILE)
#                      reading the hostfile, e.g. mpi-operator's /etc/mpi/discover_hosts.sh: it
#                      echoes `<pod>.<job>.<ns>.svc` per Running worker, without slots. A drained
#                      name hides a host whose first DNS label it is.
# SPOT_SLOTS           slots of a host printed without them   default 1
#                      (set it to horovodrun's --slots, the MPIJob's slotsPerWorker)

hostfile=${SPOT_HOSTFILE:-/etc/edl/hostfile}
drainfile=${SPOT_DRAIN_FILE:-/etc/edl/drained-hosts}
cache=${SPOT_CACHE_FILE:-/etc/edl/last-hosts}
assignedfile=${SPOT_ASSIGNED_FILE:-/etc/edl/assigned-hosts}
proc=${SPOT_PROC_DIR:-/proc}
settle=${SPOT_SETTLE_SECONDS:-15}
join=${SPOT_JOIN_SECONDS:-60}
base=${SPOT_BASE_SCRIPT:-}
slots=${SPOT_SLOTS:-1}
case $settle in *[!0123456789]* | '') settle=15 ;; esac
case $join in *[!0123456789]* | '') join=60 ;; esac
case $slots in *[!0123456789]* | '' | 0) slots=1 ;; esac
LC_ALL=C  # byte-wise character ranges and sort order
export LC_ALL
nl='
'
set -f  # host names are data, never glob patterns

# save FILE TEXT: replace FILE atomically (temp + rename); never fails the call.
save() {
    { printf '%s' "$2" > "$1.$$" && mv -f "$1.$$" "$1"; } 2>/dev/null || rm -f "$1.$$"
}

# snapshot: $snap = the hostfile in one read(2) by cat ('' when missing). The read builtin takes
# a byte per read(2): a rewrite between two of them would splice two versions.
snapshot() {
    snap=$(cat -- "$hostfile" 2>/dev/null; echo .)
    snap=${snap%.}
}

# newer FILE: FILE was last written strictly after the hostfile (find compares to the ns).
newer() {
    [ -n "$(find "$1" -newer "$hostfile" 2>/dev/null)" ]
}

# whole: 0 when the hostfile is proven whole: a second read agrees with $snap, the file ends
# with a newline, and it has not been written since the stamp (CACHE.quiet), which is at least
# $steps steps old (quiet, below): a writer that truncates and writes in pieces would have to
# stall longer than that in between. Without a stamp (an unwritable directory) the read from
# before the wait must agree too.
whole() {
    seen=$snap
    snapshot
    [ "$snap" = "$seen" ] || return 1
    case $snap in *"$nl") ;; *) return 1 ;; esac
    if [ "$stamped" = 1 ]; then newer "$stamp"; else [ "$snap" = "$before" ]; fi
}

# quiet: wait until the hostfile has not been written for $steps steps of 0.01 s: a new stamp,
# written again whenever the hostfile is written after it, takes CACHE.quiet's place once it is
# that old. 1 when the $budget of steps runs out first.
quiet() {
    before=$snap age=0
    { echo > "$stamp.$$"; } 2>/dev/null || stamped=0
    while [ "$age" -lt "$steps" ]; do
        [ "$budget" -gt 0 ] || { rm -f "$stamp.$$"; return 1; }
        budget=$((budget - 1))
        sleep 0.01 2>/dev/null
        if [ "$stamped" = 0 ] || newer "$stamp.$$"; then
            age=$((age + 1))
        else
            { echo > "$stamp.$$"; } 2>/dev/null
            age=0
        fi
    done
    [ "$stamped" = 0 ] || mv -f "$stamp.$$" "$stamp" 2>/dev/null || stamped=0
}

fresh=0
if [ -n "$base" ]; then
    # The base script's output counts when it exits 0 (a ConfigMap file: the kubelet swaps it
    # whole, no torn read); `host` lines get `:$slots`, the slots Horovod would give them.
    if snap=$(sh -- "$base" 2>/dev/null); then
        fresh=1
        snap=$(printf '%s\n' "$snap" |
            sed "s/^\([A-Za-z0-9_.-]\{1,\}\)\$/\1:$slots/")$nl
    else
        snap=''
    fi
else
    # The hostfile counts once it is proven whole (whole, above), after a quiet wait when it was
    # written since the stamp. The wait gives up after ~0.2 s when there is a last good view to
    # fall back on, after ~1 s when there is none yet (the first call of a horovodrun), so that
    # the first view is whole too.
    steps=5 stamp=$cache.quiet stamped=1 before='' budget=20
    [ -s "$cache.view" ] || budget=80
    snapshot
    while ! whole; do
        quiet || { snap=''; break; }
        snapshot
    done
    case $snap in ?*) fresh=1 ;; esac
fi

now=''
{ IFS=' ' read -r now _ < "$proc/uptime"; } 2>/dev/null
now=${now%%.*}
case $now in *[!0123456789]* | '') now=$(date +%s) ;; esac

# Hosts with a live worker: one pipeline over the process table. The pattern never matches its
# own command line: there `HOROVOD_HOSTNAME=` is followed by `\(`, not by a hostname.
assigned=$(
    cd "$proc" 2>/dev/null || exit 0
    set +f
    cat [0123456789]*/cmdline [0123456789]*/environ 2>/dev/null | tr '\000' '\n' |
        sed -n 's/^\(.* \)\{0,1\}HOROVOD_HOSTNAME=\([A-Za-z0-9_.-]\{1,\}\)\( .*\)\{0,1\}$/\2/p' |
        sort -u
)

# The decision, one awk pass. Prints tagged lines: `o LINE` (the output), `t RECORD` (CACHE.times:
# host slots served-since assigned-since hidden-since, '-' = not), `v LINE` (the view),
# `w cache|view|times|assigned` (files to rewrite), `m TEXT` (a message for stderr).
IFS=$nl
set -- $assigned
IFS=' '
result=$(printf '%s' "$snap" | awk -v fresh="$fresh" -v now="$now" -v settle="$settle" \
    -v join="$join" -v cache="$cache" -v drainfile="$drainfile" -v hostfile="$hostfile" \
    -v assignedfile="$assignedfile" -v assigned="$*" '
# valid(LINE): 1 when LINE (blanks around it dropped) is `host:slots`, slots > 0; sets H, S.
function valid(line) {
    sub(/^[ \t]+/, "", line)
    sub(/[ \t]+$/, "", line)
    if (line !~ /^[A-Za-z0-9_.-]+:[0-9]+$/ || line ~ /:0+$/) return 0
    H = line; sub(/:[0-9]+$/, "", H)
    S = line; sub(/^[^:]*:/, "", S)
    return 1
}
# hosts(FILE, LIST): the valid lines of FILE ("-": stdin), first of a repeated host, into
# N[LIST], HOST[LIST, i] and SLOTS[LIST, host]; returns the count.
function hosts(file, list,    line, r) {
    N[list] = 0
    while (1) {
        r = file == "-" ? (getline line) : (getline line < file)
        if (r <= 0) break
        if (!valid(line) || ((list, H) in SLOTS)) continue
        SLOTS[list, H] = S
        HOST[list, ++N[list]] = H
    }
    if (file != "-") close(file)
    return N[list]
}
function text(list,    i, t) {
    t = ""
    for (i = 1; i <= N[list]; i++) t = t HOST[list, i] ":" SLOTS[list, HOST[list, i]] "\n"
    return t
}
function add(list, host, slots) {
    if ((list, host) in SLOTS) return
    SLOTS[list, host] = slots
    HOST[list, ++N[list]] = host
}
function since(t) { return t != "-" && t != "" ? now - t : -1 }
# drained(HOST): HOST or its first DNS label (a pod name, as the daemon names hosts) is drained
function drained(h,    p) {
    p = h
    sub(/[.].*$/, "", p)
    return (h in DRAINED) || (p in DRAINED)
}
# settled(HOST): its worker has run for `settle` seconds, or without process evidence, it has
# been printed for `join` seconds.
function settled(h) {
    if (nassigned) return (h in ASSIGNED) && since(TA[h]) >= settle
    return since(TS[h]) >= join
}
BEGIN {
    oldview = hosts(cache ".view", "oldview")
    view = fresh ? hosts("-", "view") : 0
    for (i = 1; !view && i <= oldview; i++)  # not fresh: the last good view
        add("view", HOST["oldview", i], SLOTS["oldview", HOST["oldview", i]])
    prev = hosts(cache, "prev")
    if (!N["view"]) {  # nothing good known yet: the previous output again, no state change
        if (!prev) print "m " hostfile " is missing, torn or holds no valid line"
        for (i = 1; i <= prev; i++) print "o " HOST["prev", i] ":" SLOTS["prev", HOST["prev", i]]
        exit
    }
    while ((getline line < drainfile) > 0) { gsub(/[ \t]/, "", line); DRAINED[line] = 1 }
    close(drainfile)
    oldtimes = ""
    while ((getline line < (cache ".times")) > 0) {
        oldtimes = oldtimes line "\n"
        if (split(line, f, " ") != 5) continue
        TL[f[1]] = f[2]; TS[f[1]] = f[3]; TA[f[1]] = f[4]; TH[f[1]] = f[5]
    }
    close(cache ".times")
    nassigned = split(assigned, list, " ")
    for (i = 1; i <= nassigned; i++) ASSIGNED[list[i]] = 1

    # the output: the view minus drained hosts, after the anchor while no printed host is settled
    N["q"] = N["out"] = 0
    for (i = 1; i <= N["view"]; i++) {
        h = HOST["view", i]
        if (!drained(h)) add("q", h, SLOTS["view", h])
    }
    if (!prev) {
        if (!N["q"]) add("out", HOST["view", 1], SLOTS["view", HOST["view", 1]])
    } else {
        safe = 0
        for (i = 1; i <= N["q"] && !safe; i++) safe = settled(HOST["q", i])
        keep = ""
        for (i = 1; i <= prev && !safe && keep == ""; i++) {  # settled and still in the hostfile
            h = HOST["prev", i]
            if ((("view", h) in SLOTS) && settled(h)) keep = h
        }
        for (i = 1; i <= prev && !safe && keep == ""; i++) {  # else still in the hostfile
            h = HOST["prev", i]
            if (("view", h) in SLOTS) keep = h
        }
        if (!safe && keep == "") keep = HOST["prev", 1]
        if (!safe && !(("q", keep) in SLOTS))
            add("out", keep, (("view", keep) in SLOTS) ? SLOTS["view", keep] : SLOTS["prev", keep])
    }
    for (i = 1; i <= N["q"]; i++) add("out", HOST["q", i], SLOTS["q", HOST["q", i]])

    # re-announce a hidden host whose worker still runs `settle` seconds after it was hidden
    for (i = 1; i <= nassigned; i++) {
        h = list[i]
        if ((("out", h) in SLOTS) || since(TH[h]) < settle) continue
        slots = (("view", h) in SLOTS) ? SLOTS["view", h] : TL[h]
        if (slots == "" || slots == "-") continue
        add("out", h, slots)
        print "m " h " still runs a worker " settle "s after it was hidden: re-announced"
    }

    # per-host times for the next call
    times = ""
    for (i = 1; i <= N["out"]; i++) {
        h = HOST["out", i]
        served = (("prev", h) in SLOTS) && (h in TS) && TS[h] != "-" ? TS[h] : (prev ? now : 0)
        a = (h in ASSIGNED) ? ((h in TA) && TA[h] != "-" ? TA[h] : now) : "-"
        times = times h " " SLOTS["out", h] " " served " " a " -\n"
    }
    for (i = 1; i <= nassigned; i++) {
        h = list[i]
        if (("out", h) in SLOTS) continue
        slots = (("view", h) in SLOTS) ? SLOTS["view", h] : ((h in TL) ? TL[h] : "-")
        a = (h in TA) && TA[h] != "-" ? TA[h] : now
        hidden = (h in TH) && TH[h] != "-" ? TH[h] : now
        times = times h " " slots " - " a " " hidden "\n"
    }

    for (i = 1; i <= N["out"]; i++) print "o " HOST["out", i] ":" SLOTS["out", HOST["out", i]]
    n = split(times, lines, "\n")
    for (i = 1; i < n; i++) print "t " lines[i]
    if (times != oldtimes) print "w times"
    if (text("view") != text("oldview")) {
        for (i = 1; i <= N["view"]; i++) print "v " HOST["view", i] ":" SLOTS["view", HOST["view", i]]
        print "w view"
    }
    if (text("out") != text("prev")) print "w cache"
    if (nassigned) {
        old = ""
        while ((getline line < assignedfile) > 0) old = old (old == "" ? "" : " ") line
        if (old != assigned) print "w assigned"
    }
}' 2>&1)

out='' times='' view='' write=$nl
IFS=$nl
for l in $result; do
    case $l in
        "o "*) out=$out${l#o }$nl ;;
        "t "*) times=$times${l#t }$nl ;;
        "v "*) view=$view${l#v }$nl ;;
        "w "*) write=$write${l#w }$nl ;;
        *) echo "discover_hosts.sh: ${l#m }" >&2 ;;
    esac
done
if [ -z "$out" ]; then  # awk failed (or nothing is known yet): the last output, nothing saved
    out=$(cat -- "$cache" 2>/dev/null; echo .)
    out=${out%.} write=$nl
fi
printf '%s' "$out"
case $write in *"${nl}times$nl"*) save "$cache.times" "$times" ;; esac
case $write in *"${nl}view$nl"*) save "$cache.view" "$view" ;; esac
case $write in *"${nl}cache$nl"*) save "$cache" "$out" ;; esac
case $write in *"${nl}assigned$nl"*) save "$assignedfile" "$assigned$nl" ;; esac
exit 0
