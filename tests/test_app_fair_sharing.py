"""Sessions share one model fairly: a question waits behind one chunk of another session's upload, not all of it."""

from __future__ import annotations

import threading

from app.engine.metrics import LiveStats
from app.engine.model_gate import ModelGate
from app_fixtures import make_long_text
from fake_clock import FakeClock
from handler_fixtures import SETTINGS, drain, make_handlers, request, wait_until


def test_a_waiting_answer_goes_before_the_next_chunk_of_a_feed():
    gate, order = ModelGate(), []
    feed, answer_stats = object(), LiveStats()
    with gate.turn(feed, answer=False, stats=LiveStats(phase="prefill", detail="documents")):
        order.append("chunk 1")

        def answer() -> None:
            with gate.turn(object(), answer=True, stats=answer_stats):
                order.append("answer")

        asking = threading.Thread(target=answer)
        asking.start()
        wait_until(lambda: answer_stats.phase == "waiting")
        assert answer_stats.detail.startswith("behind another session's documents · waited")
    with gate.turn(feed, answer=False):  # the feed's next chunk: the waiting answer went first
        order.append("chunk 2")
    asking.join()
    assert order == ["chunk 1", "answer", "chunk 2"]
    assert answer_stats.phase == "idle"  # what it showed before waiting


def test_the_gate_is_reentrant_for_its_holder_and_owned_by_a_token_not_a_thread():
    gate, owner, other = ModelGate(), object(), object()
    turn = gate.turn(owner, answer=True)
    turn.__enter__()
    with gate.turn(owner, answer=False):  # an answer's forwards inside its own turn
        pass
    assert gate.busy
    taken = threading.Event()

    def elsewhere() -> None:
        with gate.turn(other, answer=False):
            taken.set()

    waiting = threading.Thread(target=elsewhere)
    waiting.start()
    assert not taken.wait(0.3)
    threading.Thread(target=turn.__exit__, args=(None, None, None)).start()  # released from another thread
    waiting.join(10)
    assert taken.is_set() and not gate.busy


def test_a_question_is_answered_while_another_session_is_still_feeding(runtime, tmp_path):
    handlers = make_handlers(runtime)
    feeder, asker = request("feeder"), request("asker")
    # Dozens of prefill chunks: the question, which waits for one of them, is answered long before the last.
    handlers.add_files([str(make_long_text(tmp_path / "long.txt", sentences=3000))], feeder)
    drain(handlers.read(feeder))
    feeding = threading.Thread(target=drain, args=(handlers.run(*SETTINGS, feeder),))
    feeding.start()
    feeder_stats = handlers.registry.peek("feeder").stats
    wait_until(lambda: feeder_stats.phase == "prefill" and feeder_stats.done > 0)

    handlers.submit({"text": "What is this about?", "files": []}, asker)
    view = drain(handlers.run(*SETTINGS, asker))
    done, total = feeder_stats.done, feeder_stats.total
    feeding.join()

    assert view[0][-1]["role"] == "assistant" and "(empty answer)" not in view[0][-1]["content"]
    assert done < total, f"the question waited for the whole upload ({done:,} of {total:,} tokens fed)"
    assert handlers.registry.peek("feeder").context_tokens >= total  # the feed then finished, all of it


