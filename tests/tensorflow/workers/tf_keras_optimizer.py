"""commlib.tensorflow.keras on tf-keras (TF_USE_LEGACY_KERAS=1) and Keras 3 (unset): gradient accumulation
(backward_passes_per_step) in model.fit against one process on the combined batch, the passes counter,
local variables and PartialDistributedOptimizer, and a model trained with commlib saved and loaded back
(Keras file and SavedModel)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tensorflow as tf

import commlib.tensorflow.keras as hvd
import spmd
from spmd import expect_error

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
STEPS, BATCH, FEATURES = 4, 6, 5


def model_and_data(seed=0):
    tf.random.set_seed(seed)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype(np.float32)
    y = rng.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
    return model, x, y


def check_fit_accumulation(me, n, average, optimizer=None):
    """Two passes per rank reduced once and applied every other step: one process's step on the four
    batches combined (learning rate doubled when the passes are summed)."""
    per_rank = BATCH // n
    model, x, y = model_and_data(0)
    reference, _, _ = model_and_data(0)
    hvd.broadcast_variables(model.variables, root_rank=0)  # unseeded initializers differ between processes
    reference.set_weights(model.get_weights())
    opt = hvd.DistributedOptimizer(optimizer or keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss="mse")
    order = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[me::n][:per_rank] for s in range(STEPS)])
    model.fit(x[order], y[order], batch_size=per_rank, epochs=1, shuffle=False, verbose=0)
    combined = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[r::n][:per_rank]
                               for s in range(STEPS) for r in range(n)])
    reference.compile(optimizer=keras.optimizers.SGD(0.1 if average else 0.2), loss="mse")
    reference.fit(x[combined], y[combined], batch_size=2 * per_rank * n, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        assert np.allclose(a, b, atol=1e-5), (f"backward_passes_per_step=2 average={average}: weights differ "
                                              f"from one process: {np.abs(a - b).max()}")
    if LEGACY:
        assert int(opt._agg_helper.counter.numpy()) == 0, opt._agg_helper.counter
        assert int(opt.iterations.numpy()) == STEPS, opt.iterations


def check_counter_and_local_vars(me, n):
    """tf-keras: three passes of three: nothing applied until the third; a local variable keeps its own
    gradient (divided by the ranks), a shared one gets the sum over passes averaged over ranks."""
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=3)
    shared, local = tf.Variable([0.0]), tf.Variable([0.0])
    opt.register_local_var(local)

    @tf.function
    def step():
        pairs = opt._compute_gradients(lambda: (me + 1.0) * (shared[0] + local[0]), var_list=[shared, local])
        opt.apply_gradients(pairs)

    for i in range(3):
        step()
        assert int(opt._agg_helper.counter.numpy()) == (i + 1) % 3, (i, opt._agg_helper.counter)
        assert int(opt.iterations.numpy()) == i + 1, (i, opt.iterations)
        if i < 2:
            assert shared.numpy()[0] == 0.0 and local.numpy()[0] == 0.0, (i, shared, local)
    mean = sum(r + 1.0 for r in range(n)) / n
    assert np.isclose(shared.numpy()[0], -3 * mean), (shared.numpy(), -3 * mean)
    assert np.isclose(local.numpy()[0], -3 * (me + 1.0) / n), (local.numpy(), -3 * (me + 1.0) / n)


def check_partial(me, n):
    """PartialDistributedOptimizer: the local layer's gradients stay this rank's (over the ranks), the
    others are averaged."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.set_weights([np.full(w.shape, float(me + 1), np.float32) for w in model.get_weights()])
    x = np.ones((2, 3), np.float32)
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x))
    plain = tape.gradient(loss, model.trainable_weights)
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[model.layers[0]])
    pairs = opt._compute_gradients(loss, model.trainable_weights, tape=tape)
    everyone = hvd.allgather_object([g.numpy() for g in plain])
    for i, (g, v) in enumerate(pairs):
        if i < 2:  # the first layer's kernel and bias
            assert np.allclose(g.numpy() * n, plain[i].numpy()), (v.name, g, plain[i])
        else:
            assert np.allclose(g.numpy(), np.mean([e[i] for e in everyone], axis=0)), (v.name, g)


def check_save_and_load(me, n):
    """A model trained with the distributed optimizer saves as a Keras file and as a SavedModel (its
    forward pass holds no commlib op) and loads back with the same predictions; load_model re-wraps its
    optimizer."""
    model, x, y = model_and_data(0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    expected = model.predict(x, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = hvd.load_model(path)
        assert np.allclose(loaded.predict(x, verbose=0), expected, atol=1e-6)
        assert type(loaded.optimizer).__name__ == "Adam", type(loaded.optimizer)
        loaded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # trains on, distributed
        saved = os.path.join(tmp, "saved")
        tf.saved_model.save(model, saved) if LEGACY else model.export(saved)
        served = tf.saved_model.load(saved)
        fn = served.signatures["serving_default"]
        out = list(fn(tf.constant(x)).values())[0]
        assert np.allclose(out.numpy(), expected, atol=1e-5)


def check_elastic_state(me, n):
    """KerasState: sync gives rank 0's weights and values, restore goes back to the last commit."""
    model, x, y = model_and_data(me)
    model.set_weights([np.full(w.shape, float(me), np.float32) for w in model.get_weights()])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=20 + me)
    state.sync()
    assert state.batch == 20 and all(np.all(w == 0.0) for w in model.get_weights()), state.batch
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    trained = model.get_weights()
    state.batch = 21
    state.commit()
    model.set_weights([np.full(w.shape, 5.0, np.float32) for w in model.get_weights()])
    state.batch = 22
    state.restore()
    assert state.batch == 21, state.batch
    for a, b in zip(model.get_weights(), trained):
        assert np.array_equal(a, b), "restore did not bring back the committed weights"


def check_fit_accumulation_averaged(me, n):
    check_fit_accumulation(me, n, True)


def check_fit_accumulation_summed(me, n):
    check_fit_accumulation(me, n, False)


def check_fit_accumulation_optimizer_v2(me, n):
    check_fit_accumulation(me, n, True, keras.optimizers.legacy.SGD(0.1))


def check_partial_refused_on_keras3(me, n):
    expect_error(NotImplementedError, "tf-keras", lambda: hvd.PartialDistributedOptimizer(
        keras.optimizers.SGD(0.1)), "PartialDistributedOptimizer on Keras 3")


@spmd.case
def init():
    hvd.init()


spmd.rank_cases(lambda: (hvd.rank(), hvd.size()), check_fit_accumulation_averaged, check_fit_accumulation_summed,
                check_fit_accumulation_optimizer_v2, check_counter_and_local_vars, check_partial,
                check_partial_refused_on_keras3, check_save_and_load, check_elastic_state)


@spmd.case
def shutdown():
    hvd.shutdown()


#: the cases of tf-keras alone, and of Keras 3 alone
LEGACY_ONLY = ["fit_accumulation_optimizer_v2", "counter_and_local_vars", "partial"]
KERAS3_ONLY = ["partial_refused_on_keras3"]

if __name__ == "__main__":
    spmd.main([c for c in spmd.names() if c not in (KERAS3_ONLY if LEGACY else LEGACY_ONLY)])
