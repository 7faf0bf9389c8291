"""RQ jobs with stable dotted paths: ``worker.jobs.fire``, ``worker.jobs.run_now``, ``worker.jobs.run_triggered``,
``worker.jobs.run_workflow``, ``worker.jobs.run_step``, ``worker.jobs.run_backfill`` and ``worker.jobs.trigger``
(for other services enqueuing through RQ directly)."""

from __future__ import annotations

from typing import Any

from loopsq.engine import fire_queue, runner
from loopsq.engine.recovery import reap_host
from loopsq.engine.runtime import Runtime
from loopsq.engine.worker_process import current_runtime, set_current_runtime


def _runtime() -> Runtime:
    rt = current_runtime()
    if rt is None:
        # Executed by a plain ``rq worker``: derive our client from the job's connection.
        from loopsq.engine.rqcompat.jobs import running_job
        from loopsq.state.connection import sibling

        job = running_job()
        if job is None:
            raise RuntimeError("worker.jobs must run inside an RQ worker")
        # A pool like the job's (through the same sentinels, for a Sentinel connection) with decoded responses.
        client = sibling(job.connection, decode_responses=True)
        # The RQ worker's name as our worker id, as ``loopsq worker`` does: maintenance judges a fired timer's
        # job by the liveness key of the RQ worker that runs it.
        rt = Runtime(client=client, role="worker", worker_id=job.worker_name or None, reaper=reap_host).start()
        set_current_runtime(rt)
        import contextlib

        from loopsq.errors import ValidationError
        from loopsq.system import tracing

        # Spans as ``loopsq-worker``; a bad LOOPSQ_TRACING leaves tracing off (with a warning), not the job failed.
        with contextlib.suppress(ValidationError):
            tracing.configure("loopsq-worker")
    return rt


def fire(loop_id: str) -> dict[str, int]:
    """A loop's timer fired: run its due slots, then the timer jobs queued right behind this one
    (``fire_queue.fire_queued``)."""
    rt = _runtime()
    result = runner.fire(rt, loop_id)
    from loopsq.engine.rqcompat.jobs import running_job

    job = running_job()
    result.absorb(fire_queue.fire_queued(rt, queue_name=job.origin if job is not None else None))
    return {"claimed": result.claimed, "completed": result.completed, "skipped": result.skipped,
            "taken": result.taken}


#: Prefix of a run-now request's answer when the worker could not claim the run (followed by the reason).
REFUSED = "!"


def _job_trace() -> dict[str, str]:
    """The W3C trace context the enqueuer put in the running job's ``meta`` (``traceparent``, ``tracestate``)."""
    from loopsq.engine.rqcompat.jobs import running_job
    from loopsq.system.tracing import valid_carrier

    job = running_job()
    return valid_carrier(job.meta) if job is not None and isinstance(job.meta, dict) else {}


def run_now(loop_id: str, request_id: str, retry: bool = True) -> str:
    """Run a loop now on this worker; the run id is published under the request id for the waiting CLI.
    ``retry=False``: the loop's retry policy does not apply to this run (``--no-retry``). The job's ``meta`` may
    carry the request's W3C trace context (``traceparent``, ``tracestate``)."""
    rt = _runtime()
    from loopsq.domain.run_rules import LoopRun
    from loopsq.domain.timeutil import gen_id

    def publish(run: LoopRun) -> None:
        # Only once claimed: a retry or due slot keeps its existing row's id, and the CLI waits on this one.
        rt.client.set(rt.keys.run_request(request_id), run.id, px=3_600_000)

    from loopsq.errors import LoopsqError

    try:
        final = runner.run_now(rt, loop_id, run_id=gen_id(), on_claim=publish, retry=retry, trace=_job_trace())
    except LoopsqError as exc:
        # Tell the waiting CLI why (e.g. the slot's run is going on another worker) instead of letting it time out.
        rt.client.set(rt.keys.run_request(request_id), REFUSED + exc.message, px=3_600_000)
        raise
    return final.id


def run_triggered(run_id: str) -> str | None:
    """Execute a run reserved by ``LoopsClient.trigger``."""
    final = runner.run_triggered(_runtime(), run_id)
    return final.id if final else None


def trigger(loop: str, idempotency_key: str | None = None, no_retry: bool = False, traceparent: str | None = None,
            tracestate: str | None = None, **_ignored: Any) -> str:
    """Trigger a loop from another service by dotted path; returns the run id (the same for a repeated key).
    ``no_retry=True``: the loop's retry policy does not apply to this run (a keyword ``retry`` would be RQ's).
    ``traceparent``/``tracestate`` (else the job's ``meta``): the caller's W3C trace context, the parent of the
    run's spans."""
    from loopsq.domain.labels import satisfies
    from loopsq.engine.routing import loop_requirements
    from loopsq.engine.triggers import trigger_with

    rt = _runtime()
    target = rt.loops.require(loop)
    here = rt.labels is None or satisfies(rt.labels, loop_requirements(target))
    # Run here when this worker may run the loop's runs; else hand the run to the loop's queue (a service that
    # enqueues on the base queue reaches any worker, whatever the loop requires).
    trace = ({"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})} if traceparent
             else _job_trace())
    run_id, created = trigger_with(rt.client, rt.keys, loop, idempotency_key, enqueue=not here, retry=not no_retry,
                                   trace=trace)
    if created and here:
        runner.run_triggered(rt, run_id)
    return run_id


def run_workflow(workflow_id: str, run_id: str) -> str:
    """Run a workflow on this worker under the run id the caller chose (``loopsq workflows run``)."""
    from loopsq.engine.workflow_runner import execute_workflow

    rt = _runtime()
    spec = rt.workflows.get(workflow_id)
    if spec is None:
        raise RuntimeError(f"workflow not found: {workflow_id}")
    return execute_workflow(rt, spec, run_id=run_id).run_id


def run_step(workflow_run_id: str, step_id: str, token: str, assignment: dict[str, Any]) -> str:
    """Run a step of a workflow run another worker executes, which lacks the labels the step requires
    (``engine.remote_steps``): claimed under dispatch ``token``, once however often the job is delivered."""
    from loopsq.engine.remote_steps import run_remote_step

    return run_remote_step(_runtime(), workflow_run_id, step_id, token, assignment)


def run_backfill(loop_id: str, slot: str, request_id: str, force: bool = False, overlap: str = "skip") -> str:
    """Run one backfill slot on this worker; its outcome (``<outcome> <run id>``) is published under the request
    id for the waiting ``loopsq backfill``."""
    from loopsq.engine.backfill import run_backfill_slot

    rt = _runtime()

    def publish(run: Any) -> None:
        rt.client.set(rt.keys.run_request(request_id), f"ran {run.id}", px=3_600_000)

    result = run_backfill_slot(rt, loop_id, slot, force=force, overlap=overlap, on_claim=publish)
    rt.client.set(rt.keys.run_request(request_id), result.encode(), px=3_600_000)
    return result.encode()
