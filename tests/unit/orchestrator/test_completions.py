"""A completion's per-token versions, as packed for the trainer."""

from __future__ import annotations

from tidal.orchestrator.completions import Completion


def test_model_token_versions_are_spread_over_the_model_tokens_of_an_episode() -> None:
    single = Completion(0, (5, 6, 7), (-0.1, -0.2, -0.3), (3, 3, 4), stopped=True)
    assert single.token_versions() == (3, 3, 4)
    episode = Completion(
        0,
        (5, 6, 7, 8, 9),
        (-0.1, -0.2, 0.0, 0.0, -0.3),
        (3, 3, 4),  # model tokens only
        stopped=True,
        loss_mask=(1.0, 1.0, 0.0, 0.0, 1.0),
    )
    assert episode.token_versions() == (3, 3, -1, -1, 4)
