"""A stock elastic Horovod + Keras training script, in the shape of Horovod's
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py: `model.fit` with
`hvd.DistributedOptimizer`, `hvd.elastic.KerasState`, and Horovod's elastic callbacks
(`CommitStateCallback`, `UpdateBatchStateCallback`, `UpdateEpochStateCallback`) under
`@hvd.elastic.run`, the learning rate rescaled on reset. It imports nothing of
elastic-supervisor and keeps no checkpoint.

MNIST-shaped data made here, nothing downloaded. A callback of the script's own counts the
batches trained in the state (`state.step`, committed with it, so it rolls back with the model)
and prints rank 0's, as tests/e2e/stock_train.py does: one JSON line per batch {"step", "size",
"loss", "lr", "committed", "host", "time"} and events {"event": "reset" | "done", ...}.
--stop-file PATH: a file every rank sees, holding a batch number: training ends there.
--hang-file PATH: the rank whose host (HOROVOD_HOSTNAME) the file holds blocks its main thread
for good at its next batch's end (in a callback, between two `tf.function` steps) while its
other threads run on.
"""

import argparse
import json
import os
import threading
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description="stock elastic Horovod + Keras training")
parser.add_argument("--batches", type=int, default=400, help="batches to train in total")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--steps-per-epoch", type=int, default=50)
parser.add_argument("--batches-per-commit", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.001)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds of extra work per batch")
parser.add_argument("--stop-file", default=None, help="a file holding the batch to end at")
parser.add_argument("--hang-file", default=None, help="a file holding the host whose rank "
                    "deadlocks")
args = parser.parse_args()

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
hvd.init()
tf.random.set_seed(42)


def batches():
    """MNIST-shaped batches, endless; the label is the brightest of ten bands of the image."""
    rng = np.random.default_rng(1000 + hvd.rank())
    while True:
        images = rng.random((args.batch_size, 28, 28, 1), dtype=np.float32)
        labels = images[:, :20, :, 0].reshape(args.batch_size, 10, -1).sum(axis=2).argmax(axis=1)
        yield images, labels


dataset = tf.data.Dataset.from_generator(
    batches, output_signature=(tf.TensorSpec((None, 28, 28, 1), tf.float32),
                               tf.TensorSpec((None,), tf.int64)))

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
opt = hvd.DistributedOptimizer(tf.optimizers.Adam(args.lr * hvd.size()))
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"], experimental_run_tf_function=False)
# As Horovod's example ("initialize optimizer state so we can synchronize across workers": Keras
# makes the optimizer's slot variables at its first step): without them a worker that joins
# broadcasts 1 optimizer variable where the others broadcast 17, and the new world's first sync
# waits forever (seen on real nodes). The example makes them with a one-step fit; build() makes
# the same ones locally, with no collective.
opt.build(model.trainable_variables)


def log(**fields):
    if hvd.rank() == 0:
        print(json.dumps(fields), flush=True)


def batches_to_train():
    if args.stop_file:
        try:
            with open(args.stop_file) as f:
                return min(args.batches, int(f.read()))
        except (OSError, ValueError):
            pass
    return args.batches


def deadlock_if_named(host):
    if not args.hang_file:
        return
    try:
        with open(args.hang_file) as f:
            named = f.read().strip()
    except OSError:
        return
    if named and named == host:
        print(f"rank {hvd.rank()} on {host}: deadlocking", flush=True)
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()


class Steps(tf.keras.callbacks.Callback):
    """The script's own: count and print each batch, stop at the target."""

    def on_train_batch_end(self, batch, logs=None):
        if args.sleep:
            time.sleep(args.sleep)
        deadlock_if_named(os.environ.get("HOROVOD_HOSTNAME", ""))
        state.step += 1
        committed = state.step % args.batches_per_commit == 0
        log(step=state.step, size=hvd.size(), loss=round(float(logs["loss"]), 6),
            lr=round(float(self.model.optimizer.learning_rate), 8), committed=committed,
            host=os.environ.get("HOROVOD_HOSTNAME", ""), time=time.time())
        if state.step >= batches_to_train():
            self.model.stop_training = True


def on_state_reset():
    tf.keras.backend.set_value(model.optimizer.learning_rate, args.lr * hvd.size())
    log(event="reset", size=hvd.size(), step=state.step, time=time.time())


state = hvd.elastic.KerasState(model, batch=0, epoch=0, step=0)
state.register_reset_callbacks([on_state_reset])
callbacks = [
    hvd.callbacks.MetricAverageCallback(),
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    Steps(),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
]


@hvd.elastic.run
def train(state):
    epochs = -(-args.batches // args.steps_per_epoch)
    if state.step < batches_to_train() and state.epoch < epochs:
        state.model.fit(dataset, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks,
                        epochs=epochs - state.epoch, verbose=0)


train(state)
log(event="done", step=state.step, size=hvd.size(), time=time.time())
