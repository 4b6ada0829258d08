"""How chload tries again: one policy, one loop, for every retry in the package.

Whether an error is worth another try is its type (errors.py: `TransientError`); how
often and how long is a `RetryPolicy`: a number of tries or a deadline, with exponential
backoff (full jitter where many workers would otherwise retry in step). The loops that
use it (the runner, server/early.py, locks.py, attach.py, the sources' HTTP and S3
requests) and their policies: docs/architecture.md ("Retries").

Invariant: `sleep` is a parameter everywhere, so tests script failures and record the
waits instead of waiting.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from chload.errors import TransientError

T = TypeVar("T")
Sleep = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries in all (0: as many as `until` allows), the pause before try
    n+1 `base_seconds * 2**n` up to `max_seconds`: with `jitter`, uniform in
    [0, that] (full jitter), else exactly that."""

    attempts: int = 5
    base_seconds: float = 0.5
    max_seconds: float = 20.0
    jitter: bool = True

    def delay(self, attempt: int) -> float:
        """The pause after try `attempt` (0-based) failed."""
        top = min(self.max_seconds, self.base_seconds * 2 ** attempt)
        return random.uniform(0, top) if self.jitter else top

    def tries(self, sleep: Sleep | None = None, until: float | None = None,
              wait_first: bool = False) -> Iterator[int]:
        """Try numbers 0, 1, ... with the policy's pause before each but the first (the
        first too, with `wait_first`); none after `attempts` tries, nor once the
        monotonic clock passes `until` (a pause ends there at the latest).

        For the loops that wait for a state rather than retry an error (a lock to be
        free, a commit to settle): `for _ in policy.tries(...): if done(): return`.
        """
        sleep = sleep or time.sleep  # (looked up now: tests patch time.sleep)
        attempt = 0
        while not self.attempts or attempt < self.attempts:
            waits = bool(attempt or wait_first)
            pause = self.delay(attempt - 1 + wait_first) if waits else 0.0
            if until is not None:
                left = until - time.monotonic()
                if left <= 0:
                    return
                pause = min(pause, left)
            if waits:
                sleep(pause)
            yield attempt
            attempt += 1


DEFAULT_POLICY = RetryPolicy()


def transient(error: BaseException) -> bool:
    """The default rule: retry what says it may succeed later."""
    return isinstance(error, TransientError)


def retry(fn: Callable[[], T], policy: RetryPolicy = DEFAULT_POLICY,
          sleep: Sleep | None = None, *, retry_if: Callable[[BaseException], bool] = transient,
          again_if: Callable[[T], bool] | None = None) -> T:
    """`fn()`, tried again under `policy` while it raises an error `retry_if` accepts
    (default: a TransientError) or returns an answer `again_if` accepts (e.g. an HTTP
    5xx status). When the tries run out, the last error is raised, or the last answer
    returned. `policy.attempts` must be at least 1."""
    assert policy.attempts >= 1, "retry() needs a number of attempts"
    failure: BaseException | None = None
    answer: T
    for _ in policy.tries(sleep):
        try:
            answer = fn()
        except Exception as exc:
            if not retry_if(exc):
                raise
            failure = exc
            continue
        failure = None
        if again_if is None or not again_if(answer):
            return answer
    if failure is not None:
        raise failure
    return answer


call_with_retries = retry  # the runner's older name
