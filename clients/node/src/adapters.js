// Agent-loop adapters: turn a model's tool calls into the items the next request needs, via Invoke.
//
// Under a session's approval policy a call may come back as an approval request instead of a
// result. The adapters then ask `onApproval(request)` (default: deny) and answer the daemon until
// the call has its result, so the model always gets what Codex would send it: the command's
// output, or `exec command rejected by user`.
//
// An agent loop never crashes on a tool result: an error that the model's own call caused — a
// result too large to send or receive (RESOURCE_EXHAUSTED: a read_file with a huge limit), bad
// arguments (INVALID_ARGUMENT, OUT_OF_RANGE) — becomes model text with `success: false`, which the
// model can act on ("ask for less"). Errors of the connection, the credentials or the session
// (UNAVAILABLE, UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, …) still reject: they are the
// host's to handle.
import { CorralError, DeadlineExceededError } from './errors.js';

/**
 * @typedef {import('./client.js').Session} Session
 * @typedef {{type: 'function_call', name: string, arguments: string, call_id: string}} FunctionCall
 * @typedef {{type: 'custom_tool_call', name: string, input: string, call_id: string}} CustomToolCall
 * @typedef {{type: 'function_call_output', call_id: string, output: string}} FunctionCallOutput
 * @typedef {{type: 'custom_tool_call_output', call_id: string, output: string}} CustomToolCallOutput
 * @typedef {{id: string, type: 'function', function: {name: string, arguments: string}}
 *   | {id: string, type: 'custom', custom: {name: string, input: string}}} ChatToolCall
 * @typedef {{role: 'tool', tool_call_id: string, content: string | object[]}} ChatToolMessage
 */

/** The default `onApproval`: nobody is there to ask, so every request is denied. */
export function denyAll() {
  return 'denied';
}

/**
 * `result` with its approval requests answered by `onApproval` (which may be async) until it is
 * a result. A request that expired before the answer arrived gives the model its `rejectedOutput`.
 */
async function settle(session, result, onApproval) {
  while (result.approval) {
    const request = result.approval;
    const decision = await onApproval(request);
    let decided;
    try {
      decided = await session.decideApproval(request.approvalId, decision);
    } catch (err) {
      // Expired on the daemon (not this call's own deadline): nothing ran.
      if (err instanceof DeadlineExceededError && /expired at/.test(err.message)) {
        return { callId: request.callId, output: request.rejectedOutput, success: false };
      }
      throw err;
    }
    if (decided.result !== 'invoke') {
      throw new Error(`the daemon answered a model call's approval with ${decided.result}`);
    }
    result = decided.invoke;
  }
  return result;
}

/** The status codes that mean "the model asked for something that cannot be", not a broken host. */
export const MODEL_ERROR_CODES = Object.freeze(['RESOURCE_EXHAUSTED', 'INVALID_ARGUMENT', 'OUT_OF_RANGE']);

const ASK_FOR_LESS =
  'ask for less (read_file: offset and limit; list_dir and grep_files: limit; a command: send its ' +
  'output to a file and read that in parts)';

/**
 * The model text for an error the model's call caused, or null for any other error. The
 * daemon's own words when it said how to do better; a result over this client's receive limit
 * (grpc-js's `Received message larger than max …`) says how to ask for less.
 * @param {unknown} err
 * @returns {string | null}
 */
export function modelErrorText(err) {
  if (!(err instanceof CorralError) || !MODEL_ERROR_CODES.includes(err.code)) return null;
  if (err.code === 'RESOURCE_EXHAUSTED' && !/ask for less/.test(err.message)) {
    return `the result is too large to receive (${err.message}); ${ASK_FOR_LESS}`;
  }
  return err.message;
}

/** Runs `call` (an Invoke and its approvals); an error the model caused becomes its result. */
async function forModel(callId, call) {
  try {
    return await call();
  } catch (err) {
    const output = modelErrorText(err);
    if (output === null) throw err;
    return { callId, output, success: false };
  }
}

/** An output's content items (view_image's image) as Responses API input items. */
function contentItems(result) {
  return (result.contentItems ?? []).flatMap((c) => {
    if (c.item === 'inputText') return [{ type: 'input_text', text: c.inputText }];
    if (c.item === 'inputImage') {
      const image = { type: 'input_image', image_url: c.inputImage.imageUrl };
      if (c.inputImage.detail) image.detail = c.inputImage.detail;
      return [image];
    }
    return [];
  });
}

/**
 * A tool message's content: the output text, or, when the output is content items (view_image's
 * image), Chat Completions content parts as Codex sends them (an image as
 * `{type: 'image_url', image_url: {url}}`; Chat Completions has no `original` detail, so none is sent).
 */
