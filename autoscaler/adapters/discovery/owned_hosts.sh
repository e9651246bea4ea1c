#!/bin/sh
# Horovod host discovery for standalone jobs, shipped by spot-autoscaler (owned mode).
#
# The daemon owns the whole file and writes it atomically, validated and guarded, so printing it
# is all there is to do. Exit 0 even before the file exists: Horovod ends the job if the first
# call fails, and an empty output only makes it wait for hosts.
#
# usage: owned_hosts.sh [FILE]   FILE defaults to $SPOT_HOSTS_FILE, else
#                                /var/lib/spot-autoscaler/hosts
cat "${1:-${SPOT_HOSTS_FILE:-/var/lib/spot-autoscaler/hosts}}" 2>/dev/null
exit 0
