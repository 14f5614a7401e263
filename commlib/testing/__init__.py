"""Tools for testing commlib beyond one host: an emulated cluster (:mod:`commlib.testing.cluster`).

Nothing here is imported by ``import commlib``."""
