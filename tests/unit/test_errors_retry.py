"""errors.py (structured errors, the one table of transient codes, message parsing) and
retry.py (one policy, honoured by every retry loop), with scripted failures and a fake
sleep: nothing here waits."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import pytest

from chload.errors import (
    _TRANSIENT_CODES,
    AuthError,
    BatchOverlap,
    ChloadError,
    CommitInterrupted,
    DataError,
    EngineError,
    SchemaError,
    SourceError,
    TerminalError,
    TransientError,
    VanishedFile,
    from_engine_message,
    from_push_message,
    missing_table,
    normalize,
    pinpointed,
    server_error,
)
from chload.runtime.retry import RetryPolicy, retry

OLD = "Code: {}, e.displayText() = DB::Exception: {}, e.what() = DB::Exception\n"


# -- structured errors ----------------------------------------------------------------

def test_an_error_carries_context_reason_and_code_and_reads_as_before() -> None:
    error = from_engine_message("Code: 60. DB::Exception: Table db.t doesn't exist. "
                                "(UNKNOWN_TABLE) (version 24.1)", "trips.csv")
    assert isinstance(error, SchemaError)
    assert (error.context, error.reason, error.code) == (
        "trips.csv", "Table db.t doesn't exist", 60)
    assert str(error) == "trips.csv: Table db.t doesn't exist"
    whole = SourceError("s3://b/k: access denied")  # made from one message: its head
    assert (whole.context, whole.reason, whole.code) == ("s3://b/k", "access denied", None)
    plain = TransientError("server down")
    assert (plain.context, plain.reason, str(plain)) == ("", "server down", "server down")
    copied = copy.copy(EngineError("t: altered meanwhile", 47))  # a group's other commits
    assert (copied.reason, copied.code, str(copied)) == ("altered meanwhile", 47,
                                                         "t: altered meanwhile")


def test_server_answers_keep_their_fields_and_masking_reaches_them() -> None:
    error = server_error(401, OLD.format(193, "Wrong password for user loader s3cr3t"),
                         "server h:1")
    assert isinstance(error, AuthError) and error.code == 193
    assert error.context == "server h:1" and error.reason.startswith("authentication failed")
    error.masked(lambda text: text.replace("s3cr3t", "***"))
    assert "s3cr3t" not in str(error) + error.reason and "***" in error.reason


@pytest.mark.parametrize("kind", [AuthError, CommitInterrupted, BatchOverlap])
def test_every_error_class_lives_in_errors(kind: type[ChloadError]) -> None:
    assert kind.__module__ == "chload.errors" and issubclass(kind, TerminalError)
    assert issubclass(VanishedFile, SourceError) and VanishedFile.__module__ == "chload.errors"


# -- one table of transient codes ------------------------------------------------------

@pytest.mark.parametrize("code", sorted(_TRANSIENT_CODES))
def test_a_transient_code_is_transient_from_the_engine_and_from_a_server(code: int) -> None:
    assert isinstance(from_engine_message(f"Code: {code}. DB::Exception: x", "f"),
                      TransientError)
    assert isinstance(server_error(500, OLD.format(code, "x"), "f"), TransientError)


@pytest.mark.parametrize("code, kind", [(164, EngineError), (236, SourceError)])
def test_readonly_and_aborted_are_not_retried(code: int, kind: type) -> None:
    """164 READONLY (the user's profile: no retry changes it) was retried five times;
    236 ABORTED (a remote read aborted) stays a source error."""
    for error in (from_engine_message(f"Code: {code}. DB::Exception: x", "f"),
                  server_error(500, OLD.format(code, "x"), "f")):
        assert isinstance(error, kind) and error.code == code


def test_message_parsing_lives_in_errors() -> None:
    dropped = server_error(404, OLD.format(60, "Table chload.stage_a_1_ff doesn't exist."), "s")
    assert missing_table(dropped) == "stage_a_1_ff"
    assert missing_table(TransientError("s: down")) is None
    refused = from_push_message("Code: 1000. DB::Exception: Connection refused. "
                                "(POCO_EXCEPTION)", "f.parquet", "10.0.0.5:8123")
    assert isinstance(refused, TransientError)
    assert str(refused) == "f.parquet: server 10.0.0.5:8123 unreachable: connection refused"


def test_a_parse_error_is_pinpointed_from_its_fields() -> None:
    raw = ("Code: 27. DB::Exception: Cannot parse input: expected ',' before: 'x' (at row 4)"
           "\nRow 4:\nColumn 0,   name: id,   type: UInt32, parsed text: \"x\"ERROR\n"
           ": While executing File. (CANNOT_PARSE_INPUT_ASSERTION_FAILED)")
    error = from_engine_message(raw, "d/a.csv")
    assert isinstance(error, DataError) and (error.row, error.column) == (4, "id")
    got = pinpointed(error, "d/a.csv", header_lines=1)
    assert str(got) == "d/a.csv: line 5, column id: Cannot parse input: expected ',' before: 'x'"
    assert got.context == "d/a.csv" and got.code == 27


# The row dumps of chDB 4.x and 18.16 (same shape): the value is in the ERROR line, or
# split between the parsed text and the garbage after it.
_DUMPS = {
    "text": ('Code: 27. DB::Exception: Cannot parse input: expected \',\' before: '
             '\'N/A,2020-01-02\\n\': (at row 2)\n: \nRow 2:\nColumn 0,   name: id, type: '
             'Int64, parsed text: "2"\nColumn 1,   name: v,  type: Nullable(Int64), ERROR: '
             'text "N/A,2020-0" is not like Nullable(Int64)\n\n: While executing File. '
             '(CANNOT_PARSE_INPUT_ASSERTION_FAILED)'),
    "garbage": ('Code: 27, e.displayText() = DB::Exception: Cannot parse input: expected , '
                'before: abc,2020-01-02\\n: (at row 2)\n\nRow 2:\nColumn 0,   name: id, type: '
                'Int64, parsed text: "2"\nColumn 1,   name: v,  type: Int64, parsed text: '
                '"12"\nERROR: garbage after Int64: "abc,2020-0"\n\n'),
    "empty": ('Code: 117. DB::Exception: Expected end of line: (at row 300002)\n: \nRow '
              '300002:\nColumn 0,   name: <SKIPPED COLUMN>, type: Nothing,   parsed text: '
              '"300000"\nColumn 1,   name: v, type: Nullable(Int64), parsed text: <EMPTY>\n'
              'ERROR: garbage after Nullable(Int64): "N/A<LINE FEED>300001"\n'),
    "row": ('Code: 117. DB::Exception: Expected end of line: (at row 2)\n\nRow 2:\nColumn 2,'
            '   name: d,  type: Date,  parsed text: "2020-01-01"\nERROR: There is no line '
            'feed. "9" found instead.\n It\'s like your file has more columns than expected.\n'),
}


@pytest.mark.parametrize("dump, where, says", [
    ("text", (2, "v"), "column v: 'N/A' is not Int64"),
    ("garbage", (2, "v"), "column v: '12abc' is not Int64"),
    ("empty", (300002, "v"), "column v: 'N/A' is not Int64"),
    ("row", (2, None), "Expected end of line: the row has more fields than there are columns"),
])
def test_a_value_its_type_cannot_read_is_named_from_the_row_dump(
        dump: str, where: tuple[int, str | None], says: str) -> None:
    error = from_engine_message(normalize(_DUMPS[dump]), "a.csv")
    assert isinstance(error, DataError) and (error.row, error.column) == where
    assert str(error) == f"a.csv: {says} (at row {where[0]})"
    pinned = pinpointed(error, "a.csv", header_lines=1)
    column = f", column {where[1]}" if where[1] else ""
    assert str(pinned) == f"a.csv: line {where[0] + 1}{column}: " + says.removeprefix(
        f"column {where[1]}: ")
    assert (pinned.row, pinned.column) == where


# -- the policy ------------------------------------------------------------------------

def scripted(*outcomes: object) -> Callable[[], object]:
    """A callable answering each outcome in turn (raising those that are errors)."""
    left = list(outcomes)

    def call() -> object:
        outcome = left.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    call.left = left  # type: ignore[attr-defined]
    return call


def test_retry_takes_transient_errors_up_to_the_attempts_with_the_policys_pauses() -> None:
    slept: list[float] = []
    policy = RetryPolicy(attempts=4, base_seconds=0.5, max_seconds=1.5, jitter=False)
    call = scripted(TransientError("a"), TransientError("b"), TransientError("c"), "ok")
    assert retry(call, policy, slept.append) == "ok" and slept == [0.5, 1.0, 1.5]
    slept.clear()
    call = scripted(*(TransientError(str(i)) for i in range(5)))
    with pytest.raises(TransientError, match="^3$"):  # the last try's error
        retry(call, policy, slept.append)
    assert slept == [0.5, 1.0, 1.5] and len(call.left) == 1  # type: ignore[attr-defined]
    with pytest.raises(DataError):  # terminal: no second try
        retry(scripted(DataError("f: bad"), "never"), policy, slept.append)


def test_retry_by_answer_and_full_jitter_within_bounds() -> None:
    slept: list[float] = []
    policy = RetryPolicy(attempts=3, base_seconds=0.5, jitter=False)
    assert retry(scripted(503, 502, 503), policy, slept.append,
                 again_if=lambda status: status >= 500) == 503  # the last answer
    assert slept == [0.5, 1.0]
    jittered = RetryPolicy(attempts=5, base_seconds=1.0, max_seconds=3.0)
    assert all(0 <= jittered.delay(n) <= min(3.0, 2 ** n) for n in range(6) for _ in range(50))


class Clock:
    """time.monotonic that moves only when the fake sleep sleeps."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []  # type: ignore[var-annotated]

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 3))
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr("chload.runtime.retry.time.monotonic", lambda: fake.now)
    monkeypatch.setattr("time.sleep", fake.sleep)
    return fake


