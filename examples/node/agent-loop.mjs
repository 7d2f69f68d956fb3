// A minimal agent loop over corral: the model call is a parameter (any Responses-API-shaped
// function), so this runs against OpenAI, another provider, or a scripted stand-in in tests.
// In your project: import { Client, ResponsesAdapter } from '@corral/client';
import { Client, ResponsesAdapter } from '../../clients/node/src/index.js';

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

// `node agent-loop.mjs "prompt"` with OPENAI_API_KEY set and a daemon running (CORRAL_SOCKET).
if (import.meta.url === `file://${process.argv[1]}`) {
  const callModel = async ({ input, tools }) => {
    const res = await fetch('https://api.openai.com/v1/responses', {
      method: 'POST',
      headers: { authorization: `Bearer ${process.env.OPENAI_API_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: process.env.OPENAI_MODEL ?? 'gpt-5-codex', input, tools }),
    });
    return (await res.json()).output;
  };
  const settings = { cwd: process.cwd(), env: { PATH: process.env.PATH, HOME: process.env.HOME } };
  const transcript = await runAgent({ client: new Client(), settings, prompt: process.argv[2], callModel });
  console.log(transcript.at(-1).content?.[0]?.text ?? transcript.at(-1));
  process.exit(0);
}
