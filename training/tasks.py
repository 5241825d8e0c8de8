"""Synthetic long-context chat tasks that fit inside the training length.

Each task hides a fact somewhere in a distracting context and asks for it at
the end, so answering needs attention back to a far-away token.  That is the
skill LM-Infinite's top-k middle-token recall later stretches beyond the
training length.  Every task returns Llama-2 chat messages (or, for the raw
passkey variant, plain text) sized to a target token budget.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# Pass-key prompt of Mohtashami & Jaggi (2023), as used in the LM-Infinite paper.
PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
# Its first two sentences: at short training lengths the full intro rarely fits.
PASSKEY_INTRO_SHORT = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it."
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_QUESTION = "What is the pass key?"
SYSTEM_PROMPTS = [
    "You are a helpful assistant. Answer questions about the document.",
    "Answer the question using the text.",
    "You are a helpful, concise assistant.",
]


def passkey_sentence(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def passkey_answer(key: str) -> str:
    return f"The pass key is {key}."


def passkey_prompt(n_before: int, n_after: int, key: str, intro: str = PASSKEY_INTRO) -> str:
    """The paper's pass-key user message with the key after ``n_before`` fillers.

    ``intro`` is the instruction that opens the prompt ("" for none).
    """
    parts = [intro] if intro else []
    parts += [PASSKEY_FILLER] * n_before + [passkey_sentence(key)] + [PASSKEY_FILLER] * n_after
    parts.append(PASSKEY_QUESTION)
    return " ".join(parts)


@dataclass
class Sample:
    """One training/eval example: chat messages, or raw text when ``messages`` is None."""

    messages: list[dict] | None
    text: str | None
    answer: str


def _messages(rng: random.Random, turns: list[tuple[str, str]], p_system: float) -> list[dict]:
    msgs = []
    if rng.random() < p_system:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for user, answer in turns:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return msgs


class TaskMaker:
    """Builds random task samples whose token count stays within ``max_tokens``.

    ``count`` is a function text -> number of tokens, used to size contexts.
    ``code_lines`` and ``defs`` come from the corpus split the tasks draw on,
    so evaluation can use held-out files.
    """

    def __init__(self, count, code_lines: list[str], defs: list[tuple[str, str, str]], identifiers: list[str]):
        self.count = count
        self.code_lines = code_lines
        self.defs = defs  # (relative path, name, snippet starting at the def line)
        self.identifiers = identifiers
        self.filler_tokens = count(" " + PASSKEY_FILLER)

    # -- pass key ---------------------------------------------------------------------------
    def passkey(self, rng: random.Random, max_tokens: int, digits: int | None = None) -> Sample:
        """Pass key hidden in the paper's filler (or in code), asked at the end."""
        digits = digits or rng.choice([5, 5, 5, 5, 3, 4, 6, 7])
        key = str(rng.randrange(10 ** (digits - 1), 10**digits))
        answer = passkey_answer(key)
        raw = rng.random() < 0.15
        system = None if raw or rng.random() < 0.8 else rng.choice(SYSTEM_PROMPTS)
        # <s>[INST] ... [/INST] answer </s>, plus the system block if any.
        overhead = self.count(f" [/INST] {answer} ") + 4 + (self.count(system) + 6 if system else 0)
        budget = max_tokens - overhead
        intros = [i for i in (PASSKEY_INTRO, PASSKEY_INTRO_SHORT, "")
                  if self.count(passkey_prompt(0, 0, key, i)) <= budget]
        intro = rng.choice(intros) if intros else ""
        if rng.random() < 0.7:
            base = self.count(passkey_prompt(0, 0, key, intro))
            room = max(0, (budget - base) // self.filler_tokens)
            total = rng.randint(0, room)
            before = rng.randint(0, total)
            user = passkey_prompt(before, total - before, key, intro)
        else:
            user = self._passkey_in_code(rng, key, intro, budget)
        if raw:
            return Sample(None, f"{user} {answer}", answer)
        turns = [(user, answer)]
        if system:
            return Sample([{"role": "system", "content": system}] + _messages(rng, turns, 0.0), None, answer)
        return Sample(_messages(rng, turns, 0.0), None, answer)

    def _passkey_in_code(self, rng: random.Random, key: str, intro: str, budget: int) -> str:
        head = intro + "\n" if intro else ""
        fixed = self.count(head + passkey_sentence(key) + "\n" + PASSKEY_QUESTION)
        lines = self._code_block(rng, rng.randint(0, max(0, budget - fixed)))
        cut = rng.randint(0, len(lines))
        lines = lines[:cut] + [passkey_sentence(key)] + lines[cut:]
        return head + "\n".join(lines) + "\n" + PASSKEY_QUESTION

    def _code_block(self, rng: random.Random, budget: int) -> list[str]:
        """Consecutive corpus lines totalling at most ``budget`` tokens."""
        start = rng.randrange(len(self.code_lines))
        out, used = [], 0
        for line in self.code_lines[start : start + 400]:
            n = self.count(line + "\n")
            if used + n > budget:
                break
            out.append(line)
            used += n
        return out

    # -- key-value lookup ---------------------------------------------------------------------
    def kv_lookup(self, rng: random.Random, max_tokens: int) -> Sample:
        """A list of `key: value` lines, then 1-3 turns each asking one value."""
        n_q = rng.choice([1, 1, 2, 3])
        words = rng.random() < 0.3
        header = "Here are some keys and their values. Remember them."
        longest = "x" * 15
        turn = self.count(f" [/INST] The value of {longest} is {longest}. </s><s>[INST] What is the value of {longest}? ")
        budget = max_tokens - 8 - n_q * turn - self.count(header)
        target = rng.randint(min(budget, 2 * n_q * 8), budget)
        pairs, used, seen = [], 0, set()
        while True:
            k = rng.choice(self.identifiers)
            if k in seen:
                continue
            v = rng.choice(self.identifiers) if words else str(rng.randrange(1000, 1000000))
            n = self.count(f"\n{k}: {v}")
            if used + n > target and len(pairs) >= n_q:
                break
            seen.add(k)
            pairs.append((k, v))
            used += n
        asked = rng.sample(pairs, n_q)
        body = header + "\n" + "\n".join(f"{k}: {v}" for k, v in pairs)
        turns = []
        for i, (k, v) in enumerate(asked):
            q = f"What is the value of {k}?"
            turns.append(((body + "\n" + q) if i == 0 else q, f"The value of {k} is {v}."))
        return Sample(_messages(rng, turns, 0.0), None, turns[0][1])

    # -- verbatim repeat ----------------------------------------------------------------------
    def repeat(self, rng: random.Random, max_tokens: int) -> Sample:
        """Repeat a string of random numbers, identifiers or code back verbatim.

        Copying an earlier span is the densest signal for the induction heads
        that pass-key recall relies on, and those heads form slowly in a model
        this small and this briefly trained.
        """
        kind = rng.choice(["numbers", "numbers", "identifiers", "code"])
        header = {"numbers": "Repeat these numbers:", "identifiers": "Repeat these words:", "code": "Repeat this code:"}[kind]
        budget = max(8, (max_tokens - 12 - self.count(header)) // 2)
        target = rng.randint(min(budget, 6), budget)
        if kind == "code":
            text = "\n".join(self._code_block(rng, target)) or "pass"
        else:
            items, used = [], 0
            while True:
                item = (str(rng.randrange(10 ** rng.randint(1, 6))) if kind == "numbers"
                        else rng.choice(self.identifiers))
                n = self.count(" " + item)
                if used + n > target and items:
                    break
                items.append(item)
                used += n
            text = " ".join(items)
        return Sample(_messages(rng, [(f"{header}\n{text}", text)], 0.0), None, text)

    # -- which file defines X ---------------------------------------------------------------
    def which_file(self, rng: random.Random, max_tokens: int) -> Sample:
        """Snippets of several files, each under a `# File:` header; which one defines X?"""
        header = "Here is code from several files."
        longest = "x" * 30
        qa = self.count(f" Which file defines `{longest}`? [/INST] `{longest}` is defined in {longest}. ")
        budget = max_tokens - 8 - qa - self.count(header)
        n_files = rng.randint(2, max(2, min(5, budget // 60)))
        per = max(16, budget // n_files)
        chosen, paths = [], set()
        while len(chosen) < n_files:
            path, name, snippet = rng.choice(self.defs)
            if path in paths:
                continue
            block = self._clip(f"# File: {path}\n{snippet}", rng.randint(per // 2, per))
            chosen.append((path, name, block))
            paths.add(path)
        used = 0
        kept = []
        for item in chosen:
            n = self.count(item[2] + "\n")
            if used + n > budget and len(kept) >= 2:
                break
            kept.append(item)
            used += n
        path, name, _ = rng.choice(kept)
        pattern = re.compile(rf"^\s*(def|class)\s+{re.escape(name)}\b", re.M)
        kept = [k for k in kept if k[0] == path or not pattern.search(k[2])]
        q = f"Which file defines `{name}`?"
        user = header + "\n" + "\n".join(k[2] for k in kept) + "\n" + q
        answer = f"`{name}` is defined in {path}."
        return Sample(_messages(rng, [(user, answer)], 0.1), None, answer)

    def _clip(self, text: str, budget: int) -> str:
        """Whole lines of ``text`` that fit in ``budget`` tokens (at least two lines)."""
        lines = text.split("\n")
        out, used = [], 0
        for line in lines:
            n = self.count(line + "\n")
            if used + n > budget and len(out) >= 2:
                break
            out.append(line)
            used += n
        return "\n".join(out)


_DEF = re.compile(r"^(def|class)\s+([A-Za-z_]\w*)", re.M)
_IDENT = re.compile(r"\b[a-z][a-z0-9_]{3,14}\b")


def index_definitions(files: list[tuple[str, str]], lines_after: int = 8) -> list[tuple[str, str, str]]:
    """Top-level ``def``/``class`` names per file with a short snippet from the def line."""
    out = []
    for rel, text in files:
        lines = text.split("\n")
        seen = set()
        for m in _DEF.finditer(text):
            name = m.group(2)
            if name in seen:
                continue
            seen.add(name)
            row = text.count("\n", 0, m.start())
            out.append((rel, name, "\n".join(lines[row : row + lines_after])))
    return out


def collect_identifiers(texts: list[str], limit: int = 5000) -> list[str]:
    """The most frequent lowercase identifiers, sorted for determinism."""
    counts: dict[str, int] = {}
    for t in texts:
        for w in _IDENT.findall(t):
            counts[w] = counts.get(w, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return sorted(w for w, _ in top)
