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
//   props             a 5.0 publisher's message properties (user properties with a repeated key, content
//                     type, response topic, correlation data, payload format, message expiry) reach a 5.0
//                     subscriber as sent and a 3.1.1 one without them; a 3.1.1 publisher's messages carry none
//   subopts           subscription options: no local, retain as published, retain handling 0/1/2 for a
//                     retained message, and subscription identifiers (one delivery with every matching one)
//   shared            $share/g/...: three members (5.0, 3.1.1, 5.0) get QoS 1 messages round robin, a
//                     plain subscriber all of them (redelivery needs a member that does not acknowledge:
//                     mqtt.js always does, so tests/test_shared_subscriptions.py covers it with raw sockets)
//   willdelay         a will with a delay interval and properties, published after its delay; one whose
//                     client is back in time (then ends its session), never
//   expiry            session expiry set to 0 at DISCONNECT: no session and nothing queued at the reconnect
//                     (beside one that kept its expiry: session and queued message there)
//
// Where a scenario shows that something was not delivered, a marker message that must come next (on a
// plain subscription of the client's own) stands in for a wait.
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
    if (packet.properties && Object.keys(packet.properties).length) {
      // binary properties (correlation data) as hex, so the JSON line keeps them byte for byte
      message.properties = Object.fromEntries(Object.entries(packet.properties)
        .map(([key, value]) => [key, Buffer.isBuffer(value) ? value.toString('hex') : value]));
    }
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

/** SUBSCRIBE to `filters` ({filter: {qos, nl, rap, rh}}), at 5.0 with `opts.properties` when given. */
async function subscribe(client, filters, opts) {
  const granted = await bounded(client.subscribeAsync(filters, opts), `SUBACK for ${Object.keys(filters)}`);
  return granted.map((g) => g.qos);
}

const publish = (client, topic, payload, opts) =>
  bounded(client.publishAsync(topic, payload, opts), `the QoS ${opts.qos} flow of ${topic}`);

/**
 * Publishes a marker `payload` from `pub` to `topic` (which `client` subscribed to plainly) and waits
 * for it at `client`: whatever was routed to the client before it has then arrived. Resolves with the
 * client's messages from index `from` up to the marker (left out).
 */
