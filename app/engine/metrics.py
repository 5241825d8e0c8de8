"""Numbers for the live panel: device memory, KV-cache bytes, throughput and time to first token.

The engine writes a session's ``LiveStats`` (plain floats and ints) as it works; the 1-second timer reads
them, adds the device's memory, and appends a sample to the session's time series while work runs. Nothing here holds a
tensor, so the UI can read it from any thread.
"""

from __future__ import annotations

import resource
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum

import psutil
import torch


def human_seconds(seconds: float | None) -> str:
    """'250 ms', '9.8 s', '15.8 min': a duration written one way everywhere (the chat's reading line and the
    panel once showed one ETA as '948.0 s' and as '15.8 min')."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


@dataclass(frozen=True)
class DeviceMemory:
    """GPU memory summed over the visible devices, or this process's RSS on CPU (bytes)."""

    kind: str  # "cuda" or "cpu"
    allocated: int
    reserved: int | None
    peak: int
    total: int
    label: str


def device_memory(device_type: str) -> DeviceMemory:
    if device_type == "cuda" and torch.cuda.is_available():
        n = torch.cuda.device_count()
        allocated = sum(torch.cuda.memory_allocated(i) for i in range(n))
        reserved = sum(torch.cuda.memory_reserved(i) for i in range(n))
        peak = sum(torch.cuda.max_memory_allocated(i) for i in range(n))
        total = sum(torch.cuda.get_device_properties(i).total_memory for i in range(n))
        names = {torch.cuda.get_device_name(i) for i in range(n)}
        return DeviceMemory("cuda", allocated, reserved, peak, total, f"{n} × {', '.join(sorted(names))}")
    rss = psutil.Process().memory_info().rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return DeviceMemory("cpu", rss, None, max(peak, rss), psutil.virtual_memory().total, "CPU (process RSS)")


class Phase(StrEnum):
    """What the session's work is now. The value is what the panel's JSON says; views.PHASE_LABELS says it in words."""

    IDLE = "idle"
    READING = "reading"  # ingest alone (``LiveStats.reading``): the panel names it while the model is idle
    PREFILL = "prefill"
    DECODE = "decode"
    WAITING = "waiting"  # behind another session (model_gate.py)
    SAVING = "saving"  # writing the workspace (model_work.py)


class Feeding(StrEnum):
    """What a prefill reads. The value is the panel's detail, and what a Stop says was under way."""

    QUESTION = "question"  # a question (and the neutral one before it): its short prefill measures latency
    GUESS = "guessed answer"  # the answer the model guesses before the documents are searched (guess.py)
    DOCUMENTS = "documents"
    ANSWER = "answer"  # an answer drawn in the reader, read into the context after its question
    QUOTES = "quoted passages"  # the passages quoted for an answer, read in the reader before its first token
    CONVERSATION = "conversation"  # an exchange fed as text (replay.py)


@dataclass
class LiveStats:
    """One session's latest figures; rates are those of the running phase, else of the last one."""

    phase: Phase = Phase.IDLE  # the model's work (Phase.READING is never set here: ``reading`` says it)
    detail: str = ""  # the phase's words: what is fed or answered, whom it waits behind, the workspace saved
    reading: str = ""  # ingest progress, on its own queue: may overlap the model's work
    context_tokens: int = 0
    kv_starting: int = 0
    kv_window: int = 0
    kv_middle: int = 0
    kv_other: int = 0  # the rotation tables and the middle store's spare capacity: held, so counted
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    ttft_s: float | None = None
    done: int = 0  # units of the running phase finished / planned (tokens for prefill)
    total: int = 0
    eta_s: float | None = None
    feeding: Feeding | None = None  # what the running prefill reads (not in the panel's JSON: ``detail`` says it)

    def idle(self) -> None:
        """Back to idle (the work ended, failed or was rolled back): no detail, no ETA."""
        self.phase, self.detail, self.eta_s, self.feeding = Phase.IDLE, "", None, None

    def prefilling(self, what: Feeding, total: int) -> None:
        """A prefill of ``total`` tokens starts."""
        self.phase, self.detail, self.feeding, self.done, self.total = Phase.PREFILL, what.value, what, 0, total
        self.eta_s = None  # not the last prefill's "0 ms": unknown until this one has run a while

    @contextmanager
    def aside(self):
        """Work done between two chunks of a feed (a question answered meanwhile): the feed's phase and progress
        come back once it ends, however it ends."""
        kept = self.phase, self.detail, self.feeding, self.done, self.total, self.eta_s, self.prefill_tps
        try:
            yield
        finally:
            self.phase, self.detail, self.feeding, self.done, self.total, self.eta_s, self.prefill_tps = kept

    def decoding(self, total: int) -> None:
        """An answer of at most ``total`` tokens starts."""
        self.phase, self.detail, self.feeding = Phase.DECODE, "answer", None
        self.done, self.total, self.eta_s = 0, total, None

    @property
    def answering(self) -> bool:
        """An answer's work: its question's prefill, its quotes read in the reader, or its decode."""
        return self.phase == Phase.DECODE or self.feeding in (Feeding.GUESS, Feeding.QUESTION, Feeding.QUOTES)

    def set_kv(self, memory: dict[str, int]) -> None:
        self.kv_starting, self.kv_window = memory["starting"], memory["window"]
        self.kv_middle = memory["middle"] + memory.get("middle_scan", 0)  # the store's rows and their scan copy
        self.kv_other = sum(memory.values()) - self.kv_starting - self.kv_window - self.kv_middle

    @property
    def kv_total(self) -> int:
        return self.kv_starting + self.kv_window + self.kv_middle + self.kv_other

    @property
    def active(self) -> bool:
        """Reading or model work under way (the charts sample only then)."""
        return self.phase != Phase.IDLE or bool(self.reading)

    @property
    def running_rates(self) -> tuple[float, float]:
        """(prefill, decode) tokens/s of the running phase only: an idle or other phase plots 0, not its
        last value. A question's short prefill measures latency, not throughput (engine.MEASURED_PREFILL)."""
        latency = (Feeding.QUESTION, Feeding.GUESS)
        prefill = self.prefill_tps if self.phase == Phase.PREFILL and self.feeding not in latency else 0.0
        return prefill, self.decode_tps if self.phase == Phase.DECODE else 0.0


