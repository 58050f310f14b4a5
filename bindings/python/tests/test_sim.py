"""The simulator from Python."""

import pytest

import phalanx


@pytest.mark.parametrize("protocol", ["pbft", "bracha", "pubsub"])
def test_simulate_correct_run(protocol):
    r = phalanx.simulate(protocol, f=1, seed=3, adversarial=False)
    assert r["ok"], r["violations"]
    assert r["violations"] == [] and r["messages_sent"] > 0
    if protocol == "pbft":
        assert r["completed"] == r["expected_completions"] > 0 and r["states_equal"]
    else:
        assert r["deliveries"] >= r["expected_deliveries"] > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulate_adversarial_pbft(seed):
    r = phalanx.simulate("pbft", f=1, seed=seed)
    assert r["ok"], r["violations"]


def test_simulate_rejects_unknown():
    with pytest.raises(ValueError, match="protocol"):
        phalanx.simulate("raft")
    with pytest.raises(ValueError):
        phalanx.simulate("pbft", f=0)
