"""The walk runs on the local Slurm cluster too: the same session fixture the Slurm tests use."""

from tests.slurm.conftest import slurm_cluster  # noqa: F401  (a fixture, found by name)
