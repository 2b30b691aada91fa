"""The decisions: pure functions of what was seen, the memory and the settings.

Nothing in this package does I/O, reads a clock, starts a thread or imports an adapter (the
Kubernetes client, the hook channel's sockets, processes, files): the import contract in
`scripts/layers.py` checks it in `make lint`. The adapters (`supervisor/kube/`,
`supervisor/actuator.py`, `supervisor/channel.py`, ...) import from here, never the reverse.
"""