def test_tries_until_a_deadline_ends_the_last_pause_there(clock: Clock) -> None:
    policy = RetryPolicy(attempts=0, base_seconds=2.0, max_seconds=2.0, jitter=False)
    made = list(policy.tries(clock.sleep, until=clock.now + 5, wait_first=True))
    assert made == [0, 1, 2] and clock.slept == [2.0, 2.0, 1.0]


# -- every loop honours it -------------------------------------------------------------

def test_the_runner_retries_under_its_policy(clock: Clock) -> None:
    from chload.core import run as runner

    calls = scripted(*(TransientError("server: reset") for _ in range(3)))
    policy = RetryPolicy(attempts=3, base_seconds=0.25, jitter=False)
    with pytest.raises(TransientError):
        runner.call_with_retries(calls, policy)
    assert clock.slept == [0.25, 0.5]


def test_system_queries_ride_out_a_dropped_table_under_their_policy(clock: Clock) -> None:
    from chload.targets.server.target import ServerTarget

    class Client:
        asked = 0

        def post(self, sql: str, **_: object) -> bytes:
            Client.asked += 1
            raise server_error(404, OLD.format(60, "Table chload.stage_x doesn't exist."),
                               "server h:1")

    target = ServerTarget.__new__(ServerTarget)
    target.client, target.where = Client(), "server h:1"  # type: ignore[assignment]
    target._ahead = {}
    with pytest.raises(TransientError, match="stage_x doesn't exist"):
        target.rows("SELECT name FROM system.tables")
    assert Client.asked == 6 and clock.slept == [0.01, 0.02, 0.04, 0.08, 0.16]
    with pytest.raises(SchemaError):  # a table the query names: no retry
        target.rows("SELECT name FROM system.tables WHERE name = 'stage_x'")
    assert Client.asked == 7


