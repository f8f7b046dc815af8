// kafkajs' admin client on a memq cluster's Kafka listener, for tests/test_kafka_admin_topics.py.
// argv[2]: JSON {broker, topic, partitions, configs: {name: value}}. Creates the topic with those
// configs, then describes its configs and prints one JSON line:
// {created, partitions, configs: {name: {value, readOnly, source}}, refused: error message of a bad config}.
const { Kafka, ConfigResourceTypes, logLevel } = require("kafkajs");

async function main() {
  const args = JSON.parse(process.argv[2]);
  const kafka = new Kafka({ clientId: "memq-test-admin", brokers: [args.broker], logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  try {
    const created = await admin.createTopics({
      topics: [{ topic: args.topic, numPartitions: args.partitions,
                 configEntries: Object.entries(args.configs).map(([name, value]) => ({ name, value })) }],
      waitForLeaders: true, timeout: 30000,
    });
    const meta = await admin.fetchTopicMetadata({ topics: [args.topic] });
    const described = await admin.describeConfigs({
      resources: [{ type: ConfigResourceTypes.TOPIC, name: args.topic }], includeSynonyms: false });
    const configs = {};
    for (const e of described.resources[0].configEntries) {
      configs[e.configName] = { value: e.configValue, readOnly: e.readOnly, source: e.configSource };
    }
    let refused = null;
    try {
      await admin.alterConfigs({ validateOnly: false, resources: [{ type: ConfigResourceTypes.TOPIC, name: args.topic,
                                                                  configEntries: [{ name: "segment.byte", value: "1" }] }] });
    } catch (e) {
      refused = `${e.type || e.name}: ${e.message}`;
    }
    console.log(JSON.stringify({ created, partitions: meta.topics[0].partitions.length, configs, refused }));
  } finally {
    await admin.disconnect();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
