/**
 * The JSON messages of the guest agent protocol (carried in kind-1 frames, or
 * fragmented over kind-2/3 frames on channel 0 when larger than one frame). Every
 * message is a strict object: unknown fields are a violation, not something to ignore.
 * See docs/protocol.md for the full contract.
 */
import * as z from "zod/mini";
import "./zod.js";

export * from "./op-schemas.js";

/** Bumped on any incompatible change to framing, messages or op schemas. */
export const PROTOCOL_VERSION = 2;

/** Version of this agent implementation, reported in the agent's hello. */
export const AGENT_VERSION = "0.1.0";

/** Largest JSON message after reassembly (64 MiB). */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** Most requests one connection may have in flight at once. */
export const MAX_CONCURRENT_REQUESTS = 256;

const MAX_U32 = 0xffff_ffff;

/** Request ids double as the channel of the request's streams, so they are u32 and never 0. */
export const requestId = z.int().check(z.minimum(1), z.maximum(MAX_U32));

export const errorObject = z.strictObject({
  code: z.string().check(z.minLength(1)),
  message: z.string(),
  hint: z.optional(z.string()),
});
export type ErrorObject = z.infer<typeof errorObject>;

/** Host → agent, first message on a connection. */
export const hostHello = z.strictObject({
  type: z.literal("hello"),
  version: z.int(),
  client: z.string(),
});

/** Host → agent: run `op` with `args`; the reply carries the same `id`. */
export const requestMessage = z.strictObject({
  type: z.literal("request"),
  id: requestId,
  op: z.string().check(z.minLength(1)),
  args: z.unknown(),
});

/** Host → agent: stop request `id`; it still gets exactly one response. */
export const cancelMessage = z.strictObject({ type: z.literal("cancel"), id: requestId });

export const hostMessage = z.discriminatedUnion("type", [hostHello, requestMessage, cancelMessage]);
export type HostMessage = z.infer<typeof hostMessage>;

/** Agent → host, reply to a compatible hello. */
export const agentHello = z.strictObject({
  type: z.literal("hello"),
  version: z.int(),
  agent_version: z.string(),
  pid: z.int(),
  ops: z.array(z.string()),
});

/** Agent → host: a connection-level failure (version mismatch, violation); the agent then closes. */
export const connectionError = z.strictObject({
  type: z.literal("error"),
  code: z.string().check(z.minLength(1)),
  message: z.string(),
  hint: z.optional(z.string()),
});

export const responseOk = z.strictObject({
  type: z.literal("response"),
  id: requestId,
  ok: z.literal(true),
  result: z.unknown(),
});
export const responseError = z.strictObject({
  type: z.literal("response"),
  id: requestId,
  ok: z.literal(false),
  error: errorObject,
});

export const agentMessage = z.union([agentHello, connectionError, responseOk, responseError]);
export type AgentMessage = z.infer<typeof agentMessage>;
export type AgentHello = z.infer<typeof agentHello>;
