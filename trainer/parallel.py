"""One run over several processes of one node: the launcher, the process group, FSDP2.

Launch
------
A run of N processes (``num_gpus`` on CUDA, ``num_cpu_ranks`` on the CPU; see
:func:`world_size`) is still one command: ``python -m trainer`` checks the config and
the checkpoint directory, then :func:`launch` starts N copies of itself with the
variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` on a free port), forwards stop signals to them, and exits with the
code of the first rank that failed (the others get :data:`FAILURE_GRACE_S` to end
by themselves, then are killed); a rank dies with its launcher. Started by torchrun
instead, the trainer finds those variables and runs as that rank. Rank r trains on
``cuda:r`` (NCCL) or on the CPU (gloo).

Sharding
--------
The policy is sharded with FSDP2 (``fully_shard``): each decoder layer is one unit,
and :class:`ShardedPolicy` the root. The root's forward is the training forward of
``trainer.forward``, which runs the transformer body and then reads the head's
weight directly (tied to the embeddings in the small Qwen models); only a root whose
own forward does both gathers the embeddings, final norm and head and reduce-scatters
their gradients. Master weights, gradients and AdamW state are fp32, each rank keeping
1/N of them; on CUDA the units gather bf16 copies to compute with and reduce gradients
in fp32 (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``), so a
norm's weight is bf16 in the forward where one device's autocast keeps it fp32; on
the CPU everything is fp32. ``reshard_after_forward`` is the config's.

The full policy
---------------
Every rank also keeps the policy unsharded (the plain module the model was loaded
as), refreshed from the shards after each update by :func:`gather_weights`: its own
rollout engine samples from it (colocated, one engine per rank, TP1), the no-grad
scorers (pi_old, the OPD student's log-probs) read it, and rank 0 writes checkpoints
and the export from it in the one-device format. That costs one full fp32 copy of the
weights per process; an engine that took gathered tensors layer by layer in its weight
sync would not need it.

Batches
-------
A step's prompts are split in whole groups (a group is one prompt's n samples), so
group advantages are those of one device: :meth:`Group.share` gives every rank the
same number of consecutive prompts of each mini-batch, hence the ranks' mini-batch j
together are the one-device mini-batch j, and every rank runs as many forwards and
backwards (each a collective) as the others. Losses are normalised by per-rank shares
of the whole mini-batch's totals (``trainer.update``), so the mean of the ranks'
gradients that FSDP's reduce-scatter takes is the one-device gradient.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn, Optional, Sequence

import attrs
import torch
import torch.distributed as dist

from trainer.config import ConfigError
from trainer.forward import response_logprobs
from trainer.stopping import SIGNALS

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
FAILURE_GRACE_S = 30.0  # a failed rank's peers wait in a collective; this long, then they are killed
POLL_S = 0.1
_PR_SET_PDEATHSIG = 1


def uses_cuda(cfg) -> bool:
    """Whether the run trains on CUDA: ``device='cuda'``, or ``'auto'`` with GPUs asked for and present."""
    return cfg.device == "cuda" or (cfg.device == "auto" and cfg.num_gpus > 0 and torch.cuda.is_available())


def world_size(cfg) -> int:
    """Processes the run trains on: ``num_gpus`` on CUDA (at least one), ``num_cpu_ranks`` on the CPU."""
    return max(cfg.num_gpus, 1) if uses_cuda(cfg) else cfg.num_cpu_ranks


def check_layout(cfg, world: int) -> None:
    """Raise :class:`ConfigError` when ``world`` processes cannot split the config's batches."""
    if world == 1:
        return
    key = "num_gpus" if uses_cuda(cfg) else "num_cpu_ranks"
    if cfg.policy_mini_batch_size % world:
        raise ConfigError(
            f"policy_mini_batch_size: {cfg.policy_mini_batch_size} prompts do not split into {key}={world} equal "
            f"shares of whole groups; use a multiple of {world}")
    if uses_cuda(cfg) and world > torch.cuda.device_count():
        raise ConfigError(f"num_gpus: {world} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s)")


