"""Structured output: grammars (JSON schema, regex, choice, EBNF) compiled by xgrammar and applied
to the logits as a per-step token bitmask, one grammar matcher per sequence."""
