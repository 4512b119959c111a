"""Per-request failures from our model runner, finished by vLLM's scheduler as request errors.

vLLM's scheduler already fails single requests without marking the engine unhealthy (a
structured-output grammar that did not compile: `RequestStatus.FINISHED_ERROR`, the client gets
an error for that request alone), but a model runner has no field in ModelRunnerOutput to ask
for it. The runner attaches `{request id: message}` to its output under FAILURES, and this
patch point hands them to the scheduler's request-error list before it processes the output.
"""

from __future__ import annotations

FAILURES = "tpu_plugins_failures"   # attribute of a ModelRunnerOutput: {request id: message}


def attach(output, failures: dict[str, str]):
    if failures:
        setattr(output, FAILURES, failures)
    return output


def fail_requests_the_runner_could_not_run() -> None:
    """Patch point (engine-core process): Scheduler.update_from_output first records the runner's
    failed requests as request errors; the scheduler then finishes them (freeing their pages) in
    the same call, and answers each client with its message."""
    from vllm.outputs import RequestError
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output
    if getattr(original, "tpu_plugins_patch", False):
        return

    def update_from_output(self, scheduler_output, model_runner_output):
        for req_id, message in getattr(model_runner_output, FAILURES, {}).items():
            self.grammar_compile_error_reqs[req_id] = RequestError(code="engine_error", message=message)
        return original(self, scheduler_output, model_runner_output)

    update_from_output.tpu_plugins_patch = True
    Scheduler.update_from_output = update_from_output
