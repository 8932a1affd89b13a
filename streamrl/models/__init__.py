"""Models and sampling: building the policy and tokenizer, the tiny plain-torch default, prompts through the chat template, sampling with log-probs."""
