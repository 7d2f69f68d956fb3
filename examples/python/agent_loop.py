"""A minimal coding agent: the model runs elsewhere, corral runs its tool calls.

`model(items) -> output items` is any Responses API model call (scripted in tests). For real, with
a daemon running: python agent_loop.py "task" (OPENAI_API_KEY; OPENAI_BASE_URL for another
OpenAI-compatible endpoint; OPENAI_MODEL). Only the standard library and corral_client.
"""

import json
import os
import sys
import urllib.request

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


def responses_api(tools, env=os.environ):
    """`model` for run(): POST {OPENAI_BASE_URL}/responses (default: OpenAI's)."""
    url = env.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/") + "/responses"
    headers = {"Authorization": f"Bearer {env.get('OPENAI_API_KEY', '')}", "Content-Type": "application/json"}

    def model(items):
        body = {"model": env.get("OPENAI_MODEL", "gpt-5-codex"), "input": items, "tools": tools}
        with urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), headers)) as r:
            return json.load(r)["output"]

    return model


if __name__ == "__main__":
    with Client() as client:  # $CORRAL_SOCKET, else the per-user or the system daemon
        # Commands get the daemon's default environment (HOME, USER, PATH, LANG…), not ours.
        with client.open_session(os.getcwd(), "workspace-write") as session:
            final = run(responses_api(ResponsesAdapter(session).tools()), session, " ".join(sys.argv[1:]))[-1]
            print(json.dumps(final))
