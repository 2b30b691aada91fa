"""horovod.tensorflow (and its Keras) in a training process: where its collectives wait.

horovod.torch ends every collective in one Python call (`synchronize`), which the hook times.
TensorFlow runs Horovod's collectives as ops, and where they run depends on the mode:
- **eagerly**, the Python function that makes a collective (`horovod.tensorflow.mpi_ops`'s
  `_allreduce`, `broadcast`, ...) returns once the op is done: it is timed like `synchronize`;
- **inside a `tf.function`** (the seeds' `@tf.function` training step, Keras's `model.fit`), those
  functions run once, while TensorFlow traces the function into a graph, and the ops run later,
  at every call, in TensorFlow's executor, out of Python's sight. So while tracing, each op is put
  between two signals (`Signals.around`): `tf.numpy_function` calls in the graph, one that runs
  once the op's inputs are there (the process waits in the collective from then on) and one once
  its outputs are (the collective completed). They are stateless numpy functions, with data
  inputs only, so TensorFlow orders them against nothing else: Horovod's ops run concurrently
  (and fuse) as without the hook. A stateful one would be chained, in program order, with every
  other stateful op that has no resource input (Horovod's own `HorovodSize` ops among them:
  TensorFlow's automatic control dependencies). A stateless one that only a control dependency
  waits for is dropped by Grappler, so the second signal returns 0, which is added to the op's
  first numeric output: a data dependency, the same values.
- **the gradients** of a step (horovod.tensorflow's `allreduce_grads`, which
  DistributedGradientTape and both DistributedOptimizers call once per step) are one wait, not
  one per tensor: the first signal runs once every gradient is computed (the process has nothing
  left to do but wait for its peers), the second once every reduced gradient is there, and that
  is a training step (progress). The collectives made inside get no signals of their own: two
  Python calls per step, whatever the number of tensors (a ResNet-50 has 161).

A graph whose collective fails (a peer lost: Horovod's op fails, TensorFlow aborts the graph)
never runs the second signal: the waits of graphs are forgotten when the failed world is left
and at the next `init` (`Signals.forget`).

Nothing here imports TensorFlow before the script did: it is handed the module.
"""

from __future__ import annotations

import functools
import itertools
import threading
from typing import Any, Callable

from .worker import Progress

# horovod.tensorflow.mpi_ops' functions that make a collective op (Horovod 0.28.1); those the
# module lacks are skipped. `broadcast_` (in place) is one too.
COLLECTIVES = ("_allreduce", "_grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
               "broadcast_", "alltoall", "_reducescatter", "_grouped_reducescatter", "join")
GRADIENTS = "_make_allreduce_grads_fn"  # horovod.tensorflow's maker of `allreduce_grads`


class GraphWait:
    """A wait token of a signal in a graph: (the site, this process's own)."""

    __slots__ = ("site",)

    def __init__(self, site: int) -> None:
        self.site = site

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GraphWait) and other.site == self.site

    def __hash__(self) -> int:
        return hash(("graph", self.site))


def is_graph_wait(token: object) -> bool:
    return isinstance(token, GraphWait)