async function upToMarker(pub, client, topic, payload, from = 0) {
  await publish(pub, topic, payload, { qos: 1 });
  const isMarker = (m) => m.topic === topic && m.payload === payload;
  await until(client, (inbox) => inbox.slice(from).some(isMarker),
    `the marker "${payload}" at ${client.options.clientId}`);
  const since = client.inbox.slice(from);
  return since.slice(0, since.findIndex(isMarker));
}

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

  async props() {
    const filter = `${base}/props/#`;
    const sub5 = await connect('sub5');
    const sub4 = await connect('sub4', { protocolVersion: 4 });
    result.granted = {
      5: await subscribe(sub5, { [filter]: { qos: 1 } }),
      4: await subscribe(sub4, { [filter]: { qos: 1 } }),
    };
    const pub = await connect('pub');
    const properties = {
      payloadFormatIndicator: true, // the payload is UTF-8
      messageExpiryInterval: 3600,
      contentType: 'application/json; charset=utf-8',
      responseTopic: `${base}/replies/π`,
      correlationData: Buffer.from([0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff]),
      userProperties: { dup: ['first', 'second', 'first'], unit: '°C', empty: '' }, // a repeated key, in order
    };
    result.sent = { ...properties, correlationData: properties.correlationData.toString('hex') };
    for (const qos of [0, 1]) {
      await publish(pub, `${base}/props/at${qos}`, `{"qos": ${qos}, "t": "21.5 °C"}`, { qos, properties });
    }
    // a 3.1.1 publisher's message, after them: it carries no properties to either subscriber
    const legacy = await connect('legacy', { protocolVersion: 4 });
    await publish(legacy, `${base}/props/legacy`, 'from 3.1.1', { qos: 1 });
    for (const [v, sub] of [[5, sub5], [4, sub4]]) {
      await until(sub, (inbox) => inbox.length >= 3 && has(`${base}/props/legacy`, 'from 3.1.1')(inbox),
        `the three messages at the ${v} subscriber`);
    }
    result.received = { 5: sub5.inbox, 4: sub4.inbox };
    await end(legacy);
    await end(pub);
    await end(sub4);
    await end(sub5);
  },

  async subopts() {
    const pub = await connect('pub'); // publishes the markers (and the retained messages)

    // no local: the client's own publish is not delivered back to it, another client's is
    const local = await connect('local');
    const localMark = `${base}/mark/local`;
    result.no_local_granted = await subscribe(local,
      { [`${base}/nl/t`]: { qos: 1, nl: true }, [localMark]: { qos: 1 } });
    const other = await connect('other');
    await subscribe(other, { [`${base}/nl/t`]: { qos: 1 } });
    await publish(local, `${base}/nl/t`, 'own', { qos: 1 });
    await until(other, has(`${base}/nl/t`, 'own'), 'the own publish at the other subscriber');
    await upToMarker(pub, local, localMark, 'after own');
    await publish(other, `${base}/nl/t`, 'from another', { qos: 1 });
    await until(local, has(`${base}/nl/t`, 'from another'), "another client's publish");
    // a plain subscription that matches too: the own message comes back, once (its delivery may come
    // before its PUBACK: until() sees it either way)
    await subscribe(local, { [`${base}/nl/#`]: { qos: 1 } });
    await publish(local, `${base}/nl/t`, 'own again', { qos: 1 });
    await until(local, has(`${base}/nl/t`, 'own again'), 'the own publish through the plain subscription');
    await upToMarker(pub, local, localMark, 'after own again');
    result.no_local = local.inbox.slice(); // markers included
    result.no_local_other = other.inbox.slice();

    // retain as published: the retain flag of a live delivery kept (5.0 with rap), cleared (5.0 without, 3.1.1)
    const rap = {
      kept: await connect('rap'), cleared: await connect('norap'), legacy: await connect('rap311', { protocolVersion: 4 }),
    };
    result.rap_granted = {};
    for (const [name, client] of Object.entries(rap)) {
      const options = name === 'kept' ? { qos: 1, rap: true } : { qos: 1 };
      result.rap_granted[name] = await subscribe(client, { [`${base}/rap/#`]: options });
    }
    await publish(pub, `${base}/rap/r`, 'retained', { qos: 1, retain: true });
    await publish(pub, `${base}/rap/r`, '', { qos: 1, retain: true }); // clears it, a live retained publish too
    result.retain_as_published = {};
    for (const [name, client] of Object.entries(rap)) {
      await until(client, has(`${base}/rap/r`, ''), `the clearing publish at ${name}`);
      result.retain_as_published[name] = client.inbox;
    }

    // retain handling, a retained message there: 0 sends it at every SUBSCRIBE, 1 only for a new
    // subscription, 2 never; what came after each SUBACK up to a marker
    const handled = await connect('rh');
    const rhMark = `${base}/mark/rh`;
    await subscribe(handled, { [rhMark]: { qos: 1 } });
    await publish(pub, `${base}/rh/r`, 'kept', { qos: 1, retain: true });
    result.retain_handling = [];
    const step = async (rh, what) => {
      const from = handled.inbox.length;
      const granted = await subscribe(handled, { [`${base}/rh/r`]: { qos: 1, rh } });
      const received = await upToMarker(pub, handled, rhMark, `after ${rh} ${what}`, from);
      result.retain_handling.push({ rh, what, granted, received });
    };
    const unsubscribe = () => bounded(handled.unsubscribeAsync(`${base}/rh/r`), 'UNSUBACK');
    await step(0, 'new');
    await step(0, 'again');
    await unsubscribe();
    await step(1, 'new');
    await step(1, 'again');
    await unsubscribe();
    await step(2, 'new');
    await step(2, 'again');
    await unsubscribe();
    await publish(pub, `${base}/rh/r`, '', { qos: 1, retain: true }); // leave no retained message behind

    // subscription identifiers: one delivery with every matching subscription's
    const ids = await connect('ids');
    const idsMark = `${base}/mark/ids`;
    await subscribe(ids, { [idsMark]: { qos: 1 } });
    result.ids_granted = [
      ...await subscribe(ids, { [`${base}/id/+`]: { qos: 0 } }, { properties: { subscriptionIdentifier: 5 } }),
      ...await subscribe(ids, { [`${base}/id/#`]: { qos: 1 } }, { properties: { subscriptionIdentifier: 268435455 } }),
      ...await subscribe(ids, { [`${base}/id/plain/#`]: { qos: 1 } }), // no identifier
    ];
    await publish(pub, `${base}/id/a`, 'two ids', { qos: 1 });
    await publish(pub, `${base}/id/plain/x`, 'one id', { qos: 1 });
    await upToMarker(pub, ids, idsMark, 'after ids');
    result.identifiers = ids.inbox; // marker included

    for (const client of [ids, handled, ...Object.values(rap), other, local, pub]) await end(client);
  },

  async shared() {
    const share = `$share/g/${base}/shared/+`;
    const members = [];
    result.granted = [];
    for (const [n, v] of [[0, 5], [1, 4], [2, 5]]) { // joined in this order: round robin starts with 0
      const member = await connect(`member${n}`, { protocolVersion: v });
      await subscribe(member, { [`${base}/mark/${n}`]: { qos: 1 } }); // a plain subscription of its own
      result.granted.push(await subscribe(member, { [share]: { qos: 1 } }));
      members.push(member);
    }
    const plain = await connect('plain');
    await subscribe(plain, { [`${base}/shared/+`]: { qos: 1 } });
    const pub = await connect('pub');
    for (let n = 0; n < 6; n++) await publish(pub, `${base}/shared/x`, `m${n}`, { qos: 1 });
    await until(plain, (inbox) => inbox.length >= 6, 'the six messages at the plain subscriber');
    // each member's marker comes after every message routed to it: what it got, and nothing more
    result.members = [];
    for (const [n, member] of members.entries()) {
      result.members.push(await upToMarker(pub, member, `${base}/mark/${n}`, 'marker'));
    }
    result.plain = plain.inbox;
    for (const client of [pub, plain, ...members]) await end(client);
  },

  async willdelay() {
    const watcher = await connect('watcher');
    await subscribe(watcher, { [`${base}/wd/#`]: { qos: 1 } });
    const carried = { userProperties: { why: ['lost', 'again'], who: 'plexmq' }, contentType: 'text/plain' };
    result.sent = carried;
    /** Connects `name` with a will delayed by `delay` s, in a session of 60 s, and destroys its socket. */
    const drop = async (name, delay) => {
      const client = await connect(name, {
        properties: { sessionExpiryInterval: 60 },
        will: { topic: `${base}/wd/${name}`, payload: 'gone', qos: 1, retain: false,
                properties: { willDelayInterval: delay, ...carried } },
      });
      const closed = new Promise((resolve) => client.once('close', resolve));
      client.stream.destroy();
      await bounded(closed, `the destroyed socket of ${name} to close`);
      clients.delete(client);
    };
    // back before its will delay (60 s): that will is never published, not even when the session
    // ends (expiry 0 at DISCONNECT), which would publish a will still waiting
    await drop('back', 60);
    const back = await connect('back', { clean: false, properties: { sessionExpiryInterval: 60 } });
    result.back_session_present = back.connack.sessionPresent;
    await end(back, { properties: { sessionExpiryInterval: 0 } });
    // a will delayed by 1 s: published once the delay has passed
    await drop('late', 1);
    const started = Date.now();
    await until(watcher, has(`${base}/wd/late`, 'gone'), 'the delayed will');
    result.will_after_ms = Date.now() - started;
    await publish(watcher, `${base}/wd/marker`, 'marker', { qos: 1 });
    await until(watcher, has(`${base}/wd/marker`, 'marker'), 'the marker after the will');
    result.received = watcher.inbox;
    await end(watcher);
    // leave no session behind: clean start, and no expiry at this connection
    await end(await connect('late'));
  },

  async expiry() {
    // two sessions of 60 s with a QoS 1 subscription: one ends with expiry 0 set at DISCONNECT
    const persistent = { properties: { sessionExpiryInterval: 60 } };
    for (const name of ['ended', 'kept']) {
      const client = await connect(name, persistent); // clean start: a new session
      await subscribe(client, { [`${base}/expiry/+`]: { qos: 1 } });
      await end(client, name === 'ended' ? { properties: { sessionExpiryInterval: 0 } } : undefined);
    }
    const pub = await connect('pub');
    await publish(pub, `${base}/expiry/x`, 'while away', { qos: 1 });
    result.session_present = {};
    result.received = {};
    for (const name of ['ended', 'kept']) {
      const client = await connect(name, { ...persistent, clean: false });
      result.session_present[name] = client.connack.sessionPresent;
      // a queued message comes before the marker on a plain subscription made now
      await subscribe(client, { [`${base}/mark/${name}`]: { qos: 1 } });
      result.received[name] = await upToMarker(pub, client, `${base}/mark/${name}`, 'marker');
      await end(client, { properties: { sessionExpiryInterval: 0 } }); // leave no session behind
    }
    await end(pub);
  },
};

const V5_ONLY = new Set(['connack', 'assigned', 'alias', 'mixed', 'props', 'subopts', 'shared', 'willdelay', 'expiry']);

if (!host || !Number(portArg) || ![4, 5].includes(version) || !Object.hasOwn(scenarios, scenario || '')) {
  finish(false, `usage: node check.js HOST PORT {4,5} {${Object.keys(scenarios).join(',')}} [ARG]`);
} else if (V5_ONLY.has(scenario) && version !== 5) {
  finish(false, `${scenario} is a scenario for MQTT 5.0 only: VERSION 5`);
} else {
  scenarios[scenario]().then(() => finish(true), (err) => finish(false, err && err.message ? err.message : String(err)));
}
