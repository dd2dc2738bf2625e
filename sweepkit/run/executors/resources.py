"""What a cluster contributes to one cell's SLURM job: the value ``sweep_job_resources`` returns.

The SLURM executor asks the hook once per cell, as it binds the cell's job, and keeps the
answer for everything it derives from it (the job request, the container wrapper and
interpreter of the command, the check that compute nodes see the driver's interpreter).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


def _tuple(value) -> tuple:
    return tuple(value or ())


def _mapping(value) -> dict:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class JobResources:
    """A cluster's pieces of one cell's job script. A field left None (or empty) keeps what
    the cell's own launch keys say.

    ``nodes``, ``gpus_per_node``, ``time_limit`` (``[D-]HH:MM:SS``), ``account``,
    ``partition``, ``qos``: the job's request; ``preamble``: shell lines run before the
    command (``#SBATCH`` lines among them go to the header); ``env``: variables exported in
    the script, quoted; ``argv_prefix``: a container wrapper put before the cell's command;
    ``python``: the interpreter that replaces ``{python}`` in the target's argv;
    ``ray_bringup``: a bash fragment starting Ray over the job's nodes;
    ``shared_filesystems``: directories every compute node sees (the interpreter ``srun``
    starts for submitit, the driver's own, must live under one); ``node_local_filesystems``:
    those each node has its own of (``/tmp``), where it must not; ``cluster``: the
    cluster's name, for messages.
    """

    cluster: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    time_limit: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    preamble: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_mapping)
    argv_prefix: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    python: str | None = None
    ray_bringup: str | None = None
    shared_filesystems: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    node_local_filesystems: tuple[str, ...] = attrs.field(default=(), converter=_tuple)

    @classmethod
    def of(cls, answer) -> "JobResources | None":
        """A ``sweep_job_resources`` answer as JobResources: None stays None, a JobResources
        is taken as it is. Until every cluster plugin returns this class, an answer of
        another class (``sweepkit_plugins.clusters.JobPieces``, a sweepconf's own frozen
        value) is read field by field, by these names; the fields it lacks keep their
        defaults."""
        if answer is None or isinstance(answer, cls):
            return answer
        fields = {field.name for field in attrs.fields(cls)}
        return cls(**{name: getattr(answer, name) for name in fields if getattr(answer, name, None) is not None})