class Signals:
    """The collectives of one TensorFlow process, timed in both modes (see the module)."""

    def __init__(self, progress: Progress, tf: Any) -> None:
        self.progress, self.tf = progress, tf
        self.sites = itertools.count(1)
        self.steps: set[int] = set()  # the sites whose completion is a training step
        self._local = threading.local()  # .quiet: inside a wait already timed (no nesting)

    # -- the callbacks the graph's signals run (in TensorFlow's executor threads) -------------

    def _entered(self, site: Any, *_: Any) -> Any:
        self.progress.begin(GraphWait(int(site)), "c")
        return site

    def _completed(self, site: Any, *_: Any) -> Any:
        number = int(site)
        self.progress.end(GraphWait(number), "c")
        if number in self.steps:
            self.progress.step()
        return site * 0  # added to an output: 0, of numpy's int64 (the op's Tout)

    # -- building ----------------------------------------------------------------------------

    def _anchors(self, values: Any) -> list[Any]:
        """One element (or none) of each tensor in `values`: a data dependency on each, not a
        copy of it."""
        tf, out = self.tf, []
        for value in tf.nest.flatten(values, expand_composites=False):
            tensor = value.values if isinstance(value, tf.IndexedSlices) else value
            if isinstance(tensor, tf.Tensor):
                out.append(tf.reshape(tensor, [-1])[:1])
        return out

    def _after(self, values: Any, zero: Any) -> Any:
        """`values` with `zero` (a signal's output, 0) added to the first numeric tensor: the
        signal runs before it is used; without one, a control dependency (Grappler may drop
        it: the signal is then lost, never the values)."""
        tf = self.tf
        pending = [True]

        def one(value: Any) -> Any:
            if isinstance(value, tf.IndexedSlices):
                return tf.IndexedSlices(one(value.values), value.indices, value.dense_shape)
            if (pending[0] and isinstance(value, tf.Tensor)
                    and (value.dtype.is_floating or value.dtype.is_integer)):
                pending[0] = False
                return value + tf.cast(zero, value.dtype)
            return value

        if isinstance(values, (list, tuple)):
            out = type(values)(one(v) for v in values)
        else:
            out = one(values)
        if pending[0]:
            with tf.control_dependencies([zero]):
                return tf.nest.map_structure(
                    lambda v: tf.identity(v) if isinstance(v, tf.Tensor) else v, out)
        return out

    def around(self, make: Callable[[], Any], inputs: Any, *, step: bool = False) -> Any:
        """While tracing: the op(s) `make` returns, between the two signals (see the module)."""
        tf = self.tf
        entry = self._anchors(inputs)
        if not entry:  # nothing to wait for (a join, a variable): the op as it is
            return make()
        site = next(self.sites)
        if step:
            self.steps.add(site)
        number = tf.constant(site, tf.int64)
        entered = tf.numpy_function(self._entered, [number, *entry], tf.int64, stateful=False,
                                    name="elastic_supervisor_entered")
        outputs = make()
        exit_anchors = self._anchors(outputs)
        completed = tf.numpy_function(self._completed, [number, entered, *exit_anchors],
                                      tf.int64, stateful=False,
                                      name="elastic_supervisor_completed")
        return self._after(outputs, completed)

    def quiet(self) -> bool:
        return bool(getattr(self._local, "quiet", False))

    def timed(self, fn: Callable[..., Any], *, step: bool = False) -> Callable[..., Any]:
        """A collective's maker (or `allreduce_grads` with `step`): timed in Python when it
        runs eagerly, put between signals while it is traced; inside another timed one, left
        alone (the outer one is the wait)."""
        tf, progress = self.tf, self.progress

        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if self.quiet():
                return fn(*args, **kwargs)
            self._local.quiet = True
            try:
                if tf.executing_eagerly():
                    token = object()
                    progress.begin(token, "c")
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException:
                        progress.end(token, "c", completed=False)
                        raise
                    progress.end(token, "c")
                    if step:
                        progress.step()
                    return result
                inputs = args[0] if args else next(iter(kwargs.values()), None)
                return self.around(lambda: fn(*args, **kwargs), inputs, step=step)
            finally:
                self._local.quiet = False

        return collective

    def forget(self) -> None:
        """The graphs' waits in progress will never complete (their world failed)."""
        self.progress.forget(is_graph_wait)


def patch_ops(mpi_ops: Any, signals: Signals) -> list[str]:
    """Time horovod.tensorflow.mpi_ops' collectives; return those wrapped."""
    done = []
    for name in COLLECTIVES:
        fn = getattr(mpi_ops, name, None)
        if callable(fn):
            setattr(mpi_ops, name, signals.timed(fn))
            done.append(name)
    return done


def patch_gradients(package: Any, signals: Signals) -> None:
    """horovod.tensorflow's `_make_allreduce_grads_fn` hands out `allreduce_grads` timed as one
    wait and one step (DistributedGradientTape, both DistributedOptimizers)."""
    make = getattr(package, GRADIENTS, None)
    if not callable(make):
        raise RuntimeError(f"horovod.tensorflow.{GRADIENTS} not found: steps are not counted "
                           "(each collective is still timed)")

    @functools.wraps(make)
    def make_allreduce_grads(*args: Any, **kwargs: Any) -> Any:
        return signals.timed(make(*args, **kwargs), step=True)

    setattr(package, GRADIENTS, make_allreduce_grads)
