"""elastic-supervisor's hook, loaded at start-up by the Python processes horovodrun starts.

The supervisor prepends this directory to horovodrun's PYTHONPATH (keeping the user's), and
horovodrun forwards its environment to every worker it starts over ssh: so Python runs this file
in horovodrun's own process (the elastic driver) and in every training process, with no change to
the training script. It first runs the sitecustomize this one hides (the next one on sys.path,
e.g. Debian's), then, only where the supervisor set ELASTIC_SUPERVISOR_HOOK_PORT, hands over to
the `elastic_supervisor_hook` package next to it (its `role` alone decides from the rest of the
environment, the key or the key file included: one place), whose import hook patches Horovod
modules when they are first imported (see that package). Any other process is left as it was.
Nothing here raises: a problem is one line on stderr.
"""

import os
import sys


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path after this directory, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_elastic_supervisor_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _install() -> None:
    if not os.environ.get("ELASTIC_SUPERVISOR_HOOK_PORT"):
        return  # not started by the supervisor's horovodrun: no need to import anything
    import elastic_supervisor_hook

    elastic_supervisor_hook.install()


for _step in (_chain, _install):
    try:
        _step()
    except Exception as _e:  # never break a process at start-up
        print(f"elastic-supervisor hook: {_step.__name__.strip('_')} failed: "
              f"{type(_e).__name__}: {_e}", file=sys.stderr, flush=True)
