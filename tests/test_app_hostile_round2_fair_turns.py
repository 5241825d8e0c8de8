"""Hostile use, round 2 (issue 31), item 12: questions do not starve uploads.

Answers went before the next chunk of any feed for as long as any answer waited: five clients asking in a loop
kept three others' 2 KB files waiting 123 s. Now a feed that waits gets its next chunk after one answer."""

from __future__ import annotations

import threading
import time

from app.engine.metrics import LiveStats
from app.engine.model_gate import ModelGate
from handler_fixtures import wait_until


def test_a_waiting_feed_gets_its_next_chunk_after_one_answer_however_many_answers_wait():
    gate, order, lock = ModelGate(), [], threading.Lock()

    def turn(owner, answer: bool, name: str, stats: LiveStats) -> None:
        with gate.turn(owner, answer=answer, stats=stats):
            with lock:
                order.append(name)
            time.sleep(0.1)  # long enough for the feed to ask for its next chunk meanwhile

    feed = object()
    answers = [LiveStats() for _ in range(4)]
    feed_stats = LiveStats(phase="prefill", detail="documents")
    with gate.turn(feed, answer=False, stats=feed_stats):  # the feed's first chunk; four sessions ask meanwhile
        order.append("chunk 1")
        threads = [threading.Thread(target=turn, args=(object(), True, "answer", stats)) for stats in answers]
        for thread in threads:
            thread.start()
        wait_until(lambda: all(stats.phase == "waiting" for stats in answers), timeout_s=10.0)
    threads.append(threading.Thread(target=turn, args=(feed, False, "chunk 2", feed_stats)))  # asked at once
    threads[-1].start()
    for thread in threads:
        thread.join(10)

    assert order.index("chunk 2") <= 2, f"the feed waited for every answer: {order}"
    assert order[:2] == ["chunk 1", "answer"]  # a waiting answer still goes before the next chunk