MIN_RATE_S = 0.25  # a rate needs this much real time and work behind it: one token over microseconds
MIN_RATE_TOKENS = 2  # once read as 150,000 tok/s and squashed the throughput chart


class RateMeter:
    """Tokens per second over one phase, measured with a monotonic clock."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.started = clock()
        self.tokens = 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @contextmanager
    def paused(self):
        """Time spent inside is not the phase's: a feed waits between two forwards while a question asked meanwhile
        is answered, and its rate and ETA are the feed's own."""
        began = self.clock()
        try:
            yield
        finally:
            self.started += self.clock() - began

    @property
    def rate(self) -> float:
        """The running rate; 0 until the phase has run MIN_RATE_S and MIN_RATE_TOKENS."""
        elapsed = self.elapsed
        if elapsed < MIN_RATE_S or self.tokens < MIN_RATE_TOKENS:
            return 0.0
        return self.tokens / elapsed

    @property
    def final_rate(self) -> float:
        """The rate of a finished phase: its whole real duration, however short, once it did MIN_RATE_TOKENS."""
        elapsed = self.elapsed
        return self.tokens / elapsed if elapsed > 0 and self.tokens >= MIN_RATE_TOKENS else 0.0

    def eta(self, remaining: int) -> float | None:
        rate = self.rate
        return remaining / rate if rate > 0 else None


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the session started
    memory_mb: float
    kv_mb: float
    prefill_tps: float
    decode_tps: float


@dataclass
class SessionSeries:
    """The session's memory / throughput history for the plots.

    A sample is taken per timer tick while work runs, plus one when it stops (the rates drop to 0 there);
    idle ticks add nothing, so an idle tab redraws no chart.
    """

    started: float = field(default_factory=time.monotonic)
    samples: deque = field(default_factory=lambda: deque(maxlen=900))
    version: int = 0  # samples ever appended: a new one means the plots changed

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._was_active = True  # the first tick records the starting point
        self._kv = -1
        self._sampled_at: float | None = None  # monotonic time of the last sample

    def record(self, memory: DeviceMemory, stats: LiveStats, every_s: float = 0.0) -> Sample | None:
        """Append this tick's sample; None while idle with nothing changed since the last (idle) sample, and
        while work goes on within ``every_s`` of the last sample (several tabs showing one session each tick
        it: the plots still get one sample per tick).

        Work shorter than a tick still shows: the KV cache it grew is a change, as are work starting and ending.
        """
        active = stats.active
        with self._lock:
            if not active and not self._was_active and stats.kv_total == self._kv:
                return None
            now = time.monotonic()
            if active and self._was_active and self._sampled_at is not None and now - self._sampled_at < every_s:
                return None  # this tick's sample was taken by another tab's
            self._sampled_at = now
            self._was_active, self._kv = active, stats.kv_total
            prefill, decode = stats.running_rates
            sample = Sample(t=round(time.monotonic() - self.started, 1), memory_mb=memory.allocated / 2**20,
                            kv_mb=stats.kv_total / 2**20, prefill_tps=prefill, decode_tps=decode)
            self.samples.append(sample)
            self.version += 1
        return sample

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)


def stats_dict(stats: LiveStats, memory: DeviceMemory) -> dict:
    """Everything the panel shows, as JSON for the API and the tests."""
    numbers = {**asdict(stats), "kv_total": stats.kv_total, "memory": asdict(memory)}
    numbers["phase"] = str(stats.phase)  # the plain word, as the panel always said it
    del numbers["feeding"]  # the detail says it
    return numbers
