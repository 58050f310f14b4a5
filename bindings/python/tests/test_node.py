"""The node API: configuration, inputs and outputs, the batch form, errors."""

from __future__ import annotations

import pytest

import phalanx


@pytest.fixture(scope="module")
def pbft():
    return phalanx.generate_cluster(f=1, protocol="pbft", clients=2, seed=7)


def test_generate_cluster_shapes(pbft):
    assert len(pbft) == 6
    assert all(isinstance(c, bytes) for c in pbft)
    info = phalanx.describe_config(pbft[4])
    assert info["id"] == 4 and info["role"] == "publisher" and info["protocol"] == "pbft"
    assert info["replicas"] == [0, 1, 2, 3] and info["publishers"] == [4, 5]
    pubsub = phalanx.generate_cluster(7, 2, seed=b"\x01" * 32)
    assert len(pubsub) == 7 + 1 + 2
    # Deterministic from the seed.
    assert phalanx.generate_cluster(f=1, protocol="pbft", clients=2, seed=7) == pbft
    assert phalanx.generate_cluster(f=1, protocol="pbft", clients=2, seed=8) != pbft


def test_node_properties(pbft):
    node = phalanx.Node(pbft[0])
    assert node.id == 0 and node.role == "broker" and node.protocol == "pbft" and node.f == 1
    assert node.replica_ids == [0, 1, 2, 3]
    assert "Node(id=0" in repr(node)
    st = node.status()
    assert st["view"] == 0 and st["primary"] is True and st["executed"] == 0
    assert set(node.stats()) == {"stale", "beyond_window", "unsubscribed"}


def test_client_submit_produces_sends(pbft):
    client = phalanx.Node(pbft[4])
    assert client.next_request() is not None
    client.handle(1_000, phalanx.Submit(phalanx.kv.put(b"k", b"v")))
    outs = list(client)  # iterating drains
    assert outs, "a submit produces outputs"
    # Persist before send: the lease is persisted first, sends wait for the ack.
    assert isinstance(outs[0], phalanx.Persist)
    assert not any(isinstance(o, phalanx.Send) for o in outs)
    assert client.poll() is None
    client.handle(2_000, phalanx.Persisted(outs[0].token))
    sends = [o for o in client.drain() if isinstance(o, phalanx.Send)]
    assert {s.to for s in sends} <= {0, 1, 2, 3} and sends
    assert isinstance(sends[0].data, bytes)
    assert repr(sends[0]).startswith("Send(to=")
    assert client.poll_timeout() is not None


def test_a_full_round_in_memory(pbft):
    """Four replica nodes and a client wired in memory: the client's put completes."""
    nodes = {i: phalanx.Node(pbft[i]) for i in range(5)}
    ci = 4
    now = 1_000
    queue = [(ci, phalanx.Submit(phalanx.kv.put(b"k", b"v")))]
    apps = {i: phalanx.KvStore() for i in range(4)}
    completed = []
    for _ in range(10_000):
        if not queue:
            # Fire the earliest timer.
            due = [(n.poll_timeout(), i) for i, n in nodes.items() if n.poll_timeout() is not None]
            if not due or completed:
                break
            now, i = min(due)
            queue.append((i, phalanx.Timeout()))
        i, inp = queue.pop(0)
        for out in nodes[i].handle_many([(now, inp)]):
            if isinstance(out, phalanx.Send):
                queue.append((out.to, phalanx.Message(i, out.data)))
            elif isinstance(out, phalanx.Persist):
                queue.append((i, phalanx.Persisted(out.token)))
            elif isinstance(out, phalanx.Execute):
                results = [apps[i].execute(op.op) for op in out.ops]
                assert all(isinstance(op, phalanx.Operation) and op.client == ci for op in out.ops)
                snap = apps[i].snapshot() if out.seq % nodes[i].checkpoint_interval == 0 else None
                queue.append((i, phalanx.Executed(out.seq, results, snap)))
            elif isinstance(out, phalanx.Completed):
                completed.append(out)
    assert len(completed) == 1
    assert phalanx.kv.decode_value(completed[0].result) is None
    assert all(apps[i].get(b"k") == b"v" for i in range(4))


def test_inputs_compare_and_repr():
    assert phalanx.Message(1, b"ab") == phalanx.Message(1, b"ab")
    assert phalanx.Message(1, b"ab") != phalanx.Message(2, b"ab")
    assert repr(phalanx.Timeout()) == "Timeout()"
    assert repr(phalanx.Message(3, b"x" * 100)).endswith("…(100 bytes))")
    assert phalanx.Publish(0, b"p", "bracha").algorithm == "bracha"
    e = phalanx.Executed(4, [b"a", bytearray(b"b")], None)
    assert e.results == [b"a", b"b"] and e.snapshot is None
    assert isinstance(phalanx.Message(1, b""), phalanx.Input)
    assert "bad_mac" in phalanx.FAULT_KINDS


# -- bad input ---------------------------------------------------------------------------


