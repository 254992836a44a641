"""FilterPruning's accept/reject/back-off rule, tested as the pure function it is."""

import pytest

from nestflex.pruning import StepDecision, decide_step


def test_a_step_that_meets_the_goal_is_kept_and_earns_back_the_step_size():
    assert decide_step(0.9, 0.9, scale=1.0, retries=0, backoff=2) == StepDecision("keep", 1.0, 0)
    assert decide_step(0.95, 0.9, scale=0.25, retries=2, backoff=2) == StepDecision("keep", 0.5, 0)


@pytest.mark.parametrize("backoff", [0, 1, 3])
def test_broken_steps_are_retried_with_half_the_step_then_stop(backoff):
    scale, retries, actions = 1.0, 0, []
    while True:
        d = decide_step(0.5, 0.9, scale, retries, backoff)
        actions.append(d.action)
        if d.action == "stop":
            assert d.status == "goal_broken" and d.scale == scale and d.retries == retries
            break
        assert d.action == "retry" and d.scale == scale / 2 and d.retries == retries + 1 and d.status is None
        scale, retries = d.scale, d.retries
    assert actions == ["retry"] * backoff + ["stop"]


def test_a_kept_step_after_retries_resets_the_retry_count():
    d = decide_step(0.5, 0.9, 1.0, 0, backoff=2)
    d = decide_step(0.91, 0.9, d.scale, d.retries, backoff=2)
    assert d == StepDecision("keep", 1.0, 0)
    # the next broken step is allowed its full back-off again
    assert decide_step(0.5, 0.9, d.scale, d.retries, backoff=2).action == "retry"


def test_a_missed_goal_is_recovered_before_it_counts_as_broken():
    # two recovery epochs allowed: recover, recover, then the back-off as before
    d = decide_step(0.85, 0.9, 1.0, 0, backoff=1, recovered=0, recover=2)
    assert d == StepDecision("recover", 1.0, 0)
    assert decide_step(0.85, 0.9, 1.0, 0, backoff=1, recovered=1, recover=2).action == "recover"
    assert decide_step(0.85, 0.9, 1.0, 0, backoff=1, recovered=2, recover=2) == StepDecision("retry", 0.5, 1)
    assert decide_step(0.85, 0.9, 0.5, 1, backoff=1, recovered=2, recover=2).action == "stop"
    # a recovered step that meets the goal is kept like any other
    assert decide_step(0.91, 0.9, 0.5, 1, backoff=1, recovered=1, recover=2) == StepDecision("keep", 1.0, 0)


def test_the_retry_budget_bounds_rejected_tries_over_the_whole_roadmap():
    """``backoff`` counts broken steps in a row; a kept step resets it but not the budget."""
    assert decide_step(0.5, 0.9, 1.0, 0, backoff=2, rejected=2, retry_budget=3) == StepDecision("retry", 0.5, 1)
    assert decide_step(0.5, 0.9, 1.0, 0, backoff=2, rejected=3, retry_budget=3) == StepDecision(
        "stop", 1.0, 0, "goal_broken")
    assert decide_step(0.5, 0.9, 1.0, 0, backoff=2, rejected=0, retry_budget=0).action == "stop"
    assert decide_step(0.5, 0.9, 1.0, 0, backoff=2, rejected=99).action == "retry"  # no budget: no bound
    assert decide_step(0.95, 0.9, 1.0, 0, backoff=2, rejected=5, retry_budget=3).action == "keep"
