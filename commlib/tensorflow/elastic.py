"""``horovod.tensorflow.elastic`` is not provided: commlib has no elastic driver for TensorFlow yet."""


def __getattr__(name):
    raise NotImplementedError(f"commlib.tensorflow.elastic.{name}: elastic training is not supported for "
                              "TensorFlow; run a fixed number of ranks")
