"""Run in the TensorFlow environment (scripts/build-tf-env.sh) by bench/tf_hook.py: what the hook
adds to a step of tests/e2e/stock_tf_train.py (the seeds' shape), measured in one process.

- the step: the stock script's model (the seeds' MNIST model) and its `@tf.function` step with
  a DistributedGradientTape, batch 16, one process (`hvd.init()` alone: the allreduces take
  Horovod's size-1 branch), timed over STEPS steps after a warm-up;
- the hook's part of it: the two signals `tfwait` puts around a step's gradients (one
  `allreduce_grads` call), measured as the difference between a `tf.function` that passes the
  model's gradient-shaped tensors through `Signals.timed(fn, step=True)` and the same function
  without it, interleaved, BLOCKS blocks of CALLS calls each; the median difference per call.

Prints one JSON object. Standard library, tensorflow, horovod and the hook package only.
"""

import json
import statistics
import sys
import time

import horovod.tensorflow as hvd
import tensorflow as tf
from elastic_supervisor_hook import tfwait, worker

STEPS = 200
WARMUP = 20
BLOCKS = 15
CALLS = 200

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
hvd.init()
model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu", input_shape=(28, 28, 1)),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])
loss = tf.losses.SparseCategoricalCrossentropy()
opt = tf.optimizers.Adam(0.001)
images = tf.random.uniform((16, 28, 28, 1))
labels = tf.random.uniform((16,), maxval=10, dtype=tf.int64)


@tf.function
def training_step(x, y):
    with tf.GradientTape() as tape:
        loss_value = loss(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905
    return loss_value


for _ in range(WARMUP):
    training_step(images, labels)
times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    training_step(images, labels).numpy()
    times.append(time.perf_counter() - t0)
step_s = statistics.median(times)

grads = [tf.ones_like(v) for v in model.trainable_variables]
signals = tfwait.Signals(worker.Progress(), tf)


def passed(tensors, *_):
    return [t * 1.0 for t in tensors]


timed = signals.timed(passed, step=True)


@tf.function
def bare(tensors):
    return passed(tensors)


@tf.function
def hooked(tensors):
    return timed(tensors)


def block(fn):
    fn(grads)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn(grads)[0].numpy()
    return (time.perf_counter() - t0) / CALLS


diffs = []
for _ in range(BLOCKS):
    diffs.append(block(hooked) - block(bare))
per_step = max(0.0, statistics.median(diffs))
steps_counted = signals.progress.steps
json.dump({
    "tensorflow": tf.__version__,
    "stock_step_ms": round(step_s * 1e3, 3),
    "stock_step_ms_max": round(max(times) * 1e3, 3),
    "gradient_tensors": len(grads),
    "signals_us_per_step": round(per_step * 1e6, 1),
    "signals_us_per_step_max": round(max(diffs) * 1e6, 1),
    "percent_of_a_stock_step": round(100 * per_step / step_s, 3),
    "steps_counted_by_signals": steps_counted,
}, sys.stdout)
print()
