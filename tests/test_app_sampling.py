"""next_token through transformers' logits processors, checked against the rules they replaced."""

from __future__ import annotations

import random

import pytest
import torch

from app.engine.generation import GenerationSettings, next_token, next_token_scores


def kept(scores: torch.Tensor) -> set[int]:
    return set(torch.isfinite(scores).nonzero().flatten().tolist())


def hand_written_top_p(logits: torch.Tensor, temperature: float, top_p: float) -> set[int]:
    """The rule the app had: keep a token while the mass strictly before it (best first) is below top_p."""
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(0) - sorted_probs
    return set(order[before < top_p].tolist())


@pytest.mark.parametrize("vocab, dtype", [(2, torch.float32), (50, torch.float32), (1000, torch.float32),
                                          (32000, torch.float64)])
def test_top_p_keeps_what_the_hand_written_rule_kept(vocab, dtype):
    generator, rng = torch.Generator().manual_seed(vocab), random.Random(vocab)
    for _ in range(100):
        logits = (torch.randn(vocab, generator=generator, dtype=torch.float64) * rng.choice([0.1, 1, 3, 10])).to(dtype)
        temperature, top_p = rng.choice([0.2, 0.7, 1.0, 1.5]), rng.uniform(0.01, 0.999)
        settings = GenerationSettings(temperature=temperature, top_p=top_p)
        assert kept(next_token_scores(logits, [], settings)) == hand_written_top_p(logits, temperature, top_p)


@pytest.mark.parametrize("k", range(1, 8))
def test_top_p_edge_a_mass_of_exactly_top_p_is_enough(k):
    logits = torch.zeros(8)  # every token holds exactly 1/8: cumulative masses are exact in floating point
    assert len(kept(next_token_scores(logits, [], GenerationSettings(temperature=1.0, top_p=k / 8)))) == k
    assert len(kept(next_token_scores(logits, [], GenerationSettings(temperature=1.0, top_p=k / 8 + 1e-3)))) == k + 1


def test_top_p_one_filters_nothing():
    logits = torch.tensor([10.0, 0.0, -1e4, -float("inf")])
    assert kept(next_token_scores(logits, [], GenerationSettings(temperature=1.0, top_p=1.0))) == {0, 1, 2}


def test_repetition_penalty_sees_only_the_answer():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.0, 4.0])
    before = logits.clone()
    scores = next_token_scores(logits, [0, 1, 0, 3], GenerationSettings(temperature=0, repetition_penalty=2.0))
    assert scores.tolist() == [1.0, -4.0, 1.0, 0.0, 4.0]  # positive halved, negative doubled, once per token
    assert torch.equal(logits, before)
    penalised = GenerationSettings(temperature=0, repetition_penalty=2.0)
    assert next_token(torch.tensor([1.0, 3.0, 2.9]), [1], penalised) == 2


def test_sampling_draws_from_the_generator_and_greedy_does_not():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(1))
    settings = GenerationSettings(temperature=1.0, top_p=0.95)
    draws = [[next_token(logits, [], settings, torch.Generator().manual_seed(7)) for _ in range(3)] for _ in range(2)]
    assert draws[0] == draws[1]
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    assert next_token(logits, [], GenerationSettings(temperature=0), generator) == int(logits.argmax())
    assert torch.equal(generator.get_state(), state)
