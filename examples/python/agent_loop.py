"""A minimal coding agent: the model runs elsewhere, corral runs its tool calls.

`model(items) -> output items` is any Responses API model call (scripted in tests).
For real: pip install ./clients/python openai; python agent_loop.py "task"
"""

import os
import sys

from corral_client import Client, ResponsesAdapter


def run(model, session, prompt, max_turns=50):
    """Calls the model until it answers without tool calls; returns the transcript."""
    adapter = ResponsesAdapter(session)
    items = [{"role": "user", "content": prompt}]
    for _ in range(max_turns):
        output = list(model(items))
        items += output
        results = adapter.handle_all(output)  # one *_output item per tool call
        if not results:
            return items
        items += results
    raise RuntimeError(f"no final answer after {max_turns} turns")


if __name__ == "__main__":
    from openai import OpenAI

    api, env = OpenAI(), {k: os.environ[k] for k in ("PATH", "HOME")}
    MODEL = os.environ.get("MODEL", "gpt-5-codex")
    with Client(os.environ.get("CORRAL_SOCKET")) as client:
        with client.open_session(os.getcwd(), "workspace-write", env=env) as session:
            tools = ResponsesAdapter(session).tools()

            def model(items):
                resp = api.responses.create(model=MODEL, input=items, tools=tools)
                return resp.output

            print(run(model, session, " ".join(sys.argv[1:]))[-1])