def started_as_rank() -> bool:
    """Whether this process is one rank of a launched run (by :func:`launch` or torchrun)."""
    return all(name in os.environ for name in RANK_VARIABLES)


def env_rank() -> int:
    return int(os.environ["RANK"]) if started_as_rank() else 0


@attrs.frozen(kw_only=True)
class Group:
    """This process's place in the run; every method is a no-op (or the identity) for one process.

    Each method that communicates is a collective: every rank calls it, in the same order.
    """

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")  # where the collectives' tensors live (CUDA for NCCL)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def share(self, items: Sequence, chunk: int) -> list:
        """This rank's items: its 1/world of each consecutive ``chunk`` of ``items``."""
        if not self.distributed:
            return list(items)
        own = chunk // self.world
        return [item for start in range(0, len(items), chunk)
                for item in items[start + self.rank * own : start + (self.rank + 1) * own]]

    def seed(self, seed: int) -> int:
        """A seed of this rank's own, from the run's (the same seed on one process)."""
        return seed * self.world + self.rank

    def sum_floats(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max_floats(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def agree(self, signum: Optional[int]) -> Optional[int]:
        """The stop signal any rank received (ranks stop at the same step, or the collectives would hang)."""
        if not self.distributed:
            return signum
        agreed = int(self.max_floats([float(signum or 0)])[0])
        return agreed or None

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """The ranks' equally long tensors, concatenated in rank order along dim 0."""
        if not self.distributed:
            return tensor
        local = tensor.to(self.device)
        parts = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(parts, local)
        return torch.cat(parts).to(tensor.device)

    def gather_objects(self, value) -> list:
        """Every rank's ``value`` (picklable), in rank order."""
        if not self.distributed:
            return [value]
        values = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


SINGLE = Group()


@contextlib.contextmanager
def process_group(cfg):
    """This process's :class:`Group`: the whole run for one process, else one rank of a
    launched run, its process group set up for the block and torn down after it."""
    world = world_size(cfg)
    if world == 1:
        yield SINGLE
        return
    key = "num_gpus" if uses_cuda(cfg) else "num_cpu_ranks"
    if not started_as_rank():
        raise ConfigError(f"{key}: {world} processes are asked for, but this process is not one of a launched run; "
                          f"start it with `python -m trainer` (which starts one process per rank) or torchrun")
    launched = int(os.environ["WORLD_SIZE"])
    if launched != world:
        raise ConfigError(f"{key}: the config asks for {world} processes, but this run was launched with "
                          f"WORLD_SIZE={launched}")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if uses_cuda(cfg):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield Group(rank=rank, world=world, device=device)
    finally:
        dist.destroy_process_group()


# -- the sharded policy -----------------------------------------------------------------------


class ShardedPolicy(torch.nn.Module):
    """The root FSDP2 unit: its forward is :func:`trainer.forward.response_logprobs` of ``model``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch, temperature: float, *, with_entropy: bool = False):
        return response_logprobs(self.model, batch, temperature, with_entropy=with_entropy)


def shard(model: torch.nn.Module, cfg, group: Group) -> ShardedPolicy:
    """``model`` (moved into the result, so pass a copy) sharded over the group's ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(group.device.type, (group.world,))
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if group.device.type == "cuda" else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=precision)
    return fully_shard(ShardedPolicy(model), mesh=mesh, reshard_after_forward=cfg.reshard_after_forward,
                       mp_policy=precision)


def trains_sharded(policy) -> bool:
    return isinstance(policy, ShardedPolicy)


@torch.no_grad()
def gather_weights(policy, model) -> None:
    """Copy the sharded ``policy``'s current weights into the full ``model`` on every rank
    (a no-op when ``policy`` is ``model``). One all-gather per parameter: the full
    weights of only one parameter are ever held twice."""
    if policy is model:
        return
    for (name, sharded), (full_name, full) in zip(policy.model.named_parameters(), model.named_parameters(),
                                                  strict=True):
        if name != full_name:
            raise RuntimeError(f"sharded parameter {name} does not line up with {full_name}")
        full.copy_(sharded.full_tensor())


def load_shards(model, policy) -> None:
    """Each rank's shard of ``policy`` from the full ``model`` (a resumed checkpoint's weights)."""
    if policy is model:
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    set_model_state_dict(policy, state, options=StateDictOptions(full_state_dict=True))


def replicated(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a value FSDP returns as a replicated DTensor (the clipped gradient's norm)."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


class FullOptimizerState:
    """The sharded policy's optimizer as one full state dict, for ``trainer.checkpoint``.

    ``state_dict`` gathers it (a collective; rank 0 gets it, the others an empty
    dict); ``load_state_dict`` takes the full state on every rank and keeps each
    rank's shard.
    """

    def __init__(self, policy: ShardedPolicy, optimizer: torch.optim.Optimizer):
        self.policy = policy
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.policy, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.policy, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


# -- the launcher -----------------------------------------------------------------------------


def launch(argv: Sequence[str], world: int, *, stderr=None) -> int:
    """Run ``python -m trainer ARGV`` as ``world`` ranks; the first failing rank's exit code, else 0.

    Stop signals that reach the launcher are passed on to every rank (a rank takes
    the same signal arriving twice, from its launcher and its terminal or job, as one
    request, see ``trainer.stopping``).
    """
    stderr = stderr or sys.stderr
    project = str(Path(__file__).resolve().parents[1])
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "PYTHONPATH": os.pathsep.join(filter(None, [project, os.environ.get("PYTHONPATH")]))}
    # As torchrun does: N ranks of all the cores' threads each would fight over them.
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    ranks: list[subprocess.Popen] = []

    def forward(signum, frame):
        for process in ranks:
            if process.poll() is None:
                process.send_signal(signum)

    # Handlers can only be set from the main thread (an embedding caller may launch elsewhere).
    in_main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.signal(signum, forward) for signum in SIGNALS} if in_main else {}
    try:
        for rank in range(world):
            ranks.append(subprocess.Popen([sys.executable, "-m", "trainer", *argv], preexec_fn=_die_with_parent,
                                          env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}))
        return _wait(ranks, stderr)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()


