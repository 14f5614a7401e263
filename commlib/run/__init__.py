"""commlib-run: start a job on MPI with horovodrun's flags (docs/launcher.md).

``commlib-run -np 4 -H a:2,b:2 --timeline-filename t.json python train.py`` finds the MPI (MPICH's hydra or
Open MPI), checks that every host answers ssh, builds that MPI's command line with the settings as
``COMMLIB_*`` variables for every rank, prints it and runs it. ``--emulate 2x2 --link-rate 1gbit`` runs it
on an emulated cluster on this machine instead (:mod:`commlib.testing.cluster`).

- :mod:`.options`: the flags, and the settings and warnings they give;
- :mod:`.hosts`: ``-H`` and ``--hostfile``, and the ssh check;
- :mod:`.mpi`: which MPI, and its command line (pure: golden-tested for both flavours);
- :mod:`.output`: what every rank is started through, so that its lines arrive whole and labelled;
- :mod:`.launch`: ``main``.
"""

from .launch import main

__all__ = ["main"]
