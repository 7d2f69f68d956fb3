// A minimal agent loop over corral: the model call is a parameter (any Responses-API-shaped
// function), so this runs against OpenAI, another provider, or a scripted stand-in in tests.
// Run it: cd examples/node && npm install && node agent-loop.mjs "task" (npm install links
// @corral/client from ../../clients/node, as `npm install ./clients/node` does in your project).
import { Client, ResponsesAdapter } from '@corral/client';

/** callModel({input, tools}) resolves to the response's `output` items; settings: openSession's. */
export async function runAgent({ client, settings, prompt, callModel, maxTurns = 20 }) {
  const session = await client.openSession({ mode: 'workspace-write', ...settings });
  try {
    const adapter = new ResponsesAdapter(session);
    const tools = await adapter.tools();
    const input = [{ role: 'user', content: prompt }];
    for (let turn = 0; turn < maxTurns; turn++) {
      const output = await callModel({ input, tools });
      input.push(...output);
      const results = await adapter.handleAll(output);
      if (results.length === 0) return input; // no tool calls: the model is done
      input.push(...results);
    }
    throw new Error(`no final answer after ${maxTurns} turns`);
  } finally {
    await session.close();
  }
}

/** callModel for runAgent: POST {OPENAI_BASE_URL}/responses (default: OpenAI's), OPENAI_API_KEY. */
export function responsesApi(env = process.env) {
  const url = `${(env.OPENAI_BASE_URL ?? 'https://api.openai.com/v1').replace(/\/+$/, '')}/responses`;
  return async ({ input, tools }) => {
    const res = await fetch(url, {
      method: 'POST',
      headers: { authorization: `Bearer ${env.OPENAI_API_KEY ?? ''}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: env.OPENAI_MODEL ?? 'gpt-5-codex', input, tools }),
    });
    if (!res.ok) throw new Error(`${url}: ${res.status} ${await res.text()}`);
    return (await res.json()).output;
  };
}

// `node agent-loop.mjs "prompt"` with a daemon running (CORRAL_SOCKET) and OPENAI_API_KEY set
// (OPENAI_BASE_URL for another OpenAI-compatible endpoint, OPENAI_MODEL). Commands get the
// daemon's default environment for you (HOME, USER, PATH, LANG, ...), not this process's.
if (import.meta.url === `file://${process.argv[1]}`) {
  const settings = { cwd: process.cwd() };
  const client = new Client();
  const transcript = await runAgent({ client, settings, prompt: process.argv[2], callModel: responsesApi() });
  console.log(JSON.stringify(transcript.at(-1)));
  client.close();
}
