"""A copy task written as an agent, in the `openai` client's own terms: two model calls per episode (the first
two symbols, then, after the user says "next", the last two), scored by the fraction of the four right.
Nothing here knows streamrl: `client` is any openai.OpenAI."""


def copy_agent(client, row: dict) -> float:
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    said = first.choices[0].message.content
    messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "next"}]
    second = client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
    words = said.split()[:2] + second.choices[0].message.content.split()[:2]
    target = row["target"].split()
    return sum(a == b for a, b in zip(words, target)) / len(target)
