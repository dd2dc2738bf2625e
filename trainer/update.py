"""The policy update of one step: mini-batches of whole groups, micro-batches that accumulate.

Each mini-batch is one optimizer step; each micro-batch loss is normalised by its
whole mini-batch's totals, so the accumulated gradient is the mini-batch loss's
gradient. Rows of a mini-batch are sorted by length before they are cut into
micro-batches (the loss is a sum over rows, so order does not change it), which
keeps the padding each micro-batch computes on small; how many rows each takes is the
run's :class:`trainer.packing.Packing` (a fixed count, or as many as its token budget
holds at its longest row's width). With the prompt shared (``share_prompts``), what is
sorted and cut is groups, each laid out as one row (:func:`micro_units`; a group too wide for
a micro-batch's token budget in runs of its rows that fit). All of this is
decided on the host from the rows' lengths, read from the device once a step
(:class:`trainer.batch.RowLengths`): a micro-batch's cut, layout, forward and backward never
wait for the GPU (``tests/test_shared_prompt.py`` checks it under torch's sync debug mode; the
per-row forward through :func:`trainer.forward.causal_without_mask`).

When the step is exactly on-policy (one mini-batch: the update sees the weights
that sampled) ``batch.old_logprobs`` is None and pi_old is the update forward's
own log-probs, detached: rho = 1 exactly and no separate no-grad forward is
spent on it (TRL does the same).

Over several ranks (``trainer.parallel``) each rank holds its share of every
mini-batch's groups and the policy is sharded with FSDP2, whose reduce-scatter
averages the ranks' gradients. A rank's losses are therefore normalised by its
share of the whole mini-batch's totals: its sequences (the mini-batch's / N, as
every rank holds as many) and the mini-batch's tokens over all ranks / N; the
mean of the ranks' gradients is then the one-device gradient, for every
``loss_reduction``. The step's metrics are summed over the ranks the same way.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import sys

import torch

from trainer import shared_prompt
from trainer.batch import Batch
from trainer.forward import response_logprobs
from trainer.losses import aggregate, kl_penalty, policy_loss
from trainer.packing import Packing, plan_packing
from trainer.parallel import SINGLE, Group, replicated, trains_sharded

TOKEN_SUMS = ("clip_frac", "kl", "ref_kl", "tis_weight", "entropy")  # per-token sums, averaged over all tokens


def micro_units(mini: Batch, *, share_prompts: bool, width_multiple: int,
                max_width: int | None = None) -> tuple[list[list[int]], list[int]]:
    """What micro-batches are cut from: units of rows that stay together, longest first, and
    their padded widths. A unit is a row, or with ``share_prompts`` a run of rows that repeat a
    prompt, which the forward lays out as one row of prompt and responses
    (:mod:`trainer.shared_prompt`). A group whose row would be wider than ``max_width`` padded
    tokens (a micro-batch's token budget) is cut into runs of its rows that fit, each laid out
    with its own copy of the prompt (a row wider alone is a unit alone): long responses times
    many samples must not make one micro-batch past the memory budget."""
    rows = mini.row_lengths()
    sizes = shared_prompt.prompt_groups(mini) if share_prompts else [1] * mini.size
    if max(sizes) > 1:
        width_multiple = max(width_multiple, shared_prompt.BLOCK)
    units = [list(group) for group in shared_prompt.group_rows(sizes)]
    if max_width is not None:
        units = [part for unit in units for part in _runs_within(unit, rows, max_width, width_multiple)]
    lengths = [rows.prompt[unit[0]] + sum(rows.ends[row] for row in unit) for unit in units]
    order = sorted(range(len(units)), key=lambda u: -lengths[u])  # stable: ties keep row order
    widths = [_padded(lengths[u], width_multiple) for u in order]
    return [units[u] for u in order], widths


def _padded(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def _runs_within(unit: list[int], rows, max_width: int, width_multiple: int) -> list[list[int]]:
    """A group's rows in order, cut into runs whose laid-out row (the prompt, then each
    response) is at most ``max_width`` once padded; a row that is wider alone makes a run alone."""
    runs, run, length = [], [], rows.prompt[unit[0]]
    for row in unit:
        if run and _padded(length + rows.ends[row], width_multiple) > max_width:
            runs.append(run)
            run, length = [], rows.prompt[unit[0]]
        run.append(row)
        length += rows.ends[row]
    return [*runs, run]


def update_policy(model, optimizer, scheduler, batch: Batch, cfg, *, precision=None, stderr=None,
                  group: Group = SINGLE, packing: Packing | None = None) -> dict:
    """One optimizer step per mini-batch; returns the step's policy metrics.

    A mini-batch whose gradient norm is not finite leaves the weights, the
    optimizer state and the schedule untouched; it is counted in
    ``policy/skipped_updates`` and reported on ``stderr``. ``model`` is the
    policy itself, or (several ranks) its :class:`trainer.parallel.ShardedPolicy`,
    and ``batch`` this rank's share of the step's groups. ``packing``: how mini-batches
    are cut (None: decided here, :func:`trainer.packing.plan_packing`).
    """
    model.train()
    autocast = precision.autocast if precision is not None else contextlib.nullcontext
    # A sharded policy's forward is the training forward: its FSDP hooks must run.
    forward = model if trains_sharded(model) else functools.partial(response_logprobs, model)
    mini_size = cfg.policy_mini_batch_size * cfg.n_samples_per_prompt // group.world
    if packing is None:
        packing = plan_packing(cfg, model, optimizer, batch.prompt_ids.device)
    width_multiple = getattr(model, "width_multiple", 1)
    share_prompts = getattr(model, "share_prompts", False)
    # Sums stay on the device until the end: a .item() per micro-batch would stall the GPU queue.
    sums = {"loss": 0.0, "grad_norm": 0.0, "clip_frac": 0.0, "kl": 0.0, "ref_kl": 0.0, "tis_weight": 0.0,
            "entropy": 0.0}
    tokens_seen = 0.0
    mini_batches = skipped = 0
    lr = optimizer.param_groups[0]["lr"]
    for mini_start in range(0, batch.size, mini_size):
        # The rows' lengths are read from the device once a step (batch.rows hands them on): the
        # micro-batches below are cut and laid out on the host without waiting for the GPU.
        mini = batch.rows(slice(mini_start, mini_start + mini_size))
        # This rank's share of the mini-batch's totals (on one rank: the totals).
        tokens = group.sum_floats([float(sum(mini.row_lengths().sampled))])[0] / group.world
        totals = dict(num_sequences=mini.size, num_tokens=tokens, max_len=cfg.max_generate_length)
        units, widths = micro_units(mini, share_prompts=share_prompts, width_multiple=width_multiple,
                                    max_width=packing.tokens)
        unit_rows = [len(unit) for unit in units]
        grouped = max(unit_rows) > 1
        # In the units' order (one index copy), each micro-batch is a slice: units [u, u + size)
        # are rows [first_row[u], first_row[u + size]). The forward lays out the units as cut,
        # a group cut in runs included.
        ordered = mini.rows([row for unit in units for row in unit]).grouped_as(unit_rows)
        first_row = list(itertools.accumulate(unit_rows, initial=0))
        mini_loss, micro_start = 0.0, 0
        for micro_size in packing.cut(widths, unit_rows=unit_rows if grouped else None):
            micro = ordered.rows(slice(first_row[micro_start], first_row[micro_start + micro_size]))
            micro_start += micro_size
            mask = micro.response_mask  # (b, R)
            with autocast():
                logprobs, entropy = forward(micro, cfg.temperature, with_entropy=True)  # (b, R)
            old_logprobs = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
            per_token, stats = policy_loss(
                logprobs, old_logprobs, micro.advantages,
                eps_clip_low=cfg.eps_clip_low, eps_clip_high=cfg.eps_clip_high, loss_type=cfg.policy_loss_type,
                rollout_logprobs=micro.rollout_logprobs if cfg.use_tis else None,
                tis_cap=cfg.tis_imp_ratio_cap if cfg.use_tis else None)
            loss = aggregate(per_token, mask, cfg.loss_reduction, **totals)
            if cfg.use_kl_loss:
                ref_kl = kl_penalty(logprobs, micro.ref_logprobs, estimator=cfg.kl_estimator_type)  # (b, R)
                loss = loss + cfg.kl_loss_coef * aggregate(ref_kl, mask, cfg.loss_reduction, **totals)
                sums["ref_kl"] += (ref_kl.detach() * mask).sum()
            if cfg.use_entropy_loss:
                loss = loss - cfg.entropy_loss_coef * aggregate(entropy, mask, cfg.loss_reduction, **totals)
            loss.backward()
            mini_loss += loss.detach()
            drift = kl_penalty(logprobs.detach(), old_logprobs, estimator="k3")
            tokens_seen += mask.sum()
            sums["kl"] += (drift * mask).sum()
            sums["entropy"] += (entropy.detach() * mask).sum()
            sums["clip_frac"] += (stats["clip_frac"] * mask).sum()
            if "tis_weight" in stats:
                sums["tis_weight"] += (stats["tis_weight"] * mask).sum()
            del logprobs, entropy, per_token, loss
        grad_norm = replicated(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
        lr = optimizer.param_groups[0]["lr"]  # the rate this update uses (the scheduler then moves on)
        # One sync per optimizer step: a non-finite gradient would turn every weight to NaN
        # (AdamW's moments keep it forever), so that update is dropped and counted instead.
        if torch.isfinite(grad_norm):
            optimizer.step()
            scheduler.step()
            sums["grad_norm"] += grad_norm.detach()
        else:
            skipped += 1
            print(f"sweep-train: skipped the update of mini-batch {mini_batches + 1}: the gradient norm is "
                  f"{float(grad_norm)}", file=stderr or sys.stderr)
        optimizer.zero_grad(set_to_none=True)
        sums["loss"] += mini_loss
        mini_batches += 1
    sums = {key: float(total) for key, total in sums.items()}  # one device sync for the whole step
    # Over ranks: token sums add up; the loss is the mean of the ranks' (each normalised by 1/N of
    # the totals); the gradient norm is the same on every rank.
    reduced = group.sum_floats([sums["loss"], float(tokens_seen), *(sums[key] for key in TOKEN_SUMS)])
    sums |= dict(zip(TOKEN_SUMS, reduced[2:]), loss=reduced[0] / group.world)
    per_token = max(reduced[1], 1.0)
    applied = mini_batches - skipped
    metrics = {
        "policy/loss": sums["loss"] / mini_batches,
        "policy/grad_norm": sums["grad_norm"] / applied if applied else math.nan,  # of the applied updates
        "policy/lr": lr,
        "policy/clip_frac": sums["clip_frac"] / per_token,
        "policy/kl": sums["kl"] / per_token,
        "policy/entropy": sums["entropy"] / per_token,
        "policy/optimizer_steps": applied,
        "policy/skipped_updates": skipped,
    }
    if cfg.use_kl_loss:
        metrics["policy/ref_kl"] = sums["ref_kl"] / per_token
    if cfg.use_tis:
        metrics["policy/tis_weight"] = sums["tis_weight"] / per_token
    return metrics
