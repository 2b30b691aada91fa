"""The directory the supervisor prepends to horovodrun's PYTHONPATH (see sitecustomize.py).

It holds only `sitecustomize.py` and the `elastic_supervisor_hook` package, both loaded by the
processes horovodrun starts, so both use nothing but the standard library and psutil. The
supervisor imports `elastic_supervisor_hook.wire` from here too (one datagram format).
"""

from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
