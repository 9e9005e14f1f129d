'use strict';
// Drives a running broker with mqtt.js (MQTT 3.1.1 or 5.0: protocolVersion 4 or 5) for tests/test_mqttjs.py.
//
//   node check.js HOST PORT VERSION SCENARIO [ARG]
//
// VERSION (4 or 5) is the protocolVersion of every client the scenario connects (but the 3.1.1 one of
// "mixed"). Runs one scenario and prints one JSON line: {"scenario", "version", "base", "ok", "result",
// "error"?}. "result" holds what the clients saw (the Python test asserts on it); the exit code is 0
// when the scenario ran to its end, 1 when it could not (refused connection, a wait that timed out,
// bad arguments): "error" then says why and "result" holds what was seen until then. Every wait is
// bounded by WAIT_MS and the whole run by DEADLINE_MS, so this never hangs.
//
// Scenarios, at either version:
//   roundtrip SUBQOS  a subscriber on wildcard filters at QoS SUBQOS; QoS 0, 1 and 2 publishes
//   retained          set, received with the retain flag by a new subscriber, live, cleared
//   will              a clean end() (no will), then a destroyed socket (will published); at 5.0 also
//                     a DISCONNECT with reason code 0x04 (will published)
//   session           clean: false; QoS 1 messages queued while offline, sessionPresent (at 5.0 with
//                     a session expiry interval, and the session ended by expiry 0 at DISCONNECT)
//   unsubscribe       delivery before UNSUBACK, none after (at 5.0 the UNSUBACK's reason codes)
// and at 5.0 only:
//   connack           the properties of the CONNACK
//   assigned          an empty client id: the broker assigns one, and the client works
//   alias             topic aliases set and used by the publisher
//   mixed             a 3.1.1 client and a 5.0 one exchange messages both ways
const crypto = require('crypto');
const mqtt = require('mqtt');

const WAIT_MS = 10000;
const DEADLINE_MS = 40000;

const [host, portArg, versionArg, scenario, arg] = process.argv.slice(2);
const version = Number(versionArg);
const token = `${process.pid.toString(36)}-${crypto.randomBytes(4).toString('hex')}`;
const base = `mqttjs/${token}`; // every topic and client id of this run is unique
const result = {};
const clients = new Set();
let finished = false;

