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
    assert info["id"] == 4 and info["role"] == "client" and info["protocol"] == "pbft"
    assert info["replicas"] == [0, 1, 2, 3] and info["clients"] == [4, 5]
    pubsub = phalanx.generate_cluster(7, 2, seed=b"\x01" * 32)
    assert len(pubsub) == 7 + 1 + 2
    # Deterministic from the seed.
    assert phalanx.generate_cluster(f=1, protocol="pbft", clients=2, seed=7) == pbft
    assert phalanx.generate_cluster(f=1, protocol="pbft", clients=2, seed=8) != pbft


def test_node_properties(pbft):
    node = phalanx.Node(pbft[0])
    assert node.id == 0 and node.role == "replica" and node.protocol == "pbft" and node.f == 1
    assert node.replica_ids == [0, 1, 2, 3]
    assert "Node(id=0" in repr(node)
    st = node.status()
    assert st["view"] == 0 and st["primary"] is True and st["executed"] == 0
    assert set(node.stats()) == {"stale", "beyond_window", "unsubscribed", "refused"}


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


def run_in_memory(nodes, apps, request, *, now=1_000, answer_queries=True):
    """Feeds `request` to the client (node 4) of four replica nodes wired in memory, with
    `KvStore` applications, and delivers every send, persistence, execution and (when
    `answer_queries`) answer to a read, firing the earliest timer when nothing else is
    left, until the request completed and nothing is in flight. Returns the `Completed`
    output, the time then, the ops executed and the `Query` outputs."""
    ci = 4
    queue = [(ci, request)]
    completed, executed, queries = [], [], []
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
                executed.extend(op.op for op in out.ops)
                snap = apps[i].snapshot() if out.snapshot else None
                queue.append((i, phalanx.Executed(out.seq, results, snap)))
            elif isinstance(out, phalanx.Query):
                assert out.client == ci and i != ci
                queries.append(out)
                if answer_queries:
                    queue.append((i, phalanx.Answered(out.client, out.request, apps[i].query(out.op))))
            elif isinstance(out, phalanx.Completed):
                completed.append(out)
    assert len(completed) == 1
    return completed[0], now, executed, queries


def in_memory_cluster(configs):
    return {i: phalanx.Node(configs[i]) for i in range(5)}, {i: phalanx.KvStore() for i in range(4)}


def test_a_full_round_in_memory(pbft):
    """Four replica nodes and a client wired in memory: the client's put completes."""
    nodes, apps = in_memory_cluster(pbft)
    completed, _, executed, queries = run_in_memory(nodes, apps, phalanx.Submit(phalanx.kv.put(b"k", b"v")))
    assert phalanx.kv.decode_value(completed.result) is None
    assert executed == [phalanx.kv.put(b"k", b"v")] * 4 and queries == []
    assert all(apps[i].get(b"k") == b"v" for i in range(4))


def test_a_read_in_memory_completes_without_ordering(pbft):
    """A read goes to every replica, each emits `Query`, and 2f+1 matching `Answered`
    complete it: nothing is ordered or executed."""
    nodes, apps = in_memory_cluster(pbft)
    _, now, _, _ = run_in_memory(nodes, apps, phalanx.Submit(phalanx.kv.put(b"k", b"v")))
    request = nodes[4].next_request()
    read = phalanx.Read(phalanx.kv.get(b"k"))
    completed, _, executed, queries = run_in_memory(nodes, apps, read, now=now + 1_000)
    assert completed.request == request and phalanx.kv.decode_value(completed.result) == b"v"
    assert executed == []
    assert queries == [phalanx.Query(4, request, phalanx.kv.get(b"k"))] * 4
    assert all(n.status()["executed"] == 1 for i, n in nodes.items() if i < 4)


def test_an_unanswered_read_in_memory_is_ordered(pbft):
    """Replicas whose host answers no `Query`: the client has the read ordered after
    `client_retry_ns`, under the same request number."""
    nodes, apps = in_memory_cluster(pbft)
    _, now, _, _ = run_in_memory(nodes, apps, phalanx.Submit(phalanx.kv.put(b"k", b"v")))
    request = nodes[4].next_request()
    start = now + 1_000
    read = phalanx.Read(phalanx.kv.get(b"k"))
    completed, end, executed, queries = run_in_memory(nodes, apps, read, now=start, answer_queries=False)
    assert completed.request == request and phalanx.kv.decode_value(completed.result) == b"v"
    assert len(queries) == 4 and executed == [phalanx.kv.get(b"k")] * 4
    assert end - start >= 250_000_000  # client_retry_ns by default


def test_read_kinds_round_trip_and_repr(pbft):
    read = phalanx.Read(bytearray(b"get"))
    assert read == phalanx.Read(b"get") and read != phalanx.Read(b"got") and read.op == b"get"
    assert isinstance(read, phalanx.Input) and repr(read) == "Read(op=b'get')"
    answered = phalanx.Answered(4, 7, b"v")
    assert (answered.client, answered.request, answered.result) == (4, 7, b"v")
    assert answered == phalanx.Answered(4, 7, b"v") and answered != phalanx.Answered(4, 8, b"v")
    assert isinstance(answered, phalanx.Input)
    assert repr(answered) == "Answered(client=4, request=7, result=b'v')"
    query = phalanx.Query(4, 7, b"x" * 30)
    assert (query.client, query.request, query.op) == (4, 7, b"x" * 30) and isinstance(query, phalanx.Output)
    assert repr(query) == "Query(client=4, request=7, op=b'" + "x" * 24 + "'…(30 bytes))"
    assert query != phalanx.Query(5, 7, b"x" * 30)

    # Through the core: the client's Read reaches a replica as a Query, whose Answered
    # goes back to the client as a Send.
    client, replica = phalanx.Node(pbft[4]), phalanx.Node(pbft[0])
    request = client.next_request()
    (persist,) = client.handle_many([(0, phalanx.Read(b"get"))])
    frames = [o for o in client.handle_many([(1, phalanx.Persisted(persist.token))]) if isinstance(o, phalanx.Send)]
    assert sorted(f.to for f in frames) == [0, 1, 2, 3]
    frame = next(f.data for f in frames if f.to == 0)
    outputs = replica.handle_many([(2, phalanx.Message(4, frame))])
    # A replica's first input also sends its catch-up asks to the other replicas.
    assert [o for o in outputs if not isinstance(o, phalanx.Send)] == [phalanx.Query(4, request, b"get")]
    assert sorted(o.to for o in outputs if isinstance(o, phalanx.Send)) == [1, 2, 3]
    replica.handle(3, phalanx.Answered(4, request, b"result"))
    (reply,) = replica.drain()
    assert isinstance(reply, phalanx.Send) and reply.to == 4
    client.handle(4, phalanx.Message(0, reply.data))
    assert client.drain() == []  # one answer of 2f+1

    # The wrong role, or an answer to a node that is not a client, is refused.
    with pytest.raises(phalanx.HandleError, match="cannot handle"):
        replica.handle(5, phalanx.Read(b"get"))
    with pytest.raises(phalanx.HandleError, match="cannot handle"):
        client.handle(5, phalanx.Answered(4, request, b"result"))
    with pytest.raises(phalanx.HandleError, match="not a client"):
        replica.handle(5, phalanx.Answered(1, request, b"result"))


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
