"""A pickle that, if it is ever loaded, leaves a file behind: what the hostile-peer tests (tests/server/) and
their MPI workers send to summation servers."""

import pickle


class Planted:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def planted(path) -> bytes:
    """The pickle's bytes; loading them creates ``path``."""
    return pickle.dumps(Planted(path))