function finish(ok, error) {
  if (finished) return;
  finished = true;
  for (const c of clients) c.end(true); // leave no socket open, whatever happened
  const report = { scenario, version, base, ok, result };
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
 * Connects `name` (a unique client id is made from it) at `version` (opts may say another) and
 * resolves with the client once CONNACK 0 came; its received messages collect in `client.inbox` from
 * the very first packet (with their 5.0 properties, if any), and `client.connack` / `client.packets`
 * (names of the packets received) are kept.
 */
function connect(name, opts = {}) {
  const client = mqtt.connect({
    host, port: Number(portArg), protocol: 'mqtt', protocolVersion: version,
    clientId: `${token}-${name}`, clean: true, reconnectPeriod: 0, connectTimeout: WAIT_MS,
    ...opts,
  });
  clients.add(client);
  client.inbox = [];
  client.packets = [];
  client.waiters = [];
  client.on('packetreceive', (packet) => client.packets.push(packet.cmd));
  client.on('message', (topic, payload, packet) => {
    const message = { topic, payload: payload.toString('utf8'), qos: packet.qos, retain: packet.retain };
    if (packet.properties && Object.keys(packet.properties).length) message.properties = packet.properties;
    client.inbox.push(message);
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

/** A clean end(): DISCONNECT, at 5.0 with `opts` (reasonCode, properties) when given. */
async function end(client, opts) {
  await bounded(client.endAsync(false, opts), 'a clean end()');
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
    const wills = [has(`${base}/will/doomed`, 'died'), has(`${base}/will/marker`, 'marker')];
    if (version === 5) {
      // a DISCONNECT with reason code 0x04 (disconnect with will message): its will is published
      const farewell = await connect('farewell', { will: { topic: `${base}/will/farewell`, payload: 'asked for', qos: 1, retain: false } });
      await end(farewell, { reasonCode: 0x04 });
      wills.push(has(`${base}/will/farewell`, 'asked for'));
    }
    await until(watcher, (inbox) => wills.every((will) => will(inbox)), 'the wills and the marker');
    result.will_after_ms = Date.now() - started;
    result.received = watcher.inbox;
    await end(watcher);
  },

  async session() {
    const filter = `${base}/session/+`;
    const topic = `${base}/session/x`;
    // at 5.0 clean: false is Clean Start 0; the session outlives the connection only with an expiry
    const persistent = version === 5 ? { clean: false, properties: { sessionExpiryInterval: 3600 } } : { clean: false };
    const first = await connect('session', persistent);
    result.first_session_present = first.connack.sessionPresent;
    result.granted = await subscribe(first, { [filter]: { qos: 1 } });
    await end(first);
    const pub = await connect('pub');
    for (let n = 0; n < 5; n++) await publish(pub, topic, `offline ${n}`, { qos: 1 });
    const again = await connect('session', persistent);
    result.session_present = again.connack.sessionPresent;
    await until(again, (inbox) => inbox.length >= 5, 'the five queued messages');
    await publish(pub, topic, 'online', { qos: 1 });
    await until(again, has(topic, 'online'), 'the message published after the reconnect');
    result.received = again.inbox;
    if (version === 5) {
      // session expiry 0 at DISCONNECT ends the session with the connection
      await end(again, { properties: { sessionExpiryInterval: 0 } });
      const ended = await connect('session', persistent);
      result.ended_session_present = ended.connack.sessionPresent;
      await end(ended);
    } else {
      await end(again);
    }
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
    // the second filter was never subscribed to
    const unsuback = await bounded(client.unsubscribeAsync([`${base}/unsub/#`, `${base}/never`]), 'UNSUBACK');
    result.unsuback = client.packets.includes('unsuback');
    if (version === 5) result.unsuback_codes = unsuback.granted; // one reason code per filter
    await publish(client, `${base}/unsub/a`, 'after', { qos: 1 });
    await publish(client, `${base}/marker`, 'marker', { qos: 1 });
    await until(client, has(`${base}/marker`, 'marker'), 'the marker after UNSUBACK');
    result.received = client.inbox;
    await end(client);
  },

  // -- 5.0 only ----------------------------------------------------------------------------------

  async connack() {
    const client = await connect('client');
    result.reason_code = client.connack.reasonCode;
    result.session_present = client.connack.sessionPresent;
    result.properties = client.connack.properties || {};
    await end(client);
  },

  async assigned() {
    const first = await connect('first', { clientId: '' });
    const second = await connect('second', { clientId: '' });
    result.assigned = [first, second].map((c) => (c.connack.properties || {}).assignedClientIdentifier);
    // the client works under the id it was given
    result.granted = await subscribe(first, { [`${base}/assigned`]: { qos: 1 } });
    await publish(second, `${base}/assigned`, 'to the assigned', { qos: 1 });
    await until(first, has(`${base}/assigned`, 'to the assigned'), 'a message to the client with an assigned id');
    result.received = first.inbox;
    await end(second);
    await end(first);
  },

  async alias() {
    const sub = await connect('sub');
    result.granted = await subscribe(sub, { [`${base}/alias/#`]: { qos: 2 } });
    const pub = await connect('pub');
    const other = await connect('other');
    const sent = [];
    pub.on('packetsend', (packet) => {
      if (packet.cmd === 'publish') sent.push({ topic: packet.topic, alias: (packet.properties || {}).topicAlias });
    });
    const publishes = [
      // [client, topic ('' uses the alias), payload, qos, alias]
      [pub, `${base}/alias/a`, 'a set 1', 1, 1], // topic and alias: sets alias 1
      [pub, '', 'a by 1', 1, 1], //                   alias only: topic a
      [pub, `${base}/alias/b`, 'b set 10', 0, 10], // the largest alias the CONNACK allows
      [pub, '', 'b by 10', 2, 10],
      [other, `${base}/alias/d`, 'd set 1 elsewhere', 1, 1], // aliases are per connection
      [pub, '', 'a by 1 again', 0, 1], //              still topic a on pub's connection
      [pub, `${base}/alias/c`, 'c set 1', 1, 1], //    alias 1 now means c
      [pub, '', 'c by 1', 1, 1],
      [pub, `${base}/alias/a`, 'a plain', 2, undefined],
      [other, '', 'd by 1', 1, 1],
    ];
    for (const [client, topic, payload, qos, alias] of publishes) {
      await publish(client, topic, payload, alias === undefined ? { qos } : { qos, properties: { topicAlias: alias } });
    }
    await until(sub, (inbox) => publishes.every(([, , payload]) => inbox.some((m) => m.payload === payload)),
      'every aliased publish');
    result.sent = sent; // what pub put on the wire
    result.received = sub.inbox;
    await end(other);
    await end(pub);
    await end(sub);
  },

  async mixed() {
    const peers = { 4: await connect('v4', { protocolVersion: 4 }), 5: await connect('v5') };
    const filter = `${base}/mixed/#`;
    result.granted = {};
    for (const v of [4, 5]) result.granted[v] = await subscribe(peers[v], { [filter]: { qos: 2 } });
    const burst = 10; // QoS 0 publishes written at once: a 3.1.1 run the broker rewrites for 5.0
    for (const v of [4, 5]) {
      const pub = peers[v];
      await bounded(Promise.all(Array.from({ length: burst },
        (_, n) => pub.publishAsync(`${base}/mixed/from${v}`, `burst ${n} from ${v}`, { qos: 0 }))), `the QoS 0 burst from ${v}`);
      for (const qos of [1, 2]) await publish(pub, `${base}/mixed/from${v}`, `at ${qos} from ${v}`, { qos });
      await publish(pub, `${base}/mixed/marker${v}`, 'marker', { qos: 1 });
    }
    // each client gets every message of both, its own included; the markers come last from each
    const expected = 2 * (burst + 2) + 2;
    for (const v of [4, 5]) {
      await until(peers[v], (inbox) => inbox.length >= expected && has(`${base}/mixed/marker4`, 'marker')(inbox)
        && has(`${base}/mixed/marker5`, 'marker')(inbox), `every message at the ${v} client`);
    }
    result.received = {};
    for (const v of [4, 5]) result.received[v] = peers[v].inbox.filter((m) => m.payload !== 'marker');
    for (const v of [4, 5]) await end(peers[v]);
  },
};

const V5_ONLY = new Set(['connack', 'assigned', 'alias', 'mixed']);

if (!host || !Number(portArg) || ![4, 5].includes(version) || !Object.hasOwn(scenarios, scenario || '')) {
  finish(false, `usage: node check.js HOST PORT {4,5} {${Object.keys(scenarios).join(',')}} [ARG]`);
} else if (V5_ONLY.has(scenario) && version !== 5) {
  finish(false, `${scenario} is a scenario for MQTT 5.0 only: VERSION 5`);
} else {
  scenarios[scenario]().then(() => finish(true), (err) => finish(false, err && err.message ? err.message : String(err)));
}
