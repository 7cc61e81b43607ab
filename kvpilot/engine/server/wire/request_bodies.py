"""OpenAI-compatible request bodies (pydantic): what the API accepts, and its limits."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Sampling ranges accepted by the API. The engine's own SamplingParams checks its invariants too.
MAX_TEMPERATURE = 2.0
SEED_LIMIT = 2**63


class _Body(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do, so newer clients keep working.
    # Strict: "10" is not an integer and "yes" or 1 is not a boolean (a JSON int is still a float).
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class TextContentPart(_Body):
    type: Literal["text"]
    text: str


class ToolCallFunction(_Body):
    name: str = Field(min_length=1)
    arguments: str = Field(description="The arguments as JSON text (an object), as OpenAI returns them.")


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, description="An assistant turn's tool calls.")
    tool_call_id: str | None = Field(default=None, description="A tool turn: the call it answers.")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


StopField = Annotated[
    str | list[Annotated[str, Field(min_length=1)]] | None,
    Field(description="Sequences where generation stops (not returned); any number (the body limit bounds them)."),
]


class FunctionDefinition(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Letters, digits, _ . - (at most 64).")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="A JSON schema of the arguments object.")
    strict: bool | None = Field(default=None, description="Accepted; arguments always follow the schema when "
                                "tool_choice is 'required' or names the function.")  # fmt: skip


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class SamplingFields(_Body):
    """Fields shared by chat and text completions."""

    # Unknown fields are kept (not validated) so that vLLM extensions this server does not implement
    # can be refused by name (vllm_extensions.py); any other unknown field is still ignored.
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(description="The served model's name, as listed by GET /v1/models.")
    max_tokens: int | None = Field(default=None, ge=1, description="Tokens to generate at most.")
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, description="Extension: -1 or 0 disables.")
    seed: int | None = Field(default=None, ge=0, lt=SEED_LIMIT)
    stop: StopField = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=128, description="Choices per prompt (sampled independently).")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0, description="Extension (HF/vLLM).")
    logit_bias: dict[str, float] | None = Field(default=None, description="Token id (as a string) -> bias in [-100, 100].")
    min_tokens: int | None = Field(default=None, ge=0, description="Extension: no EOS/stop token before this many.")
    ignore_eos: bool = Field(default=False, description="Extension: keep generating past EOS.")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="Extension (vLLM): token ids that end the output (kept in it unless special)."
    )
    user: str | None = None
    # Structured output (server/structured_request.py): at most one of these per request.
    response_format: Any = Field(
        default=None, description='{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}.'
    )
    guided_json: Any = Field(default=None, description="Extension (vLLM): a JSON schema the output follows.")
    guided_regex: Any = Field(default=None, description="Extension (vLLM): a regular expression the output matches.")
    guided_choice: Any = Field(default=None, description="Extension (vLLM): the output is exactly one of these strings.")
    guided_grammar: Any = Field(default=None, description="Extension (vLLM): an EBNF grammar (xgrammar's dialect).")
    structured_outputs: Any = Field(default=None, description="Extension (vLLM): {json|regex|choice|grammar|json_object}.")
    guided_decoding_backend: Any = Field(default=None, description="Extension (vLLM): only 'xgrammar' or 'auto'.")
    guided_whitespace_pattern: Any = Field(default=None, description="Not supported (400).")
    # vLLM extensions this server does not implement: accepted only to be refused with a 400 naming them.
    min_p: float | None = Field(default=None, description="Not supported (400) unless 0.")
    use_beam_search: bool | None = Field(default=None, description="Not supported (400) unless false.")
    prompt_logprobs: int | None = Field(default=None, description="Not supported (400); use echo + logprobs.")

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        if isinstance(self.stop, str):
            return [self.stop] if self.stop else []
        return list(self.stop)

    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="Extension (vLLM): extra variables for the chat template (e.g. enable_thinking)."
    )
    continue_final_message: bool = Field(
        default=False, description="Extension (vLLM): continue the final (assistant) message instead of a new turn."
    )
    add_generation_prompt: bool = Field(
        default=True, description="Extension (vLLM): end the prompt with the template's assistant header."
    )
    parallel_tool_calls: bool | None = Field(default=None, description="false: at most one tool call.")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = Field(default=None, min_length=1, max_length=128)
    tool_choice: Any = Field(default=None, description="'none' | 'auto' | 'required' | {type: function, function: {name}}.")
    # Accepted only to be refused with a 400 naming them (reject_unsupported), never ignored.
    functions: Any = Field(default=None, description="Not supported (400).")
    function_call: Any = Field(default=None, description="Not supported (400).")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
PromptField = (
    str
    | TokenIds
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenIds], Field(min_length=1)]
)


class CompletionRequest(SamplingFields):
    prompt: PromptField = Field(
        description="A string, a list of token ids, or a list of either (one choice per prompt, in order)."
    )
    max_tokens: int | None = Field(default=None, ge=0, description="Tokens to generate at most; 0 only with echo.")
    echo: bool = Field(default=False, description="Return the prompt before the completion (with its logprobs).")
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Log p of each token and this many alternatives.")
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=128)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class ScoreRequest(_Body):
    model: str
    prompt: str = Field(min_length=1, description="Conditioning text; tokenized as given.")
    continuation: str = Field(min_length=1, description="Text whose tokens are scored after the prompt.")
