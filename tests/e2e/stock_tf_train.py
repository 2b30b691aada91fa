"""A stock elastic Horovod + TensorFlow 2 training script, in the shape of the seeds' command
(Horovod's examples/elastic/tensorflow2/tensorflow2_mnist_elastic.py): the same Keras model, a
`@tf.function` training step whose tape is a `hvd.DistributedGradientTape`,
`hvd.elastic.TensorFlowKerasState(model, opt, batch=0)`, `@hvd.elastic.run`, `state.commit()`
after every batch, the learning rate rescaled on reset. It imports nothing of elastic-supervisor
and keeps no checkpoint: whatever the supervisor guarantees must hold for it as it is.

MNIST-shaped data made here (28x28x1 images, 10 classes), the same for a batch number on every
run, so nothing is downloaded (`tf.keras.datasets.mnist.load_data` would be).

Output (rank 0 only), as tests/e2e/stock_train.py's: one JSON line per batch {"step", "size",
"loss", "lr", "committed", "host", "time"} and events {"event": "reset" | "done", ...}.
--stop-file PATH: a file every rank sees, holding a batch number: training ends there (read at
every batch, so every rank stops at the same one). --sleep S: extra seconds per batch.
--hang-file PATH: the rank whose host (HOROVOD_HOSTNAME) the file holds blocks its main thread
for good at its next batch while its other threads run on.
"""

import argparse
import json
import os
import threading
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description="stock elastic Horovod + TensorFlow training")
parser.add_argument("--batches", type=int, default=400, help="batches to train in total")
parser.add_argument("--batch-size", type=int, default=16)
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

mnist_model = tf.keras.Sequential([
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
opt = tf.optimizers.Adam(args.lr * hvd.size())


def batch_of(number):
    """MNIST-shaped images and labels of batch `number`, the same on every run; the label is
    which of ten bands of rows of the image is brightest, so there is something to learn."""
    rng = np.random.default_rng(number * 1000 + hvd.rank())
    images = rng.random((args.batch_size, 28, 28, 1), dtype=np.float32)
    labels = images[:, :20, :, 0].reshape(args.batch_size, 10, -1).sum(axis=2).argmax(axis=1)
    return tf.constant(images), tf.constant(labels, tf.int64)


@tf.function
def training_step(images, labels, allreduce=True):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)
    if allreduce:
        tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))  # noqa: B905
    return loss_value


# As Horovod's example: one local step makes the model's and optimizer's variables, so that the
# state can hold them.
training_step(*batch_of(0), allreduce=False)


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


@hvd.elastic.run
def train(state):
    host = os.environ.get("HOROVOD_HOSTNAME", "")
    while state.batch < batches_to_train():
        loss_value = training_step(*batch_of(state.batch))
        if args.sleep:
            time.sleep(args.sleep)
        deadlock_if_named(host)
        state.batch += 1
        log(step=state.batch, size=hvd.size(), loss=round(float(loss_value), 6),
            lr=round(float(opt.learning_rate), 8), committed=True, host=host, time=time.time())
        state.commit()


def on_state_reset():
    opt.learning_rate.assign(args.lr * hvd.size())
    log(event="reset", size=hvd.size(), step=state.batch, time=time.time())


state = hvd.elastic.TensorFlowKerasState(mnist_model, opt, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
log(event="done", step=state.batch, size=hvd.size(), time=time.time())
