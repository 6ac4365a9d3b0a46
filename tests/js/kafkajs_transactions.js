// kafkajs 2.2.4's transactional producer against a tidelog cluster's Kafka ports: one
// transaction over three partitions committed, one aborted. The Python test
// (tests/test_kafka_transactions.py) reads the markers back from the log.
// Usage: node kafkajs_transactions.js BOOTSTRAP TOPIC
"use strict";
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic] = process.argv.slice(2);

async function main() {
  const kafka = new Kafka({
    clientId: "kafkajs-txn",
    brokers: bootstrap.split(","),
    logLevel: logLevel.ERROR,
    retry: { retries: 10 },
  });
  const producer = kafka.producer({
    transactionalId: "kafkajs-txn",
    maxInFlightRequests: 1,
    idempotent: true,
  });
  await producer.connect();
  const send = async (value) => {
    const transaction = await producer.transaction();
    await transaction.send({
      topic,
      messages: [0, 1, 2].map((partition) => ({ partition, value: `${value}-${partition}` })),
    });
    return transaction;
  };
  await (await send("committed")).commit();
  await (await send("aborted")).abort();
  await producer.disconnect();
  console.log(JSON.stringify({ ok: true }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
