'use strict';
// Drives a running broker with mqtt.js (MQTT 3.1.1, protocolVersion 4) for tests/test_mqttjs.py.
//
//   node check.js HOST PORT SCENARIO [ARG]
//
// Runs one scenario and prints one JSON line: {"scenario", "base", "ok", "result", "error"?}.
// "result" holds what the clients saw (the Python test asserts on it); the exit code is 0 when the
// scenario ran to its end, 1 when it could not (refused connection, a wait that timed out, bad
// arguments): "error" then says why and "result" holds what was seen until then. Every wait is
// bounded by WAIT_MS and the whole run by DEADLINE_MS, so this never hangs.
//
// Scenarios:
//   roundtrip SUBQOS  a subscriber on wildcard filters at QoS SUBQOS; QoS 0, 1 and 2 publishes
//   retained          set, received with the retain flag by a new subscriber, live, cleared
//   will              a clean end() (no will), then a destroyed socket (will published)
//   session           clean: false; QoS 1 messages queued while offline, sessionPresent
//   unsubscribe       delivery before UNSUBACK, none after
const crypto = require('crypto');
const mqtt = require('mqtt');

const WAIT_MS = 10000;
const DEADLINE_MS = 40000;

const [host, portArg, scenario, arg] = process.argv.slice(2);
const token = `${process.pid.toString(36)}-${crypto.randomBytes(4).toString('hex')}`;
const base = `mqttjs/${token}`; // every topic and client id of this run is unique
const result = {};
const clients = new Set();
let finished = false;

function finish(ok, error) {
  if (finished) return;
  finished = true;
  for (const c of clients) c.end(true); // leave no socket open, whatever happened
  const report = { scenario, base, ok, result };
  if (error) report.error = error;
  process.stdout.write(`${JSON.stringify(report)}\n`, () => process.exit(ok ? 0 : 1));
}

setTimeout(() => finish(false, `scenario did not finish within ${DEADLINE_MS} ms`), DEADLINE_MS);

