/**
 * The runner's check of every line a colocated harness writes. The harness runs in the sandbox
 * next to the agent's own commands (same user), so anything may arrive on its stdout: a line is
 * acted on only once it is one of the relay messages with exactly its fields and types, and an
 * event only when it is one of the `agent.*` events the split loop emits, shaped as that loop
 * shapes it and small enough for one event batch. Anything else is a `RelayError`.
 */
import type { ContentBlock, ModelMessage, ModelRequest, ToolSpec } from '@agentplane/protocol';
import type { IdleStopReason } from '../events.js';
import { RelayError, type HarnessMessage, type RelayEvent } from './protocol.js';

/** Largest event payload (serialised) the runner forwards: an event batch frame is 1 MiB. */
export const RELAY_MAX_EVENT_BYTES = 900 * 1024;
/** Longest log message kept from the harness. */
const MAX_LOG_CHARS = 2_000;
const ID = /^[A-Za-z0-9_.:-]{1,64}$/;

type Rec = Record<string, unknown>;

function fail(reason: RelayError['reason'], message: string): never {
  throw new RelayError(reason, message);
}

function isRecord(v: unknown): v is Rec {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** An object with exactly these required and optional fields. */
function shape(v: unknown, what: string, required: string[], optional: string[] = [], reason: RelayError['reason'] = 'invalid_message'): Rec {
  if (!isRecord(v)) fail(reason, `${what} must be an object`);
  for (const k of required) if (v[k] === undefined) fail(reason, `${what} lacks '${k}'`);
  for (const k of Object.keys(v)) if (!required.includes(k) && !optional.includes(k)) fail(reason, `${what} has an unknown field '${k}'`);
  return v;
}

function str(v: unknown, what: string, max: number, reason: RelayError['reason'] = 'invalid_message'): string {
  if (typeof v !== 'string' || v.length > max) fail(reason, `${what} must be a string of at most ${max} characters`);
  return v;
}

function id(v: unknown, what: string): string {
  if (typeof v !== 'string' || !ID.test(v)) fail('invalid_message', `${what} must match ${ID.source}`);
  return v;
}

function bool(v: unknown, what: string, reason: RelayError['reason']): boolean {
  if (typeof v !== 'boolean') fail(reason, `${what} must be a boolean`);
  return v;
}

function block(v: unknown, what: string): ContentBlock {
  const b = isRecord(v) ? v : fail('invalid_message', `${what} must be an object`);
  switch (b.type) {
    case 'text':
    case 'thinking':
      shape(b, what, ['type', 'text']);
      str(b.text, `${what}.text`, RELAY_MAX_EVENT_BYTES * 4);
      break;
    case 'tool_use':
      shape(b, what, ['type', 'id', 'name', 'input']);
      str(b.id, `${what}.id`, 256);
      str(b.name, `${what}.name`, 128);
      break;
    case 'tool_result':
      shape(b, what, ['type', 'tool_use_id', 'content'], ['is_error', 'images']);
      str(b.tool_use_id, `${what}.tool_use_id`, 256);
      str(b.content, `${what}.content`, RELAY_MAX_EVENT_BYTES * 4);
      if (b.is_error !== undefined) bool(b.is_error, `${what}.is_error`, 'invalid_message');
      if (b.images !== undefined) {
        if (!Array.isArray(b.images) || b.images.length > 8) fail('invalid_message', `${what}.images must be an array of at most 8 images`);
        for (const [i, img] of (b.images as unknown[]).entries()) {
          const im = shape(img, `${what}.images[${i}]`, ['type', 'media_type', 'data']);
          if (im.type !== 'image' || (im.media_type !== 'image/png' && im.media_type !== 'image/jpeg')) fail('invalid_message', `${what}.images[${i}] must be an image/png or image/jpeg image`);
          if (typeof im.data !== 'string' || !BASE64.test(im.data)) fail('invalid_message', `${what}.images[${i}].data must be base64`);
        }
      }
      break;
    default:
      fail('invalid_message', `${what} has an unknown block type`);
  }
  return b as ContentBlock;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function modelRequest(v: unknown): ModelRequest {
  const r = shape(v, 'model.request.request', ['routing_key', 'messages', 'tools'], ['system', 'max_output_tokens', 'temperature']);
  str(r.routing_key, 'request.routing_key', 94);
  if (r.system !== undefined) str(r.system, 'request.system', RELAY_MAX_EVENT_BYTES * 4);
  if (r.max_output_tokens !== undefined && (!Number.isInteger(r.max_output_tokens) || (r.max_output_tokens as number) < 1)) fail('invalid_message', 'request.max_output_tokens must be a positive integer');
  if (r.temperature !== undefined && (typeof r.temperature !== 'number' || !Number.isFinite(r.temperature))) fail('invalid_message', 'request.temperature must be a number');
  if (!Array.isArray(r.messages) || r.messages.length === 0) fail('invalid_message', 'request.messages must be a non-empty array');
  r.messages.forEach((m: unknown, i) => {
    const msg = shape(m, `request.messages[${i}]`, ['role', 'content']);
    if (msg.role !== 'user' && msg.role !== 'assistant') fail('invalid_message', `request.messages[${i}].role must be user or assistant`);
    if (!Array.isArray(msg.content)) fail('invalid_message', `request.messages[${i}].content must be an array`);
    msg.content.forEach((b: unknown, j) => block(b, `request.messages[${i}].content[${j}]`));
  });
  if (!Array.isArray(r.tools) || r.tools.length > 512) fail('invalid_message', 'request.tools must be an array of at most 512 tools');
  r.tools.forEach((t: unknown, i) => {
    const spec = shape(t, `request.tools[${i}]`, ['name', 'description', 'input_schema']);
    str(spec.name, `request.tools[${i}].name`, 128);
    str(spec.description, `request.tools[${i}].description`, 16_384);
    if (!isRecord(spec.input_schema)) fail('invalid_message', `request.tools[${i}].input_schema must be an object`);
  });
  return r as unknown as ModelRequest & { messages: ModelMessage[]; tools: ToolSpec[] };
}

const TEXT_EVENTS = { 'agent.thinking': 'thinking', 'agent.message': 'text' } as const;

/** One `agent.*` event as the split loop emits it; anything else is `invalid_event`. */
export function validateEvent(v: unknown): RelayEvent {
  const e = shape(v, 'event', ['type', 'payload'], [], 'invalid_event');
  const size = Buffer.byteLength(JSON.stringify(e.payload));
  if (size > RELAY_MAX_EVENT_BYTES) fail('invalid_event', `an ${String(e.type)} event of ${size} bytes is larger than ${RELAY_MAX_EVENT_BYTES}`);
  const p = e.payload;
  switch (e.type) {
    case 'agent.thinking':
    case 'agent.message': {
      const kind = TEXT_EVENTS[e.type];
      const payload = shape(p, `${e.type} payload`, ['content'], [], 'invalid_event');
      if (!Array.isArray(payload.content) || payload.content.length === 0 || payload.content.length > 256) fail('invalid_event', `${e.type} content must be a non-empty array`);
      for (const b of payload.content) {
        const blk = shape(b, `${e.type} block`, ['type', 'text'], [], 'invalid_event');
        if (blk.type !== kind || typeof blk.text !== 'string') fail('invalid_event', `${e.type} blocks must be {type: '${kind}', text}`);
      }
      break;
    }
    case 'agent.tool_use': {
      const payload = shape(p, 'agent.tool_use payload', ['id', 'name', 'input', 'blocking'], ['awaiting'], 'invalid_event');
      str(payload.id, 'agent.tool_use id', 256, 'invalid_event');
      str(payload.name, 'agent.tool_use name', 128, 'invalid_event');
      const blocking = bool(payload.blocking, 'agent.tool_use blocking', 'invalid_event');
      if (payload.awaiting !== undefined && payload.awaiting !== 'custom_tool_result' && payload.awaiting !== 'tool_confirmation' && payload.awaiting !== 'question_answer') {
        fail('invalid_event', 'agent.tool_use awaiting is not custom_tool_result, tool_confirmation or question_answer');
      }
      if (blocking !== (payload.awaiting !== undefined)) fail('invalid_event', 'agent.tool_use is blocking exactly when it names what it awaits');
      break;
    }
    case 'agent.tool_result': {
      const payload = shape(p, 'agent.tool_result payload', ['tool_use_id', 'content', 'is_error'], ['denied', 'policy_rule_id', 'exit_code', 'timed_out', 'oom_killed', 'interrupted', 'duration_ms', 'file_id'], 'invalid_event');
      if (payload.file_id !== undefined && (typeof payload.file_id !== 'string' || !/^file_[A-Za-z0-9]{1,64}$/.test(payload.file_id))) fail('invalid_event', 'agent.tool_result file_id must be a file_ id');
      str(payload.tool_use_id, 'agent.tool_result tool_use_id', 256, 'invalid_event');
      if (typeof payload.content !== 'string') fail('invalid_event', 'agent.tool_result content must be a string');
      bool(payload.is_error, 'agent.tool_result is_error', 'invalid_event');
      if (payload.policy_rule_id !== undefined) str(payload.policy_rule_id, 'agent.tool_result policy_rule_id', 64, 'invalid_event');
      for (const k of ['denied', 'timed_out', 'oom_killed', 'interrupted'] as const) if (payload[k] !== undefined) bool(payload[k], `agent.tool_result ${k}`, 'invalid_event');
      if (payload.exit_code !== undefined && (!Number.isInteger(payload.exit_code) || (payload.exit_code as number) < -1 || (payload.exit_code as number) > 255)) fail('invalid_event', 'agent.tool_result exit_code must be an integer from -1 to 255');
      if (payload.duration_ms !== undefined && (typeof payload.duration_ms !== 'number' || !Number.isFinite(payload.duration_ms) || payload.duration_ms < 0)) fail('invalid_event', 'agent.tool_result duration_ms must be a non-negative number');
      break;
    }
    default:
      fail('invalid_event', `a colocated harness may not emit '${typeof e.type === 'string' ? e.type.slice(0, 64) : typeof e.type}' events`);
  }
  return e as unknown as RelayEvent;
}

const PLAIN_STOPS = new Set(['end_turn', 'max_tokens', 'refusal', 'interrupted', 'max_duration', 'max_steps']);

function stopReason(v: unknown): IdleStopReason {
  const s = isRecord(v) ? v : fail('invalid_message', 'done.outcome.stop_reason must be an object');
  if (s.type === 'requires_action') {
    shape(s, 'stop_reason', ['type', 'tool_use_ids']);
    if (!Array.isArray(s.tool_use_ids) || s.tool_use_ids.length === 0 || s.tool_use_ids.length > 256) fail('invalid_message', 'requires_action names 1 to 256 tool uses');
    s.tool_use_ids.forEach((t: unknown, i) => str(t, `tool_use_ids[${i}]`, 256));
  } else {
    shape(s, 'stop_reason', ['type']);
    if (typeof s.type !== 'string' || !PLAIN_STOPS.has(s.type)) fail('invalid_message', 'stop_reason.type is not a stop reason the harness may report');
  }
  return s as unknown as IdleStopReason;
}

/** Parses and checks one line from the harness. */
export function parseHarnessLine(line: string): HarnessMessage {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch {
    fail('not_json', `the harness wrote a line that is not JSON: ${JSON.stringify(line.slice(0, 80))}`);
  }
  const m = isRecord(v) ? v : fail('invalid_message', 'a relay line must be a JSON object');
  switch (m.type) {
    case 'model.request':
      shape(m, 'model.request', ['type', 'id', 'request']);
      return { type: 'model.request', id: id(m.id, 'model.request.id'), request: modelRequest(m.request) };
    case 'model.cancel':
      shape(m, 'model.cancel', ['type', 'id']);
      return { type: 'model.cancel', id: id(m.id, 'model.cancel.id') };
    case 'tool.check':
      shape(m, 'tool.check', ['type', 'id', 'tool_use_id']);
      return { type: 'tool.check', id: id(m.id, 'tool.check.id'), tool_use_id: str(m.tool_use_id, 'tool.check.tool_use_id', 256) };
    case 'file.store': {
      shape(m, 'file.store', ['type', 'id', 'tool_use_id', 'filename', 'content_type', 'data']);
      if (m.content_type !== 'image/png') fail('invalid_message', 'file.store content_type must be image/png');
      const filename = str(m.filename, 'file.store.filename', 200);
      if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(filename)) fail('invalid_message', 'file.store filename must be letters, digits, ".", "_" and "-"');
      if (typeof m.data !== 'string' || !BASE64.test(m.data)) fail('invalid_message', 'file.store data must be base64');
      return { type: 'file.store', id: id(m.id, 'file.store.id'), tool_use_id: str(m.tool_use_id, 'file.store.tool_use_id', 256), filename, content_type: 'image/png', data: m.data };
    }
    case 'tool.call':
      shape(m, 'tool.call', ['type', 'id', 'tool_use_id', 'name', 'input']);
      return { type: 'tool.call', id: id(m.id, 'tool.call.id'), tool_use_id: str(m.tool_use_id, 'tool.call.tool_use_id', 256), name: str(m.name, 'tool.call.name', 128), input: m.input };
    case 'event':
      shape(m, 'event', ['type', 'event']);
      return { type: 'event', event: validateEvent(m.event) };
    case 'log': {
      shape(m, 'log', ['type', 'level', 'msg']);
      if (m.level !== 'debug' && m.level !== 'info' && m.level !== 'warn' && m.level !== 'error') fail('invalid_message', 'log.level must be debug, info, warn or error');
      if (typeof m.msg !== 'string') fail('invalid_message', 'log.msg must be a string');
      return { type: 'log', level: m.level, msg: m.msg.slice(0, MAX_LOG_CHARS) };
    }
    case 'done': {
      shape(m, 'done', ['type', 'outcome']);
      const outcome = shape(m.outcome, 'done.outcome', ['stop_reason']);
      return { type: 'done', outcome: { stop_reason: stopReason(outcome.stop_reason) } };
    }
    case 'error':
      shape(m, 'error', ['type', 'message']);
      if (typeof m.message !== 'string') fail('invalid_message', 'error.message must be a string');
      return { type: 'error', message: m.message.slice(0, MAX_LOG_CHARS) };
    default:
      fail('invalid_message', `unknown relay message type ${JSON.stringify(typeof m.type === 'string' ? m.type.slice(0, 64) : m.type)}`);
  }
}
