// The package as an ES module: named and default imports give the CommonJS objects.
import test from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import phalanx, { Node, Trace, Client, DistillClient, Replica, generateCluster, HandleError, kv } from 'phalanx';

test('import and require give the same package', () => {
  const required = createRequire(import.meta.url)('phalanx');
  assert.equal(phalanx, required);
  assert.equal(Node, required.Node);
  assert.equal(Trace, required.Trace);
  assert.equal(Client, required.Client);
  assert.equal(DistillClient, required.DistillClient);
  assert.equal(Replica, required.Replica);
  assert.equal(HandleError, required.HandleError);
  assert.equal(kv, required.kv);
  const node = new Node(generateCluster({ protocol: 'pbft', clients: 1 })[4]);
  assert.equal(node.role, 'client');
});