def _wait(ranks: list[subprocess.Popen], stderr) -> int:
    failed: Optional[tuple[int, int]] = None  # (rank, exit code) of the first failure
    deadline = None
    while any(process.poll() is None for process in ranks):
        if failed is None:
            failed = next(((rank, p.returncode) for rank, p in enumerate(ranks) if p.returncode), None)
            if failed is not None:
                deadline = time.monotonic() + FAILURE_GRACE_S
        elif time.monotonic() > deadline:
            print(f"sweep-train: rank {failed[0]} exited with {failed[1]} and the other ranks did not end within "
                  f"{FAILURE_GRACE_S:.0f} s; killing them", file=stderr, flush=True)
            for process in ranks:
                if process.poll() is None:
                    process.kill()
        time.sleep(POLL_S)
    if failed is None:
        failed = next(((rank, p.returncode) for rank, p in enumerate(ranks) if p.returncode), None)
    if failed is None:
        return 0
    code = failed[1]
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exit_rank(code: int) -> NoReturn:
    """End this rank's process with ``code`` at once, without the interpreter's teardown.

    The process group outlives ``destroy_process_group``: torch.distributed.tensor's caches
    (of sharding propagation, redistribution plans, mesh topology) keep the FSDP2 mesh, and
    through it the group, alive to the end, so gloo's worker and I/O threads (NCCL's watchdog
    on CUDA) still run while the interpreter and the C++ statics are torn down. A rank that
    exited that way while its peer was still connected aborted now and then ("terminate
    called without an active exception", exit 134) after its run had completed. By the time
    a rank ends, what it writes is written and closed; only stdout and stderr need flushing.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _die_with_parent() -> None:
    # A rank left behind by a killed launcher would wait in a collective until its timeout.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the ranks then outlive a SIGKILLed launcher
        pass
