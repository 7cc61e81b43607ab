"""vLLM's request extensions this server does not implement, refused by name instead of being
ignored like other unknown fields: a client that sends one expects it to change the output.
A value equal to what kvpilot does anyway (e.g. skip_special_tokens true) is accepted."""

from __future__ import annotations

from typing import Any

from kvpilot.engine.server.wire.api_error import APIError

# name -> (values that match kvpilot's behaviour, why the others cannot be served)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "include_stop_str_in_output": ((False,), "the stop string is never part of the output"),
    "skip_special_tokens": ((True,), "special tokens are always left out of the text"),
    "spaces_between_special_tokens": ((True,), "the tokenizer's own decoding is used"),
    "truncate_prompt_tokens": ((), "prompts are never truncated: one that does not fit is a 400"),
    "allowed_token_ids": ((), "use logit_bias, or guided_choice / guided_regex to constrain the output"),
    "bad_words": ((), "use logit_bias with -100 on the words' tokens"),
    "logits_processors": ((), "custom logits processors cannot run in this server"),
    "return_tokens_as_token_ids": ((False,), "logprobs name tokens by their text"),
    "length_penalty": ((1, 1.0), "there is no beam search"),
    "early_stopping": ((False,), "there is no beam search"),
    "priority": ((0,), "requests are served first come, first served"),
    "add_special_tokens": ((), "chat prompts are tokenized as the tokenizer's defaults say"),
    "chat_template": ((), "the template is fixed per server: start it with --chat-template FILE"),
    "documents": ((), "chat templates receive messages and tools only"),
    "mm_processor_kwargs": ((), "this server serves text models only"),
    "cache_salt": ((), "the prefix cache is shared by all requests"),
    "kv_transfer_params": ((), "there is no disaggregated prefill"),
    "vllm_xargs": ((), "there are no custom sampling arguments"),
}


def reject_vllm_extensions(extra: dict[str, Any] | None) -> None:
    """A 400 naming the first vLLM extension among the request's unknown fields that would change the output."""
    for name, value in (extra or {}).items():
        rule = REFUSED.get(name)
        if rule is None or value is None:
            continue
        accepted, why = rule
        if any(value is a or (type(value) is type(a) and value == a) for a in accepted):
            continue
        hint = f" (only {accepted[0]!r} is accepted)" if accepted else ""
        raise APIError(400, f"{name}={value!r} is not supported: {why}{hint}; remove {name!r}", param=name,
                       code="unsupported_parameter")  # fmt: skip
