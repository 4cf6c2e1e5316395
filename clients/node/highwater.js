// A small Node.js client of Highwater's gateway, built only from the protos (docs/GRPC.md).
//
// It loads protos/highwater/v1/gateway.proto at run time with @grpc/proto-loader (include
// path: the repository's protos/ folder) and uses the record-level calls, so no record
// encoding happens here: the gateway partitions, batches, encodes and writes idempotently.
// It is an example and a contract test (contract_test.js), not a client library: no
// retries beyond the request id, no connection pooling, no consumer group membership.

'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
// Every call gets a deadline: a gateway that does not answer fails the call, never hangs it.
const CALL_TIMEOUT_MS = 30000;

// keepCase: field names as in the .proto (snake_case); longs: Number is safe for offsets
// and timestamps (below 2**53); oneofs: a set `optional` field shows as `_key: 'key'`.
const LOADER_OPTIONS = {
  includeDirs: [PROTO_ROOT],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
};

function loadGatewayService() {
  const definition = protoLoader.loadSync('highwater/v1/gateway.proto', LOADER_OPTIONS);
  return grpc.loadPackageDefinition(definition).highwater.v1.GatewayService;
}

function deadline(timeoutMs = CALL_TIMEOUT_MS) {
  return new Date(Date.now() + timeoutMs);
}

class HighwaterError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
  }
}

class HighwaterClient {
  constructor(address, { credentials = grpc.credentials.createInsecure() } = {}) {
    const GatewayService = loadGatewayService();
    this.stub = new GatewayService(address, credentials);
  }

  close() {
    this.stub.close();
  }

  _unary(method, request, timeoutMs) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, { deadline: deadline(timeoutMs) }, (err, response) =>
        err ? reject(err) : resolve(response));
    });
  }

  // ---- topics ---------------------------------------------------------------------------

  async createTopic(name, { partitions = -1, replicationFactor = -1, configs = {} } = {}) {
    const resp = await this._unary('CreateTopics', {
      topics: [{ name, num_partitions: partitions, replication_factor: replicationFactor, configs }],
    });
    if (resp.error_code !== 'NONE') throw new HighwaterError(resp.error_code, resp.error_message);
    const topic = resp.topics[0];
    if (topic.error_code !== 'NONE') throw new HighwaterError(topic.error_code, topic.error_message);
    return topic;
  }

  async deleteTopic(name) {
    const resp = await this._unary('DeleteTopics', { names: [name] });
    if (resp.error_code !== 'NONE') throw new HighwaterError(resp.error_code, resp.error_message);
    const topic = resp.topics[0];
    if (topic.error_code !== 'NONE') throw new HighwaterError(topic.error_code, topic.error_message);
  }

  // Topic names and partition counts, and the cluster id.
  async describe(topics = []) {
    const resp = await this._unary('Metadata', { topics });
    return {
      clusterId: resp.cluster_id,
      topics: resp.topics
        .filter((t) => t.error_code === 'NONE')
        .map((t) => ({ name: t.name, partitions: t.partitions.length })),
    };
  }

  // ---- records --------------------------------------------------------------------------

  // records: [{ key?: Buffer, value?: Buffer, headers?: [{ key: string, value: Buffer }],
  //             timestampMs?: number, partition?: number }]
  // Leave key out for a keyless record (sticky partition), value out for a null value.
  // Returns one { partition, offset, timestampMs } per record; throws on the first failed record.
  async produce(topic, records, { requestId = '', timeoutMs = 30000, compression = '' } = {}) {
    const wire = records.map((r) => {
      const out = { headers: r.headers || [] };
      if (r.key !== undefined && r.key !== null) out.key = r.key;
      if (r.value !== undefined && r.value !== null) out.value = r.value;
      if (r.timestampMs !== undefined) out.timestamp_ms = r.timestampMs;
      if (r.partition !== undefined) out.partition = r.partition;
      return out;
    });
    const resp = await this._unary('ProduceRecords', {
      topic, records: wire, request_id: requestId, timeout_ms: timeoutMs, compression,
    }, timeoutMs + 5000);
    return resp.results.map((r, i) => {
      if (r.error_code !== 'NONE') {
        throw new HighwaterError(r.error_code, `record ${i}: ${r.error_message}`);
      }
      return { partition: r.partition, offset: r.offset, timestampMs: r.timestamp_ms };
    });
  }

  // Yields { topic, partition, offset, timestampMs, key, value, headers } in offset order per
  // partition; key and value are null when the record has none. from: -2 earliest, -1 latest,
  // or an offset; partitions: [{ partition, start_offset }] to pick partitions. stopAtEnd: end
  // once every partition reached its high watermark as of the call (else follow until cancelled).
  async *consume(topic, { from = -2, partitions = [], groupId = '', maxRecords = 0,
    stopAtEnd = false, timeoutMs = CALL_TIMEOUT_MS } = {}) {
    const call = this.stub.ConsumeRecords({
      topic, partitions, default_start_offset: from, group_id: groupId, max_records: maxRecords,
      stop_at_end: stopAtEnd,
    }, { deadline: deadline(timeoutMs) });
    try {
      for await (const message of call) {
        for (const e of message.errors) {
          throw new HighwaterError(e.error_code, `partition ${e.partition}: ${e.error_message}`);
        }
        for (const r of message.records) {
          yield {
            topic: r.topic,
            partition: r.partition,
            offset: r.offset,
            timestampMs: r.timestamp_ms,
            key: r._key === 'key' ? r.key : null,
            value: r._value === 'value' ? r.value : null,
            headers: r.headers.map((h) => ({ key: h.key, value: h.value })),
          };
        }
      }
    } finally {
      call.cancel();
    }
  }
}

module.exports = { HighwaterClient, HighwaterError, loadGatewayService, PROTO_ROOT };
