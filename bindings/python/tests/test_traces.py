"""Every reference trace in tests/traces/ replays through the Python API with identical
outputs, record by record and round by round."""

from __future__ import annotations

import pytest

import phalanx

from .conftest import TRACES

TRACE_FILES = sorted(TRACES.glob("*.trace"))


def test_there_are_traces():
    assert len(TRACE_FILES) >= 10, f"no traces found in {TRACES}"


@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.stem)
def test_trace_replays_through_python(path):
    trace = phalanx.Trace.load(path)
    assert isinstance(trace, phalanx.Trace) and len(trace) > 0
    native = trace.replay_native()
    assert native["records"] == len(trace)
    outputs = [o for r in trace for o in r.outputs]
    assert native["executes"] == sum(isinstance(o, phalanx.Execute) for o in outputs)
    assert native["queries"] == sum(isinstance(o, phalanx.Query) for o in outputs)
    assert native["completions"] == sum(isinstance(o, phalanx.Completed) for o in outputs)
    # Record by record: handle, drain, compare outputs and the next deadline.
    assert trace.replay() == native["outputs"]
    # The batch form: one handle_many call per round.
    assert trace.replay(batch=True) == native["outputs"]
    # And by hand, to show the records' shape.
    node = phalanx.Node(trace.node_config)
    for record in trace:
        assert isinstance(record.input, phalanx.Input)
        try:
            node.handle(record.now, record.input)
        except phalanx.HandleError as e:
            assert str(e) == record.error
        else:
            assert record.error is None
        if record.deferred:  # its round's outputs come with the round's last record
            continue
        assert list(node) == record.outputs
        assert node.poll_timeout() == record.next_timeout


def test_divergence_is_reported():
    path = TRACE_FILES[0]
    trace = phalanx.Trace.load(path)
    # Replay on a node from another configuration: the outputs differ.
    other = phalanx.Trace.load(TRACE_FILES[-1])

    class Swapped(phalanx.Trace):
        @property
        def node_config(self):
            return other.node_config

    swapped = Swapped(path.read_bytes())
    with pytest.raises(phalanx.DivergenceError):
        swapped.replay()
    assert trace.dump().strip()
    assert "Trace(label=" in repr(trace)
