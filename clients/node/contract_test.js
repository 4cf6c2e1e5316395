// The contract test of the Node.js client: run by tests/integration/test_node_client.py
// against a real local cluster, or by hand:
//
//   node contract_test.js 127.0.0.1:9092 [topic] [records]
//
// Creates a topic, produces keyed records with headers through ProduceRecords, consumes
// them back through ConsumeRecords, and checks bytes, headers and order per partition.
// Prints one JSON line: {"ok": true, "records": N, "key_partitions": {key: partition}, ...};
// the Python side checks that each key's partition is the one our Python Producer picks.
// Exits 1 with a JSON line {"ok": false, "error": ...} on the first mismatch.

'use strict';

const crypto = require('crypto');
const { HighwaterClient } = require('./highwater');

const address = process.argv[2] || '127.0.0.1:9092';
const topic = process.argv[3] || `node-contract-${Date.now()}`;
const total = Number(process.argv[4] || 10000);
const PARTITIONS = 6;
const KEYS = 700;
const RECORDS_PER_REQUEST = 1000;

function fail(message) {
  console.log(JSON.stringify({ ok: false, error: message }));
  process.exit(1);
}

function check(condition, message) {
  if (!condition) fail(message);
}

async function main() {
  const client = new HighwaterClient(address);
  try {
    const before = await client.describe();
    check(before.clusterId.length > 0, 'Metadata answered no cluster_id');
    await client.createTopic(topic, { partitions: PARTITIONS, replicationFactor: 3 });
    const after = await client.describe([topic]);
    check(after.topics.length === 1 && after.topics[0].partitions === PARTITIONS,
      `topic ${topic} is not listed with ${PARTITIONS} partitions: ${JSON.stringify(after.topics)}`);

    // Records with random bytes, so any byte the codec could mangle (0x00, 0xff, ...) shows up.
    const sent = [];
    for (let i = 0; i < total; i++) {
      sent.push({
        key: Buffer.from(`key-${i % KEYS}`),
        value: crypto.randomBytes(i % 200),
        headers: [
          { key: 'seq', value: Buffer.from(String(i)) },
          { key: 'bin', value: crypto.randomBytes(i % 7) },
        ],
        timestampMs: 1700000000000 + i,
      });
    }
    const produced = [];
    for (let first = 0; first < total; first += RECORDS_PER_REQUEST) {
      const chunk = sent.slice(first, first + RECORDS_PER_REQUEST);
      const requestId = `${topic}-${first}`;
      const results = await client.produce(topic, chunk, { requestId });
      // The same request id again: the gateway answers the first result and writes nothing.
      if (first === 0) {
        const again = await client.produce(topic, chunk, { requestId });
        check(JSON.stringify(again) === JSON.stringify(results), 'a retried request id got another answer');
      }
      produced.push(...results);
    }

    const keyPartitions = {};
    const byPlace = new Map();
    produced.forEach((r, i) => {
      const key = sent[i].key.toString();
      check(keyPartitions[key] === undefined || keyPartitions[key] === r.partition,
        `key ${key} went to partitions ${keyPartitions[key]} and ${r.partition}`);
      keyPartitions[key] = r.partition;
      byPlace.set(`${r.partition}/${r.offset}`, i);
    });
    check(byPlace.size === total, `${total - byPlace.size} records were written twice at one offset`);

    const lastIndex = new Map();
    const lastOffset = new Map();
    let received = 0;
    for await (const r of client.consume(topic, { from: -2, maxRecords: total })) {
      const i = byPlace.get(`${r.partition}/${r.offset}`);
      check(i !== undefined, `consumed ${r.partition}/${r.offset}, which was never produced`);
      const s = sent[i];
      check(r.key !== null && r.key.equals(s.key), `record ${i}: key differs`);
      check(r.value !== null && r.value.equals(s.value), `record ${i}: value bytes differ`);
      check(r.timestampMs === s.timestampMs, `record ${i}: timestamp ${r.timestampMs} != ${s.timestampMs}`);
      check(r.headers.length === 2 && r.headers.every((h, k) => h.key === s.headers[k].key
        && h.value.equals(s.headers[k].value)), `record ${i}: headers differ`);
      check((lastOffset.get(r.partition) ?? -1) < r.offset, `partition ${r.partition}: offsets out of order`);
      check((lastIndex.get(r.partition) ?? -1) < i,
        `partition ${r.partition}: record ${i} came after record ${lastIndex.get(r.partition)}`);
      lastOffset.set(r.partition, r.offset);
      lastIndex.set(r.partition, i);
      received += 1;
    }
    check(received === total, `consumed ${received} of ${total} records`);

    // stopAtEnd: the stream ends by itself at the high watermarks as of the call.
    let toEnd = 0;
    for await (const r of client.consume(topic, { from: -2, stopAtEnd: true })) {
      check(byPlace.has(`${r.partition}/${r.offset}`), `stopAtEnd: ${r.partition}/${r.offset} never produced`);
      toEnd += 1;
    }
    check(toEnd === total, `stopAtEnd: consumed ${toEnd} of ${total} records`);

    // Topic management: a scratch topic made and removed again.
    const scratch = `${topic}-scratch`;
    await client.createTopic(scratch, { partitions: 1, replicationFactor: 1 });
    await client.deleteTopic(scratch);

    console.log(JSON.stringify({
      ok: true, records: received, topic, cluster_id: before.clusterId, key_partitions: keyPartitions,
    }));
  } finally {
    client.close();
  }
}

main().catch((err) => fail(err && err.stack ? err.stack : String(err)));