def test_malformed_config_raises_config_error():
    with pytest.raises(phalanx.ConfigError, match="invalid configuration"):
        phalanx.Node(b"\xff\x00garbage")
    with pytest.raises(phalanx.ConfigError):
        phalanx.Node(b"")
    with pytest.raises(phalanx.ConfigError):
        phalanx.describe_config(b"\x08\x96\x01")
    assert issubclass(phalanx.ConfigError, phalanx.PhalanxError)


def test_wrong_types_raise_type_error(pbft):
    node = phalanx.Node(pbft[0])
    with pytest.raises(TypeError):
        phalanx.Node("not bytes")
    with pytest.raises(TypeError):
        phalanx.Node(None)
    with pytest.raises(TypeError, match="phalanx.Input"):
        node.handle(0, "timeout")
    with pytest.raises(TypeError):
        node.handle("now", phalanx.Timeout())
    with pytest.raises(OverflowError):
        node.handle(-1, phalanx.Timeout())
    with pytest.raises(TypeError):
        phalanx.Message("one", b"")
    with pytest.raises(TypeError, match="expected bytes"):
        phalanx.Message(1, "text")
    with pytest.raises(TypeError, match="not a \\(now, input\\) tuple"):
        node.handle_many([phalanx.Timeout()])
    with pytest.raises(TypeError):
        node.handle_many(5)
    with pytest.raises(ValueError, match="algorithm"):
        phalanx.Node(phalanx.generate_cluster(f=1)[4]).handle(0, phalanx.Publish(0, b"", "paxos"))
    with pytest.raises(ValueError, match="unknown parameter"):
        phalanx.generate_cluster(f=1, params={"nope": 1})
    with pytest.raises(ValueError, match="protocol"):
        phalanx.generate_cluster(f=1, protocol="raft")
    with pytest.raises(phalanx.ConfigError, match="3f\\+1"):
        phalanx.generate_cluster(3, 1)


def test_wrong_role_raises_handle_error(pbft):
    replica = phalanx.Node(pbft[0])
    with pytest.raises(phalanx.HandleError, match="cannot handle"):
        replica.handle(0, phalanx.Submit(b"op"))
    # The batch form goes on and reports the refusal.
    errors = []
    replica.handle_many([(0, phalanx.Submit(b"op")), (1, phalanx.Timeout())], errors)
    assert errors and errors[0][0] == 0 and "cannot handle" in errors[0][1]
    with pytest.raises(phalanx.HandleError) as info:
        replica.handle_many([(0, phalanx.Submit(b"op"))])
    assert info.value.errors[0][0] == 0 and isinstance(info.value.outputs, list)


def test_garbage_bytes_never_crash(pbft):
    import random

    rng = random.Random(1)
    node = phalanx.Node(pbft[0])
    faults = 0
    for i in range(2000):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
        sender = rng.choice([1, 2, 3, 4, 5, 99, 2**32 - 1])
        node.handle(i, phalanx.Message(sender, data))
        faults += sum(isinstance(o, phalanx.Fault) for o in node.drain())
    assert faults > 0
    # Truncated and mutated real frames too.
    client = phalanx.Node(pbft[4])
    client.handle(0, phalanx.Submit(b"x"))
    (p,) = [o for o in client.drain() if isinstance(o, phalanx.Persist)]
    client.handle(0, phalanx.Persisted(p.token))
    frame = next(o.data for o in client.drain() if isinstance(o, phalanx.Send) and o.to == 0)
    for cut in range(0, len(frame), 7):
        node.handle(10_000, phalanx.Message(4, frame[:cut]))
        mutated = bytearray(frame)
        mutated[cut] ^= 0x55
        node.handle(10_000, phalanx.Message(4, bytes(mutated)))
    node.drain()
    assert isinstance(node.status(), dict)


def test_garbage_kv_and_trace_and_recover(pbft):
    with pytest.raises(phalanx.KvError):
        phalanx.kv.decode_value(b"\xff\xff")
    with pytest.raises(phalanx.KvError):
        phalanx.KvStore().restore(b"\x01\x02")
    assert phalanx.KvStore().execute(b"garbage").startswith(b"E")
    with pytest.raises(phalanx.TraceError, match="malformed trace"):
        phalanx.Trace(b"\x05hello")
    with pytest.raises(phalanx.TraceError):
        phalanx.Trace(b"")
    with pytest.raises(OSError):
        phalanx.Trace.load("/nonexistent/file.trace")
    node = phalanx.Node(pbft[0])
    try:
        node.handle(0, phalanx.Recover(b"\x00garbage"))
    except phalanx.HandleError as e:
        assert str(e)


def test_cluster_file_errors(tmp_path):
    with pytest.raises(phalanx.ConfigError, match="cannot read"):
        phalanx.load_cluster(tmp_path / "missing.toml")
    bad = tmp_path / "cluster.toml"
    bad.write_text('protocol = "raft"\n')
    with pytest.raises(phalanx.ConfigError, match="cluster.toml"):
        phalanx.load_cluster(bad)


def test_timeout_error_hierarchy():
    assert issubclass(phalanx.TimeoutError, TimeoutError)
    assert issubclass(phalanx.TimeoutError, phalanx.PhalanxError)
    assert issubclass(phalanx.BackpressureError, phalanx.HandleError)
    assert issubclass(phalanx.DivergenceError, phalanx.TraceError)