def test_two_requests_of_one_session_run_its_actions_once_and_in_order(runtime):
    handlers = make_handlers(runtime)
    req = request("twice")
    for text in ("First question?", "Second question?"):
        handlers.submit({"text": text, "files": []}, req)
    runs = [threading.Thread(target=drain, args=(handlers.run(*SETTINGS, req),)) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    chat = handlers.registry.peek("twice").chat
    kinds = [(item.kind, item.text) for item in chat if item.kind == "question"]
    assert kinds == [("question", "First question?"), ("question", "Second question?")]
    assert sum(1 for item in chat if item.kind == "answer") == 2


def test_the_memory_budget_across_sessions_refuses_a_feed_that_would_cross_it(runtime, tmp_path):
    from app.engine.budget import Budget, middle_bytes_per_token

    document = make_long_text(tmp_path / "doc.txt", sentences=300)
    measuring = make_handlers(runtime)
    measuring.add_files([str(document)], request("measure"))
    drain(measuring.read(request("measure")))
    drain(measuring.run(*SETTINGS, request("measure")))
    tokens = measuring.registry.peek("measure").context_tokens
    per_token = middle_bytes_per_token(runtime)
    budget = Budget(1_000_000, "test", per_token, memory_bytes=int(1.5 * tokens * per_token),
                    memory_why="set with --memory-budget")
    handlers = make_handlers(runtime, budget=budget)

    def add(name: str, question: str = ""):
        handlers.submit({"text": question, "files": [str(document)]}, request(name))
        drain(handlers.read(request(name)))
        return drain(handlers.run(*SETTINGS, request(name)))

    assert add("first")[1][0][1] == "✓ in context"
    used = request("second")
    handlers.submit({"text": "Hello?", "files": []}, used)  # a context that holds something keeps recall
    drain(handlers.run(*SETTINGS, used))
    before = handlers.registry.peek("second").context_tokens
    refused = add("second")
    assert refused[1][0][1] == "⊘ refused" and "memory for contexts is taken" in refused[1][0][4]
    assert "--memory-budget" in refused[1][0][4]
    assert handlers.registry.peek("second").context_tokens == before

    fresh = add("third")  # a new context reads it without recall: its cache does not grow with it
    assert fresh[1][0][1] == "✓ in context"
    third = handlers.registry.peek("third").engine
    assert not third.keeps_recall and third.memory()["middle"] == 0 and third.length >= tokens
    handlers.unload(request("first"))  # the first session's memory is freed: now the second fits
    assert add("second")[1][-1][1] == "✓ in context"


def test_a_turn_abandoned_by_a_generator_never_closed_lapses():
    from app.engine.model_gate import STALE_S

    clock = FakeClock()
    gate, waiting = ModelGate(clock=clock), LiveStats()
    abandoned = gate.turn(object(), answer=True)
    abandoned.__enter__()  # entered, never exited (and still referenced, so never collected)
    taken = threading.Event()

    def feed() -> None:
        with gate.turn(object(), answer=False, stats=waiting):
            taken.set()

    feeding = threading.Thread(target=feed)
    feeding.start()
    wait_until(lambda: waiting.phase == "waiting")  # refused while the lapse is not yet up
    assert not taken.is_set()
    clock.advance(STALE_S + 1)
    feeding.join(10)  # let in at its next look (WAIT_TICK_S)
    assert taken.is_set()


def test_a_forward_slower_than_the_lapse_keeps_the_model_to_itself():
    """Only an answer idle between its forwards lapses; one forward (an answer's, or a feed's chunk) that runs
    longer than STALE_S (a large model on a CPU) is never joined by another."""
    from app.engine.model_gate import STALE_S

    clock = FakeClock()
    gate = ModelGate(clock=clock)
    log = []

    def forward(owner, name, done: threading.Event, answer, stats=None):
        with gate.turn(owner, answer=answer, stats=stats):  # an answer holds the gate around its forwards
            with gate.turn(owner, answer=False):  # the forward itself, as ModelRuntime.forward takes it
                log.append((name, "in"))
                done.wait(10)
                log.append((name, "out"))

    for first_is_answer in (True, False):
        log.clear()
        slow_done, waiting = threading.Event(), LiveStats()
        slow = threading.Thread(target=forward, args=(object(), "slow", slow_done, first_is_answer))
        slow.start()
        wait_until(lambda: log)
        clock.advance(STALE_S * 2)  # the forward runs longer than the lapse
        other_done = threading.Event()
        other_done.set()  # a forward that ends at once
        other = threading.Thread(target=forward, args=(object(), "other", other_done, True, waiting))
        other.start()
        wait_until(lambda: waiting.phase == "waiting")  # refused at its first look, with the lapse long past
        slow_done.set()
        slow.join()
        other.join()
        assert log == [("slow", "in"), ("slow", "out"), ("other", "in"), ("other", "out")], first_is_answer