def test_an_http_source_asks_again_under_its_policy(clock: Clock) -> None:
    from chload.sources.files.http import list_http

    answers = [(503, {}), (502, {}), (500, {})]

    def head(url: str) -> tuple[int, Mapping[str, str]]:
        return answers.pop(0)
    with pytest.raises(SourceError, match="answered HTTP 500"):
        list_http("https://h/a.csv", None, None, head=head)
    assert clock.slept == [0.5, 1.0] and answers == []


def test_an_s3_listing_asks_again_under_its_policy(clock: Clock) -> None:
    from chload.sources.files import aws
    from chload.sources.files.s3 import Lister

    answers: list[object] = [ConnectionResetError(), (503, {}, b""), (500, {}, b"")]

    class Scripted(Lister):
        def _request(self, url: str) -> tuple[int, dict[str, str], bytes]:
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer  # type: ignore[return-value]
    lister = Scripted(aws.S3Config("http://127.0.0.1:9", "us-east-1", None, True))
    with pytest.raises(SourceError, match="listing failed"):
        list(lister.list("bkt", ""))
    assert clock.slept == [0.5, 1.0] and answers == []


def test_the_lock_wait_backs_off_under_its_policy_until_its_deadline(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    from chload.commit import locks

    def command(sql: str, query_id: str) -> None:
        raise EngineError("lock exists", 57)

    def rows(sql: str) -> list[dict]:  # held by a live chload elsewhere, 1 s old
        return [{"k": "holder", "v": "elsewhere:1:1"}, {"k": "age", "v": "1"}]

    monkeypatch.setattr(locks, "LOCK_WAIT_SECONDS", 2.0)
    lock = locks.TableLock(locks.Sql(command, rows), locks.Holder("here", 2, 2),
                           sleep=clock.sleep)
    with pytest.raises(TransientError, match="another chload has been committing"):
        lock.acquire("db.t", "db.t")
    assert clock.slept[:6] == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5]
    assert sum(clock.slept) == pytest.approx(2.0)


def test_a_lock_released_between_the_create_and_the_look_is_taken() -> None:
    """Two chloads: the CREATE finds the lock (57); the holder drops it before the look
    at its holder, which 18.16 answers with "doesn't exist": take it, do not fail."""
    from chload.commit import locks
    from chload.errors import SchemaError

    creates: list[str] = []

    def command(sql: str, query_id: str) -> None:
        creates.append(sql)
        if len(creates) == 1:
            raise EngineError("lock exists", 57)

    def rows(sql: str) -> list[dict]:
        raise SchemaError(f"server: Table chload.{locks.lock_name('db.t')} doesn't exist.")

    lock = locks.TableLock(locks.Sql(command, rows), locks.Holder("here", 2, 2),
                           sleep=lambda s: None)
    lock.acquire("db.t", "db.t")
    assert len(creates) == 2 and all(c.startswith("CREATE TABLE") for c in creates)
