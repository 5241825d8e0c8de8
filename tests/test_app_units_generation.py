"""Fast unit tests of sampling: the loop guard, whole sentences, greedy, top-p and the repetition penalty. No model,
no server."""

from __future__ import annotations

import pytest
import torch

from app.engine.generation import GenerationSettings, next_token
from app.session.state import ChatItem
from app.web import views


# -- sampling ------------------------------------------------------------------------------------
def test_loop_guard_stops_an_answer_that_repeats_itself_and_says_where_the_repeat_began():
    from app.engine.generation import LoopGuard

    sentence = [5, 6, 7, 8, 9, 10]  # "The document is written by Thomas Leonard," and again
    guard, answer, stopped = LoopGuard(n=4), [], None
    for token in sentence + [11] + sentence:
        answer.append(token)
        stopped = guard.repeat_from(answer)
        if stopped is not None:
            break
    assert len(answer) == len(sentence) + 1 + 4  # the first 4 tokens seen twice
    assert answer[:stopped] == sentence + [11]  # what is kept: everything before the second copy
    varied, guard = [], LoopGuard(n=4)
    assert all(guard.repeat_from(varied) is None
               for token in [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 4, 4] if not varied.append(token))
    assert views.answer_markdown(ChatItem("assistant", "answer", "x", stats={"finish": "repetition", "tokens": 9})) \
        .endswith("9 tokens · cut where the answer began to repeat itself</sub>")


def test_a_cut_answer_keeps_its_whole_sentences_or_lines():
    from app.engine.generation import whole_sentences

    def kept(pieces):
        return "".join(pieces[: whole_sentences(pieces, "".join)])

    assert kept(["The author", " is Thomas", " Leonard.", "\n\n", "The document", " is not"]) \
        == "The author is Thomas Leonard."  # the blank lines after it go too
    assert kept(["It said \"", "yes.", "\"", " and then", " it"]) == "It said \"yes.\""
    assert kept(["**Leonard", ".**", " He also"]) == "**Leonard.**"
    assert kept(["Steps:", "\n", "1.", " Open the"]) == "Steps:"  # a list number ends no sentence
    assert kept(["Is it", " 7?", " ", " Or"]) == "Is it 7?"
    assert kept(["no end", " anywhere", " here"]) == "no end anywhere here"  # nothing to go back to: all kept


def test_greedy_top_p_and_repetition_penalty():
    logits = torch.tensor([1.0, 3.0, 2.9, -5.0])
    assert next_token(logits, [], GenerationSettings(temperature=0)) == 1
    penalised = GenerationSettings(temperature=0, repetition_penalty=2.0)
    assert next_token(logits, [1], penalised) == 2  # 3.0 / 2 < 2.9
    generator = torch.Generator().manual_seed(0)
    narrow = GenerationSettings(temperature=1.0, top_p=0.4)
    picks = {next_token(logits, [], narrow, generator) for _ in range(50)}
    assert picks == {1}  # token 1 alone holds 49% of the mass, more than top_p
    wide = GenerationSettings(temperature=1.0, top_p=1.0)
    assert {next_token(logits, [], wide, generator) for _ in range(200)} >= {1, 2}
    with pytest.raises(ValueError):
        GenerationSettings(top_p=0)
