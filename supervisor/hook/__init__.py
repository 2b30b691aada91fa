"""The directory the supervisor prepends to horovodrun's PYTHONPATH (see sitecustomize.py).

It holds only `sitecustomize.py` and the `elastic_supervisor_hook` package, both loaded by the
processes horovodrun starts, on whatever Python the user's image has (3.8 to 3.13), so both use
nothing but the standard library (and psutil where it is installed, which Horovod requires; /proc
otherwise): tests/unit/test_hook_python38.py and tests/integration/test_hook_pythons.py hold them
to that. The supervisor imports `elastic_supervisor_hook.wire` from here too (one datagram
format).
"""

from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
