// kafkajs 2.2.4 against a tidelog cluster's Kafka ports, as a node.js user runs it: admin
// (create a topic, alterConfigs, describeConfigs, listGroups, fetchOffsets), an idempotent
// producer (gzip and uncompressed batches, keys and headers), and a consumer group that reads
// everything from the beginning and commits. Prints one JSON line for the Python test to check.
// Usage: node kafkajs_client.js BOOTSTRAP TOPIC GROUP
"use strict";
const { Kafka, CompressionTypes, ConfigResourceTypes, logLevel } = require("kafkajs");

const [bootstrap, topic, group] = process.argv.slice(2);
const COUNT = 60;

async function main() {
  const kafka = new Kafka({
    clientId: "kafkajs-check",
    brokers: bootstrap.split(","),
    logLevel: logLevel.ERROR,
    retry: { retries: 10 },
  });
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({
    topics: [{ topic, numPartitions: 3, replicationFactor: 3 }],
    waitForLeaders: true,
  });
  await admin.alterConfigs({
    validateOnly: false,
    resources: [
      {
        type: ConfigResourceTypes.TOPIC,
        name: topic,
        configEntries: [{ name: "retention.ms", value: "3600000" }],
      },
    ],
  });
  const described = await admin.describeConfigs({
    includeSynonyms: false,
    resources: [{ type: ConfigResourceTypes.TOPIC, name: topic, configNames: ["retention.ms"] }],
  });
  const retention = described.resources[0].configEntries.find((e) => e.configName === "retention.ms");

  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const messages = [];
  for (let i = 0; i < COUNT; i++) {
    messages.push({ key: `k${i}`, value: `v${i}`, headers: { h: `x${i}` } });
  }
  await producer.send({ topic, acks: -1, compression: CompressionTypes.GZIP, messages: messages.slice(0, COUNT / 2) });
  await producer.send({ topic, acks: -1, compression: CompressionTypes.None, messages: messages.slice(COUNT / 2) });
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 1000 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${got.length} of ${COUNT} consumed`)), 90000);
    consumer
      .run({
        autoCommit: true,
        autoCommitInterval: 100,
        eachMessage: async ({ partition, message }) => {
          got.push({
            partition,
            offset: Number(message.offset),
            key: message.key.toString(),
            value: message.value.toString(),
            header: message.headers.h.toString(),
          });
          if (got.length >= COUNT) {
            clearTimeout(timer);
            resolve();
          }
        },
      })
      .catch(reject);
  });
  await consumer.disconnect(); // commits what was consumed, then leaves the group
  const groups = await admin.listGroups();
  const offsets = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  await admin.disconnect();
  console.log(
    JSON.stringify({
      retention: retention ? retention.configValue : null,
      got,
      groups: groups.groups.map((g) => g.groupId),
      offsets: offsets[0].partitions.map((p) => ({ partition: p.partition, offset: Number(p.offset) })),
    })
  );
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
