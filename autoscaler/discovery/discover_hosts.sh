#!/bin/sh
# Horovod host discovery for et-operator jobs, shipped by spot-autoscaler (overlay mode).
#
# Prints et-operator's hostfile minus the hosts spot-autoscaler drained, so Horovod removes a
# doomed host gracefully (no rollback) before its pod goes. Horovod runs this every second and
# ends the job if the first call fails, so it always exits 0, and:
#   - while the hostfile is missing, empty, unterminated (the operator rewrites it in place with
#     `echo ... > hostfile`) or holds no valid line, it prints the last good output again;
#   - it prints only lines Horovod parses as meant (`^[A-Za-z0-9_.-]+:[0-9]+$`, slots > 0), the
#     first of a repeated host, and never blank lines or comments (`# x` would be a host);
#   - the output always shares a host with the previous output, or Horovod stops the job: if the
#     drain list hides every previous host, the first of them still in the hostfile stays (or
#     the first previous host, if the operator dropped them all) until newer hosts are shown;
#   - with no previous output and every host drained, the first host stays.
# Builtins only (no fork), except one `mv` when the output changes.
#
# SPOT_HOSTFILE    et-operator's hostfile               default /etc/edl/hostfile
# SPOT_DRAIN_FILE  hosts to hide, one per line          default /etc/edl/drained-hosts
# SPOT_CACHE_FILE  the last output (remove it before    default /etc/edl/last-hosts
#                  starting horovodrun: it belongs to one run)

hostfile=${SPOT_HOSTFILE:-/etc/edl/hostfile}
drainfile=${SPOT_DRAIN_FILE:-/etc/edl/drained-hosts}
cache=${SPOT_CACHE_FILE:-/etc/edl/last-hosts}
nl='
'
set -f  # host names are data, never glob patterns

# valid LINE: true when LINE is `hostname:slots` as Horovod's strict parser reads it; sets
# $host and $slots. Character lists are spelled out: ranges depend on the locale.
valid() {
    case $1 in
        *:*:* | :* | *:) return 1 ;;
        *:*) ;;
        *) return 1 ;;
    esac
    host=${1%:*}
    slots=${1#*:}
    case $host in *[!ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-]*) return 1 ;; esac
    case $slots in *[!0123456789]*) return 1 ;; esac
    case $slots in *[123456789]*) return 0 ;; esac
    return 1  # zero slots: no process could start there
}

# read_hosts FILE: $lines = its valid lines, `host:slots\n` each, first of a repeated host only;
# $names = "\nhost\nhost\n" for membership tests; $first = the first line;
# $complete = yes unless FILE is unreadable or its last line is unterminated.
read_hosts() {
    lines='' names=$nl first='' complete=no line=''
    [ -r "$1" ] || return 0
    while read -r line; do  # default IFS: surrounding blanks are dropped, as hostnames have none
        valid "$line" || continue
        case $names in *"$nl$host$nl"*) continue ;; esac
        names=$names$host$nl
        lines=$lines$host:$slots$nl
        [ -n "$first" ] || first=$host:$slots
    done < "$1"
    [ -n "$line" ] || complete=yes  # read leaves an unterminated last line in $line
}

# line_of LINES HOST: sets $found to HOST's line in LINES, or to '' when it is not there.
line_of() {
    all=$nl$1
    rest=${all#*"$nl$2:"}
    if [ "$rest" = "$all" ]; then found=''; else found=$2:${rest%%"$nl"*}; fi
}

drained=$nl
if [ -r "$drainfile" ]; then
    while read -r d || [ -n "$d" ]; do drained=$drained$d$nl; done < "$drainfile"
fi

read_hosts "$cache"
prev=$lines prev_names=$names prev_first=$first

read_hosts "$hostfile"
if [ "$complete" = no ] || [ -z "$lines" ]; then
    if [ -z "$prev" ] && [ "$complete" = no ]; then
        echo "discover_hosts.sh: $hostfile is missing or lacks its final newline" >&2
    fi
    printf '%s' "$prev"
    exit 0
fi

out='' shares=no
IFS=$nl
for l in $lines; do
    case $drained in *"$nl${l%:*}$nl"*) continue ;; esac
    out=$out$l$nl
    case $prev_names in *"$nl${l%:*}$nl"*) shares=yes ;; esac
done
if [ -n "$prev" ] && [ "$shares" = no ]; then
    keep=$prev_first
    for l in $prev; do
        line_of "$lines" "${l%:*}"
        if [ -n "$found" ]; then keep=$found; break; fi
    done
    out=$keep$nl$out
fi
[ -n "$out" ] || out=$first$nl

printf '%s' "$out"
if [ "$out" != "$prev" ]; then
    { printf '%s' "$out" > "$cache.$$" && mv -f "$cache.$$" "$cache"; } 2>/dev/null || rm -f "$cache.$$"
fi
exit 0
