// A kafkajs transactional producer for tests/test_kafka_txn.py: argv[2] is JSON {broker, topic, id,
// commit: [values], abort: [values]}; sends `commit` in a transaction it commits, then `abort` in
// one it aborts (kafkajs: InitProducerId, AddPartitionsToTxn, EndTxn at its versions). Prints "ok".
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const args = JSON.parse(process.argv[2]);
  const kafka = new Kafka({ clientId: "memq-test", brokers: [args.broker], logLevel: logLevel.ERROR });
  const producer = kafka.producer({ transactionalId: args.id, maxInFlightRequests: 1, idempotent: true });
  await producer.connect();
  for (const [values, end] of [[args.commit, "commit"], [args.abort, "abort"]]) {
    const txn = await producer.transaction();
    await txn.send({ topic: args.topic, messages: values.map((v) => ({ value: v })) });
    await txn[end]();
  }
  await producer.disconnect();
  console.log("ok");
}

main().catch((e) => { console.error(e); process.exit(1); });