/** Rejects after WAIT_MS with a message naming `what`. */
function bounded(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${WAIT_MS} ms waiting for ${what}`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * Connects `name` (a unique client id is made from it) and resolves with the client once CONNACK 0
 * came; its received messages collect in `client.inbox` from the very first packet, and
 * `client.connack` / `client.packets` (names of the packets received) are kept.
 */
function connect(name, opts = {}) {
  const client = mqtt.connect({
    host, port: Number(portArg), protocol: 'mqtt', protocolVersion: 4,
    clientId: `${token}-${name}`, clean: true, reconnectPeriod: 0, connectTimeout: WAIT_MS,
    ...opts,
  });
  clients.add(client);
  client.inbox = [];
  client.packets = [];
  client.waiters = [];
  client.on('packetreceive', (packet) => client.packets.push(packet.cmd));
  client.on('message', (topic, payload, packet) => {
    client.inbox.push({ topic, payload: payload.toString('utf8'), qos: packet.qos, retain: packet.retain });
    for (const check of client.waiters.slice()) check();
  });
  const connected = new Promise((resolve, reject) => {
    client.once('connect', (connack) => { client.connack = connack; resolve(client); });
    client.once('error', (err) => reject(new Error(`${name}: ${err.message}`)));
    client.once('close', () => reject(new Error(`${name}: connection closed before CONNACK`)));
  });
  client.on('error', () => {}); // reported through `connected` or the wait that follows
  return bounded(connected, `CONNACK for ${name}`);
}

/** Resolves with client.inbox once `predicate(inbox)` holds (checked on every message). */
function until(client, predicate, what) {
  return bounded(new Promise((resolve) => {
    const check = () => {
      if (!predicate(client.inbox)) return;
      client.waiters = client.waiters.filter((w) => w !== check);
      resolve(client.inbox);
    };
    client.waiters.push(check);
    check();
  }), what);
}

const has = (topic, payload) => (inbox) => inbox.some((m) => m.topic === topic && m.payload === payload);

async function subscribe(client, filters) {
  const granted = await bounded(client.subscribeAsync(filters), `SUBACK for ${Object.keys(filters)}`);
  return granted.map((g) => g.qos);
}

const publish = (client, topic, payload, opts) =>
  bounded(client.publishAsync(topic, payload, opts), `the QoS ${opts.qos} flow of ${topic}`);

async function end(client) {
  await bounded(client.endAsync(), 'a clean end()');
  clients.delete(client);
}

const scenarios = {
  async roundtrip() {
    const subQos = Number(arg);
    if (![0, 1, 2].includes(subQos)) throw new Error(`roundtrip needs SUBQOS 0, 1 or 2, not ${arg}`);
    const sub = await connect('sub');
    // two overlapping wildcard filters at the same QoS: each message must still come once
    result.granted = await subscribe(sub, { [`${base}/+/x`]: { qos: subQos }, [`${base}/#`]: { qos: subQos } });
    const pub = await connect('pub');
    for (const qos of [0, 1, 2]) await publish(pub, `${base}/q${qos}/x`, `hello at ${qos}`, { qos });
    // a last message: one extra copy of any of the three shows as a fourth message before all came
    // (QoS levels and topics may be delivered out of order, so no wait assumes an order)
    await publish(pub, `${base}/marker/x`, 'marker', { qos: 0 });
    await until(sub, (inbox) => inbox.length >= 4 && has(`${base}/marker/x`, 'marker')(inbox), 'the three messages and the marker');
    result.received = sub.inbox.filter((m) => m.payload !== 'marker');
    result.publisher_packets = pub.packets;
    result.subscriber_packets = sub.packets;
    await end(pub);
    await end(sub);
  },

  async retained() {
    const topic = `${base}/ret/a`;
    const filter = `${base}/ret/+`;
    const pub = await connect('pub');
    await publish(pub, topic, 'first', { qos: 1, retain: true });
    await publish(pub, topic, 'kept', { qos: 1, retain: true }); // replaces 'first'
    const early = await connect('early');
    result.granted = await subscribe(early, { [filter]: { qos: 1 } });
    await until(early, (inbox) => inbox.length >= 1, 'the retained message');
    await publish(pub, topic, 'live', { qos: 1, retain: true }); // to a subscriber already there
    await until(early, has(topic, 'live'), 'the live retained publish');
    await publish(pub, topic, '', { qos: 1, retain: true }); // clears it
    await until(early, has(topic, ''), 'the clearing publish');
    result.early = early.inbox.slice(); // before the marker below reaches it too
    const late = await connect('late');
    await subscribe(late, { [filter]: { qos: 1 } });
    await publish(pub, `${base}/ret/marker`, 'marker', { qos: 1 });
    await until(late, has(`${base}/ret/marker`, 'marker'), 'the marker after the clear');
    result.late = late.inbox;
    await end(late);
    await end(early);
    await end(pub);
  },

  async will() {
    const watcher = await connect('watcher');
    await subscribe(watcher, { [`${base}/will/#`]: { qos: 1 } });
    // a clean end(): DISCONNECT, so its will is discarded
    const clean = await connect('clean', { will: { topic: `${base}/will/clean`, payload: 'clean exit', qos: 1, retain: false } });
    await publish(clean, `${base}/will/marker`, 'marker', { qos: 1 });
    await end(clean);
    // a socket destroyed without DISCONNECT: its will is published
    const doomed = await connect('doomed', { will: { topic: `${base}/will/doomed`, payload: 'died', qos: 1, retain: false } });
    const closed = new Promise((resolve) => doomed.once('close', resolve));
    doomed.stream.destroy();
    await bounded(closed, 'the destroyed socket to close');
    const started = Date.now();
    await until(watcher, (inbox) => has(`${base}/will/doomed`, 'died')(inbox) && has(`${base}/will/marker`, 'marker')(inbox),
      'the will of the destroyed socket and the marker');
    result.will_after_ms = Date.now() - started;
    result.received = watcher.inbox;
    await end(watcher);
  },

  async session() {
    const filter = `${base}/session/+`;
    const topic = `${base}/session/x`;
    const first = await connect('session', { clean: false });
    result.first_session_present = first.connack.sessionPresent;
    result.granted = await subscribe(first, { [filter]: { qos: 1 } });
    await end(first);
    const pub = await connect('pub');
    for (let n = 0; n < 5; n++) await publish(pub, topic, `offline ${n}`, { qos: 1 });
    const again = await connect('session', { clean: false });
    result.session_present = again.connack.sessionPresent;
    await until(again, (inbox) => inbox.length >= 5, 'the five queued messages');
    await publish(pub, topic, 'online', { qos: 1 });
    await until(again, has(topic, 'online'), 'the message published after the reconnect');
    result.received = again.inbox;
    await end(again);
    await end(pub);
    // leave no session behind: clean: true discards it
    const discard = await connect('session', { clean: true });
    result.discard_session_present = discard.connack.sessionPresent;
    await end(discard);
  },

  async unsubscribe() {
    const client = await connect('client');
    result.granted = await subscribe(client, { [`${base}/unsub/#`]: { qos: 1 }, [`${base}/marker`]: { qos: 1 } });
    await publish(client, `${base}/unsub/a`, 'before', { qos: 1 });
    await until(client, has(`${base}/unsub/a`, 'before'), 'the message before UNSUBSCRIBE');
    await bounded(client.unsubscribeAsync(`${base}/unsub/#`), 'UNSUBACK');
    result.unsuback = client.packets.includes('unsuback');
    await publish(client, `${base}/unsub/a`, 'after', { qos: 1 });
    await publish(client, `${base}/marker`, 'marker', { qos: 1 });
    await until(client, has(`${base}/marker`, 'marker'), 'the marker after UNSUBACK');
    result.received = client.inbox;
    await end(client);
  },
};

if (!host || !Number(portArg) || !Object.hasOwn(scenarios, scenario || '')) {
  finish(false, `usage: node check.js HOST PORT {${Object.keys(scenarios).join(',')}} [ARG]`);
} else {
  scenarios[scenario]().then(() => finish(true), (err) => finish(false, err && err.message ? err.message : String(err)));
}
