// @platformatic/kafka against a tidelog cluster's Kafka ports, as a node.js user runs it: admin
// (createTopics, alterConfigs, describeConfigs, listGroups, listConsumerGroupOffsets), a
// producer (keys and headers), and a consumer group reading everything from the earliest
// offset and committing. Prints one JSON line for the Python test to check.
// Usage: node platformatic_client.mjs BOOTSTRAP TOPIC GROUP
//
// @platformatic/kafka asks for node >= 22 for one thing, Promise.withResolvers; the machines
// here run node 20, so it is supplied before the library is used (modules load first).
import { Admin, Consumer, Producer, stringDeserializers, stringSerializers } from "@platformatic/kafka";

if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new Promise((a, b) => {
      resolve = a;
      reject = b;
    });
    return { promise, resolve, reject };
  };
}

const [bootstrap, topic, group] = process.argv.slice(2);
const brokers = bootstrap.split(",");
const COUNT = 30;
const TOPIC_RESOURCE = 2;

const admin = new Admin({ clientId: "platformatic-admin", bootstrapBrokers: brokers });
await admin.createTopics({ topics: [topic], partitions: 3, replicas: 3 });
await admin.alterConfigs({
  resources: [
    { resourceType: TOPIC_RESOURCE, resourceName: topic, configs: [{ name: "retention.ms", value: "3600000" }] },
  ],
});
const described = await admin.describeConfigs({
  resources: [{ resourceType: TOPIC_RESOURCE, resourceName: topic, configurationKeys: ["retention.ms"] }],
});
const retention = described[0].configs.find((c) => c.name === "retention.ms");

const producer = new Producer({ clientId: "platformatic-producer", bootstrapBrokers: brokers, serializers: stringSerializers });
const messages = [];
for (let i = 0; i < COUNT; i++) {
  messages.push({ topic, key: `k${i}`, value: `v${i}`, headers: { h: `x${i}` } });
}
await producer.send({ messages });
await producer.close();

const consumer = new Consumer({
  groupId: group,
  clientId: "platformatic-consumer",
  bootstrapBrokers: brokers,
  deserializers: stringDeserializers,
});
const stream = await consumer.consume({
  autocommit: 100,
  topics: [topic],
  mode: "earliest",
  sessionTimeout: 10000,
  heartbeatInterval: 500,
});
const got = [];
await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`only ${got.length} of ${COUNT} consumed`)), 60000);
  stream.on("data", (m) => {
    got.push({ partition: m.partition, offset: Number(m.offset), key: m.key, value: m.value, header: m.headers.get("h") });
    if (got.length >= COUNT) {
      clearTimeout(timer);
      resolve();
    }
  });
  stream.on("error", reject);
});
await new Promise((r) => setTimeout(r, 500)); // an autocommit interval
await stream.close();
await consumer.close();
const groups = await admin.listGroups();
const offsets = await admin.listConsumerGroupOffsets({ groups: [group] });
await admin.close();
console.log(
  JSON.stringify(
    {
      retention: retention ? retention.value : null,
      got,
      groups: [...groups.keys()],
      offsets,
    },
    (_, v) => (typeof v === "bigint" ? Number(v) : v instanceof Map ? Object.fromEntries(v) : v)
  )
);
