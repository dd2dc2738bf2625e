"""The failure classifier on realistic log tails and SLURM states."""

from __future__ import annotations

import pytest

from sweepkit.run import failures as fl

CUDA_OOM = """\
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward
    return F.linear(input, self.weight, self.bias)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 63.43 GiB \
of which 1.23 GiB is free. Including non-PyTorch memory, this process has 62.18 GiB memory in use. Of the allocated \
memory 59.12 GiB is allocated by PyTorch, and 1.43 GiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""

HOST_OOM = """\
step 41 reward 0.43
slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4180233.0. Some of your processes may have been killed \
by the cgroup out-of-memory handler.
srun: error: lrdn0412: task 0: Out Of Memory
"""

NCCL_WATCHDOG = """\
[rank3]:[E1120 14:03:12.345678901 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds \
before timing out.
[rank3]:[E1120 14:03:12.346000000 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 3] Exception (either an error \
or timeout) detected by watchdog at work: 1234, last enqueued NCCL work: 1234, last completed NCCL work: 1233.
terminate called after throwing an instance of 'c10::DistBackendError'
"""

NCCL_ERROR = """\
Traceback (most recent call last):
  File "/opt/skyrl/train.py", line 88, in <module>
    dist.all_reduce(tensor)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled \
system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
"""

TRACEBACK = """\
step 2 reward 0.10
Traceback (most recent call last):
  File "/work/tests/cell_program.py", line 120, in <module>
    sys.exit(main())
  File "/work/tests/cell_program.py", line 111, in main
    raise RuntimeError(f"boom at step {step}")
RuntimeError: boom at step 2
"""

VLLM_OOM_IN_TRACEBACK = """\
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/vllm/worker/worker.py", line 210, in determine_num_available_blocks
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
"""


@pytest.mark.parametrize(("state", "kind"), [
    ("OUT_OF_MEMORY", fl.OOM), ("TIMEOUT", fl.TIMEOUT), ("NODE_FAIL", fl.NODE_FAIL), ("BOOT_FAIL", fl.NODE_FAIL),
    ("PREEMPTED", fl.PREEMPTED), ("CANCELLED by 0", fl.CANCELLED), ("DEADLINE", fl.TIMEOUT),
])
def test_scheduler_state_decides_first(state, kind):
    # Even with a traceback in the log (a process dying on SIGTERM prints one), the state wins.
    found = fl.classify(job_state=state, log_tail=TRACEBACK, failure="killed by SIGTERM")
    assert found.kind == kind
    assert found.detail == "killed by SIGTERM"


def test_cuda_oom_from_the_log_tail():
    found = fl.classify(job_state="FAILED", log_tail=CUDA_OOM, failure="exit code 1: torch.OutOfMemoryError")
    assert found.kind == fl.OOM
    assert found.detail.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")


def test_host_oom_kill_in_the_job_log():
    found = fl.classify(job_state="FAILED", log_tail=HOST_OOM, failure="killed by SIGKILL")
    assert found.kind == fl.OOM
    assert "Out Of Memory" in found.detail


def test_oom_is_found_before_the_traceback_that_carries_it():
    assert fl.classify(log_tail=VLLM_OOM_IN_TRACEBACK).kind == fl.OOM


def test_nccl_watchdog_timeout():
    found = fl.classify(job_state="FAILED", log_tail=NCCL_WATCHDOG, failure="killed by SIGABRT")
    assert found.kind == fl.NCCL
    assert "DistBackendError" in found.detail or "Watchdog" in found.detail


def test_nccl_error_is_not_a_plain_exception():
    found = fl.classify(log_tail=NCCL_ERROR, failure="exit code 1: ncclSystemError: System call")
    assert found.kind == fl.NCCL
    assert found.detail.startswith("ncclSystemError")


def test_exception_carries_the_last_traceback_line():
    found = fl.classify(job_state="FAILED", log_tail=TRACEBACK, failure="exit code 1: RuntimeError: boom at step 2")
    assert found == fl.Failure(fl.EXCEPTION, "RuntimeError: boom at step 2")
    assert str(found) == "EXCEPTION: RuntimeError: boom at step 2"


def test_submitit_timeout_message_counts_as_timeout():
    message = "interrupted: UncompletedJobError Job not requeued because: timed-out and not checkpointable."
    assert fl.classify(job_state="FAILED", failure=message).kind == fl.TIMEOUT


def test_interrupted_local_attempt_is_cancelled_and_nothing_known_is_unknown():
    assert fl.classify(failure="interrupted: KeyboardInterrupt", cell_state="cancelled").kind == fl.CANCELLED
    found = fl.classify(failure="exit code 3", log_tail="step 1\nstep 2\n")
    assert found == fl.Failure(fl.UNKNOWN, "exit code 3")


def test_read_tail_joins_existing_files_and_skips_missing(tmp_path):
    first = tmp_path / "stderr.log"
    first.write_text("x" * 100 + "\nRuntimeError: late\n")
    tail = fl.read_tail([first, tmp_path / "missing.err", None], tail_bytes=20)
    assert tail == "\nRuntimeError: late\n"  # the last 20 bytes; the missing files add nothing


def test_local_runs_are_classified_from_their_log_tail(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    oom = ("import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', "
           "file=sys.stderr); sys.exit(1)")
    # Two command grids: one raising, one printing a CUDA OOM before exiting.
    sweeper.grid("local", """
        import sweepkit as sk
        target = sk.command("{python}", "-c", "raise ValueError('bad lr')")
        base = sk.base()
    """)
    sweeper.grid("oom", f"""
        import sweepkit as sk
        target = sk.command("{{python}}", "-c", {oom!r})
        base = sk.base()
    """)
    result = sweeper.run("run", "--executor", "local")
    assert result.ret == 1, result
    status = sweeper.run("status")
    rows = {line.split()[0]: line for line in status.stdout.splitlines() if "::" in line}
    assert "EXCEPTION: ValueError: bad lr" in rows["grids/local.py::base"], status
    assert "OOM: torch.OutOfMemoryError: CUDA out of memory" in rows["grids/oom.py::base"], status


def chain_view(tmp_path, *, effective, link_state):
    """A chained SLURM cell whose first link (job 11) ended as ``link_state``; job 12 is the next link."""
    from sweepkit.state import records as st
    from sweepkit.run.executors import sacct

    attempt = st.Attempt(n=1, executor=fl.SLURM, job_id="11", failure="killed by SIGTERM")
    cell_state = st.CellState(nodeid="grids/g.py::long", state=effective, config_hash="h", attempts=(attempt,),
                              submission=st.Submission(executor=fl.SLURM, token="t", job_id="11:12"))
    view = st.CellView(directory=tmp_path, nodeid=cell_state.nodeid, name="long", record=None, state=cell_state,
                       effective=effective, outcome="failed" if effective == "failed" else "")
    return view, {"11": sacct.JobRecord(job_id="11", state=link_state), "12": sacct.JobRecord(job_id="12", state="PENDING")}


def test_a_chain_link_that_timed_out_reads_as_normal_while_the_next_waits(tmp_path):
    view, records = chain_view(tmp_path, effective="submitted", link_state="TIMEOUT")
    assert fl.failure_text(view, records) == (
        "attempt 1 TIMEOUT: killed by SIGTERM (normal for a chain link); the next link resumes")
    # Any other failure of a link is shown as what it was, the next link still coming.
    view, records = chain_view(tmp_path, effective="submitted", link_state="NODE_FAIL")
    assert fl.failure_text(view, records) == "attempt 1 NODE_FAIL: killed by SIGTERM; the next link resumes"
    # Once no link is left, a timeout is the cell's failure.
    view, records = chain_view(tmp_path, effective="failed", link_state="TIMEOUT")
    assert fl.failure_text(view, records) == "TIMEOUT: killed by SIGTERM"


def test_a_keyboard_interrupt_traceback_is_the_interrupt_not_a_crash():
    # Ctrl-C that reached a command outside its own handlers: the traceback is the interrupt's.
    tail = 'step 3\nTraceback (most recent call last):\n  File "train.py", line 9, in <module>\n' \
           "    export()\nKeyboardInterrupt\n"
    found = fl.classify(log_tail=tail, failure="interrupted: KeyboardInterrupt", cell_state="cancelled")
    assert found == fl.Failure(fl.CANCELLED, "interrupted: KeyboardInterrupt")
    assert fl.classify(log_tail=tail, failure="killed by SIGINT: KeyboardInterrupt").kind == fl.CANCELLED
