// infer_identity.mjs - an inferpool client in Node.js, written from docs/PROTOCOL.md alone,
// with the `zeromq` npm package (libzmq bindings; nothing of inferpool's).
//
// It connects a DEALER socket, makes sure a server answers (zmq connects silently), then sends
// several `infer` requests for the identity model at once (INPUT0, FP32, shape [4]) and matches
// the responses to them by `id`, checking that each OUTPUT0 equals its INPUT0.
//
// Usage:
//   node infer_identity.mjs ENDPOINT [MODEL]           infer on MODEL (default "identity")
//   node infer_identity.mjs ENDPOINT [MODEL] --health  print health_ready's `ready`
//
// Environment: INFERPOOL_TIMEOUT_MS, how long to wait for any answer (default 10000).
// Exit status: 0 ok (or ready), 1 a mismatch (or not ready), 2 the server answered with an
// error (its code and message on stderr), 3 no answer in time, 4 usage.

import { existsSync } from "node:fs";
import { Dealer } from "zeromq";

const EXIT = { ok: 0, mismatch: 1, serverError: 2, timeout: 3, usage: 4 };
const REQUESTS = 3; // in flight at once on the one DEALER socket

class ServerError extends Error {
  constructor(error) {
    super(`server error ${error.code}: ${error.message}`);
  }
}

class Timeout extends Error {}

// A DEALER client: requests carry an `id`, responses echo it, and may arrive in any order.
class Client {
  constructor(endpoint, timeoutMs) {
    this.endpoint = endpoint;
    this.socket = new Dealer({ linger: 0, receiveTimeout: timeoutMs });
    this.socket.connect(endpoint);
    this.nextId = 1;
    this.waiting = new Map(); // id -> {resolve, reject}
    this.reading = null;
  }

  // frame 0: the empty delimiter (a DEALER sends it itself); 1: the JSON header; then tensors
  request(header, tensors = []) {
    const id = `node-${this.nextId++}`;
    const message = [Buffer.alloc(0), Buffer.from(JSON.stringify({ ...header, id })), ...tensors];
    const reply = new Promise((resolve, reject) => this.waiting.set(id, { resolve, reject }));
    this.socket.send(message).catch((err) => this.fail(err));
    this.reading ??= this.readReplies();
    return reply;
  }

  async readReplies() {
    try {
      while (this.waiting.size > 0) {
        const [delimiter, header, ...tensors] = await this.socket.receive();
        if (delimiter.length !== 0 || header === undefined) {
          throw new Error("a reply without the empty delimiter and a header");
        }
        const reply = JSON.parse(header.toString("utf8"));
        const waiter = this.waiting.get(reply.id);
        if (waiter === undefined) {
          // id "" answers a message whose header the server could not read: ours never are
          throw new Error(`a reply for no request of ours: ${header}`);
        }
        this.waiting.delete(reply.id);
        if (reply.error) waiter.reject(new ServerError(reply.error));
        else waiter.resolve({ header: reply, tensors });
      }
    } catch (err) {
      this.fail(err.code === "EAGAIN" ? new Timeout(`no answer from ${this.endpoint}`) : err);
    } finally {
      this.reading = null;
    }
  }

  fail(err) {
    for (const waiter of this.waiting.values()) waiter.reject(err);
    this.waiting.clear();
  }

  close() {
    this.socket.close();
  }
}

function fp32(values) {
  return Buffer.from(new Float32Array(values).buffer);
}

async function main(argv) {
  const [endpoint, model = "identity", flag] = argv;
  if (!endpoint || (flag !== undefined && flag !== "--health")) {
    console.error("usage: node infer_identity.mjs ENDPOINT [MODEL] [--health]");
    return EXIT.usage;
  }
  // an ipc endpoint is a socket file: without it nothing listens, whatever zmq says
  if (endpoint.startsWith("ipc://") && !existsSync(endpoint.slice("ipc://".length))) {
    console.error(`no inferpool server answers at ${endpoint}: the socket file does not exist`);
    return EXIT.timeout;
  }
  const client = new Client(endpoint, Number(process.env.INFERPOOL_TIMEOUT_MS ?? 10000));
  try {
    // zmq connects in the background: an answer to health_live is what proves a server is there
    await client.request({ type: "health_live" });
    if (flag === "--health") {
      const { header } = await client.request({ type: "health_ready" });
      console.log(String(header.ready));
      return header.ready ? EXIT.ok : EXIT.mismatch;
    }
    const inputs = Array.from({ length: REQUESTS }, (_, i) => [1.5 + i, 2.5, 3.5, 4.5]);
    const replies = await Promise.all(
      inputs.map((values) =>
        client.request(
          {
            type: "infer",
            model_name: model,
            inputs: [{ name: "INPUT0", datatype: "FP32", shape: [values.length] }],
            outputs: [{ name: "OUTPUT0" }],
          },
          [fp32(values)],
        ),
      ),
    );
    for (const [i, { header, tensors }] of replies.entries()) {
      const [out] = header.outputs;
      const got = Array.from(new Float32Array(new Uint8Array(tensors[0]).buffer));
      if (out.name !== "OUTPUT0" || out.datatype !== "FP32" || got.join() !== inputs[i].join()) {
        console.error(`OUTPUT0 of request ${i} is ${got}, not ${inputs[i]}`);
        return EXIT.mismatch;
      }
      console.log(`OUTPUT0 = ${got.join(" ")}`);
    }
    console.log("OK");
    return EXIT.ok;
  } catch (err) {
    console.error(err.message);
    return err instanceof ServerError ? EXIT.serverError : err instanceof Timeout ? EXIT.timeout : EXIT.mismatch;
  } finally {
    client.close();
  }
}

process.exitCode = await main(process.argv.slice(2));
