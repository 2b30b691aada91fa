#!/bin/sh
# Horovod host discovery for elastic-supervisor. horovodrun runs this about once a second while
# holding its host-update lock, so it must stay trivial: it only prints the file the supervisor
# rewrites atomically. The supervisor removes the file while its cluster view is not synced or
# is stale; cat then fails, and horovodrun keeps its previous host set instead of seeing "no hosts".
exec cat -- "${SUPERVISOR_DISCOVERY_FILE:-/etc/edl/hostfile}"
