// Reads a memq topic through the Kafka listener with kafkajs, for tests/test_kafka_read_clients.py.
// argv[2]: JSON {broker, topic, mode: "earliest" | "latest" | "group", group?, count, zstd?}. A fresh
// group reads from the earliest offset (earliest) or from the latest, printing "ready" after its
// first fetch (latest); "group" commits what it read for the group's next member.
// Prints one JSON line: [valueHex, keyHex|null, [[name, valueHex], ...], timestampMs, partition] per record.
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require("kafkajs");

// kafkajs decodes gzip alone; zstd takes a codec (Kafka producers' zstd batches), unless
// args.zstd is false: kafkajs as it is installed, with no codec plug-in
function registerZstd() {
  const fzstd = require("fzstd");
  CompressionCodecs[CompressionTypes.ZSTD] = () => ({
    compress: async () => { throw new Error("reading only"); },
    decompress: async (buf) => Buffer.from(fzstd.decompress(buf)),
  });
}

async function main() {
  const args = JSON.parse(process.argv[2]);
  if (args.zstd !== false) registerZstd();
  const kafka = new Kafka({ clientId: "memq-test", brokers: [args.broker], logLevel: logLevel.ERROR });
  // the notification Kafka here (tansu) answers a JoinGroup after the rebalance timeout: keep it short
  const consumer = kafka.consumer({ groupId: args.group || `kafkajs-${Date.now()}-${Math.random()}`,
                                    maxWaitTimeInMs: 200, sessionTimeout: 6000, rebalanceTimeout: 3000 });
  const rows = [];
  const last = new Map();
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const timer = setTimeout(() => finish(new Error(`read ${rows.length} of ${args.count}`)), 60000);
  await consumer.connect();
  if (args.mode === "latest") {
    consumer.on(consumer.events.FETCH, () => { if (!args.announced) { args.announced = true; console.log("ready"); } });
  }
  await consumer.subscribe({ topic: args.topic, fromBeginning: args.mode !== "latest" });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      const headers = Object.entries(message.headers || {}).map(([k, v]) => [k, Buffer.from(v).toString("hex")]);
      rows.push([message.value.toString("hex"), message.key === null ? null : message.key.toString("hex"),
                 headers, Number(message.timestamp), partition]);
      last.set(partition, message.offset);
      if (rows.length >= args.count) finish(null);
    },
  });
  const err = await finished;
  clearTimeout(timer);
  if (!err && args.mode === "group") {
    await consumer.commitOffsets([...last].map(([partition, offset]) => (
      { topic: args.topic, partition, offset: (BigInt(offset) + 1n).toString() })));
  }
  await consumer.disconnect();
  if (err) throw err;
  console.log(JSON.stringify(rows));
}

main().catch((e) => { console.error(e); process.exit(1); });
