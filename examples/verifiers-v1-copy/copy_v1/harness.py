"""A one-reply chat harness run in-process (no program to install per rollout): its one model call goes through
the rollout's interception endpoint, as the Harness contract asks."""

import openai

import verifiers.v1 as vf


# One client per interception endpoint, each rollout's secret on a copy of it (verifiers makes a harness per
# episode): making a client builds a TLS context (~20 ms), longer than the tiny model's whole reply.
_clients: dict[str, openai.AsyncOpenAI] = {}


class CopyHarnessConfig(vf.HarnessConfig):
    pass


class CopyHarness(vf.Harness[CopyHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        if endpoint not in _clients:
            _clients[endpoint] = openai.AsyncOpenAI(base_url=endpoint, api_key="unused", max_retries=0)
        client = _clients[endpoint].with_options(api_key=secret)
        reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")
