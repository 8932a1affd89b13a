"""A reward function in TRL's signature (it works unchanged in TRL's GRPOTrainer): 1 when the completion's
first word is the row's `answer`, 0.5 when the answer comes later, else 0."""


def first_word(prompts, completions, answer, **kwargs) -> list[float]:
    out = []
    for completion, want in zip(completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion  # chat or plain rows
        words = text.split()
        out.append(1.0 if words[:1] == [want] else 0.5 if want in words else 0.0)
    return out
