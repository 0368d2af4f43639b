'use strict';
// Drives the npm package ali-ons (a pure JavaScript RocketMQ 4.x remoting client) for the
// tests in tests/test_remoting_ali_ons.py. One JSON line per event on stdout.
//   node ali_ons_client.js produce NAMESRV TOPIC COUNT [TAG] [PREFIX] [PAD]
//   node ali_ons_client.js consume NAMESRV TOPIC GROUP EXPRESSION COUNT [RETRY_FIRST]
// `consume` prints each message and exits once COUNT messages were consumed (and the offsets
// persisted); with RETRY_FIRST it answers ACTION_RETRY to each message's first delivery.
const path = require('path');
const ons = require(path.join(process.env.ALI_ONS_DIR || __dirname, 'node_modules', 'ali-ons'));

const [mode, nameSrv, topic, ...rest] = process.argv.slice(2);
const common = {
  httpclient: {},  // required by ali-ons, unused with nameSrv
  nameSrv,
  accessKeyId: 'unused',
  accessKeySecret: 'unused',
  persistConsumerOffsetInterval: 500,
  rebalanceInterval: 1000,
  logger: { info() {}, warn() {}, error(e) { process.stderr.write(String(e && e.stack || e) + '\n'); }, debug() {} },
};
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n');

async function produce() {
  const [count, tag, prefix, pad] = rest;  // PAD: bytes of '.' after the body (ali-ons
  // compresses bodies of 4 KiB and more)
  const producer = new ons.Producer({ ...common, producerGroup: 'GID_ali_ons_producer' });
  await producer.ready();
  for (let i = 0; i < Number(count); i++) {
    const msg = new ons.Message(topic, tag || 'TagA', Buffer.from(`${prefix || 'ali'}-${i}` + '.'.repeat(Number(pad || 0))));
    msg.keys = [ `key-${i}` ];
    msg.properties.color = i % 2 ? 'red' : 'blue';
    const result = await producer.send(msg);
    out({ sent: i, status: result.sendStatus, msgId: result.msgId,
          queueId: result.messageQueue.queueId, queueOffset: result.queueOffset });
  }
  await producer.close();
}

async function consume() {
  const [group, expression, count, retryFirst] = rest;
  const consumer = new ons.Consumer({ ...common, consumerGroup: group, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET' });
  const want = Number(count);
  let done = 0;
  const seen = new Set();
  await new Promise((resolve, reject) => {
    consumer.on('error', err => process.stderr.write(`consumer error: ${err.stack || err}\n`));
    consumer.subscribe(topic, expression, async msg => {
      const body = msg.body.toString();
      if (retryFirst && msg.reconsumeTimes === 0) {
        out({ retry: body, topic: msg.topic });
        return ons.Consumer.ACTION_RETRY;
      }
      out({ body, tags: msg.tags, keys: msg.keys, props: msg.properties, topic: msg.topic,
            queueId: msg.queueId, queueOffset: msg.queueOffset, reconsumeTimes: msg.reconsumeTimes,
            bornTimestamp: msg.bornTimestamp });
      if (!seen.has(body)) { seen.add(body); done++; }
      if (done >= want) setTimeout(resolve, 1500);  // let the offsets persist
    });
    consumer.ready().catch(reject);
  });
  await consumer.close();
  out({ done });
}

(mode === 'produce' ? produce() : consume()).then(() => process.exit(0), err => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