function chatContent(result) {
  const parts = (result.contentItems ?? []).flatMap((c) => {
    if (c.item === 'inputText') return [{ type: 'text', text: c.inputText }];
    if (c.item === 'inputImage') return [{ type: 'image_url', image_url: { url: c.inputImage.imageUrl } }];
    return [];
  });
  return parts.length ? parts : result.output;
}

/**
 * OpenAI Responses API: `function_call` / `custom_tool_call` output items → their outputs. Every
 * tool of the session's set goes the same way (exec_command/write_stdin, update_plan, …); an
 * output made of content items (view_image's image) is sent as that array of
 * `input_image`/`input_text` items.
 */
export class ResponsesAdapter {
  /**
   * @param {Session} session
   * @param {{exclude?: string[], onResult?: (call: object, result: import('./client.js').InvokeResult) => void,
   *   onApproval?: (request: object) => string | boolean | Promise<string | boolean>}} [options]
   *   `exclude`: tool names to leave out of tools(); `onResult`: sees each call's success flag;
   *   `onApproval`: decides the session's approval requests (default: deny).
   */
  constructor(session, options = {}) {
    this.session = session;
    this.exclude = options.exclude;
    this.onResult = options.onResult;
    this.onApproval = options.onApproval ?? denyAll;
  }

  async _invoke(name, args, opts) {
    return forModel(opts.callId, async () => settle(this.session, await this.session.invoke(name, args, opts), this.onApproval));
  }

  /** The list for the request's `tools` field. @returns {Promise<object[]>} */
  tools() {
    return this.session.listTools('responses', { exclude: this.exclude });
  }

  /** Whether an output item is a tool call this adapter handles. */
  static isToolCall(item) {
    return item?.type === 'function_call' || item?.type === 'custom_tool_call';
  }

  /**
   * Runs one tool call; returns the input item to send back, or null for any other item.
   * @param {FunctionCall | CustomToolCall | {type: string}} item
   * @returns {Promise<FunctionCallOutput | CustomToolCallOutput | null>}
   */
  async handle(item) {
    if (item?.type === 'function_call') {
      const result = await this._invoke(item.name, item.arguments ?? '{}', { callId: item.call_id });
      this.onResult?.(item, result);
      const items = contentItems(result);
      return { type: 'function_call_output', call_id: item.call_id, output: items.length ? items : result.output };
    }
    if (item?.type === 'custom_tool_call') {
      const result = await this._invoke(item.name, item.input ?? '', { callId: item.call_id, freeform: true });
      this.onResult?.(item, result);
      return { type: 'custom_tool_call_output', call_id: item.call_id, output: result.output };
    }
    return null;
  }

  /**
   * Runs every tool call among a response's output items, in order.
   * @param {Array<{type: string}>} items
   */
  async handleAll(items) {
    const out = [];
    for (const item of items) {
      const r = await this.handle(item);
      if (r) out.push(r);
    }
    return out;
  }
}

/**
 * OpenAI Chat Completions: an assistant message's `tool_calls` → `tool` messages. A message's
 * `content` is the output text, or for an output made of content items (view_image's image) the
 * content parts Codex sends (`{type: 'image_url', image_url: {url: 'data:…'}}`).
 */
export class ChatCompletionsAdapter {
  /**
   * @param {Session} session
   * @param {{exclude?: string[], onResult?: Function, onApproval?: Function}} [options] as for
   *   ResponsesAdapter
   */
  constructor(session, options = {}) {
    this.session = session;
    this.exclude = options.exclude;
    this.onResult = options.onResult;
    this.onApproval = options.onApproval ?? denyAll;
  }

  /** The list for the request's `tools` field (function tools only). @returns {Promise<object[]>} */
  tools() {
    return this.session.listTools('chat', { exclude: this.exclude });
  }

  /**
   * @param {ChatToolCall} toolCall
   * @returns {Promise<ChatToolMessage>}
   */
  async handle(toolCall) {
    const kind = toolCall?.type ?? 'function';
    let invoke;
    if (kind === 'function') {
      const fn = toolCall.function;
      invoke = () => this.session.invoke(fn.name, fn.arguments || '{}', { callId: toolCall.id });
    } else if (kind === 'custom') {
      const { name, input } = toolCall.custom;
      invoke = () => this.session.invoke(name, input ?? '', { callId: toolCall.id, freeform: true });
    } else {
      throw new TypeError(`unsupported tool call type: ${toolCall.type}`);
    }
    const result = await forModel(toolCall.id, async () => settle(this.session, await invoke(), this.onApproval));
    this.onResult?.(toolCall, result);
    return { role: 'tool', tool_call_id: toolCall.id, content: chatContent(result) };
  }

  /**
   * All `tool` messages answering an assistant message (none if it made no tool calls).
   * @param {{tool_calls?: ChatToolCall[]}} message
   * @returns {Promise<ChatToolMessage[]>}
   */
  async handleMessage(message) {
    const out = [];
    for (const call of message?.tool_calls ?? []) out.push(await this.handle(call));
    return out;
  }
}
