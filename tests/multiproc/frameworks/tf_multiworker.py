"""A ``tf.distribute.MultiWorkerMirroredStrategy`` program as TensorFlow's multi-worker guide
writes its custom training loop (the Alliance TensorFlow page's tensorflow-multiworker.py trains
the same way with ``model.fit``; Keras 3, which TensorFlow >= 2.16 ships, refuses that under
this strategy): the workers come from ``TF_CONFIG`` (none: one worker, the reference run), the
variables are made in ``strategy.scope()``, the dataset is batched with the global batch size and
distributed, and each step runs ``strategy.run`` and sums the replicas' gradients.

argv: OUT_DIR [--epochs N] [--batch_size B (global)]. Writes OUT_DIR/tf-<index>.json: the worker's
index, the replicas in sync, its flattened trained weights and the last loss."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description="MultiWorkerMirroredStrategy test")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
with strategy.scope():   # the same start on every worker (and the strategy broadcasts it)
    conv = tf.Variable(rng.standard_normal((3, 3, 3, 4)).astype("float32") * 0.3, name="conv")
    dense = tf.Variable(rng.standard_normal((4 * 4 * 4, 10)).astype("float32") * 0.1, name="dense")
    bias = tf.Variable(np.zeros(10, "float32"), name="bias")
weights = [conv, dense, bias]


def logits(x):
    h = tf.nn.relu(tf.nn.conv2d(x, conv, strides=1, padding="SAME"))
    h = tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
    return tf.matmul(tf.reshape(h, (-1, 4 * 4 * 4)), dense) + bias


data = np.random.default_rng(1)
x = data.standard_normal((256, 8, 8, 3)).astype("float32")
y = ((x.sum(axis=(1, 2, 3)) > 0).astype("int64") + 2 * (x[:, 0, 0, 0] > 0)).astype("int64")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).with_options(options)
batches = strategy.experimental_distribute_dataset(dataset)


@tf.function
def step(inputs):
    def replica_step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits(images))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch_size)
        grads = tape.gradient(loss, weights)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        for w, g in zip(weights, grads):
            w.assign_sub(args.lr * g)
        return loss

    losses = strategy.run(replica_step, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


loss = None
for epoch in range(args.epochs):
    for inputs in batches:
        loss = step(inputs)

resolver = strategy.cluster_resolver
index = resolver.task_id if resolver is not None and resolver.task_id is not None else 0
flat = np.concatenate([w.numpy().reshape(-1) for w in weights]).astype("float64")
with open(os.path.join(args.out, f"tf-{index}.json"), "w") as fh:
    json.dump({"index": int(index), "workers": int(strategy.num_replicas_in_sync),
               "weights": flat.tolist(), "loss": float(loss)}, fh)
