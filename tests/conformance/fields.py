"""What a client may find in each answer, and a check that names every difference.

Ollama: the field lists of `api/types.go` (ollama/ollama at its commit of 2026-08-21), written out below: a field
without `omitempty` must be present, one with it may be absent, no other name may appear. OpenAI: the official
`openai` package's response models, which its maintainers generate from OpenAI's API reference: the fields a model
declares (required ones present), the types and literal values it validates strictly, no other name.
"""
from __future__ import annotations

import datetime
import types
import typing
from dataclasses import dataclass
from typing import Any

import pydantic


@dataclass(frozen=True)
class F:
    """One field: its JSON type(s), whether it is always sent, the values it may take, what is inside it."""

    kind: type | tuple[type, ...]
    required: bool = True
    values: frozenset | None = None
    shape: dict[str, "F"] | None = None  # an object's own fields
    items: "F | None" = None  # a list's items


def opt(kind: type | tuple[type, ...], **kw: Any) -> F:
    return F(kind, required=False, **kw)


def check(obj: Any, spec: dict[str, F], where: str = "$") -> list[str]:
    """Every way `obj` differs from `spec`, as readable lines (empty when it conforms)."""
    if not isinstance(obj, dict):
        return [f"{where}: expected an object, got {type(obj).__name__}"]
    problems = [f"{where}.{k}: not a field of this answer" for k in obj if k not in spec]
    for name, field in spec.items():
        if name not in obj:
            problems += [f"{where}.{name}: missing"] if field.required else []
        else:
            problems += check_value(obj[name], field, f"{where}.{name}")
    return problems


def check_value(value: Any, field: F, where: str) -> list[str]:
    kinds = field.kind if isinstance(field.kind, tuple) else (field.kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        return [f"{where}: {value!r} is not {' or '.join(k.__name__ for k in kinds)}"]
    if field.values is not None and value not in field.values:
        return [f"{where}: {value!r} is not one of {sorted(field.values)}"]
    if field.shape is not None and isinstance(value, dict):
        return check(value, field.shape, where)
    if field.items is not None and isinstance(value, list):
        return [p for i, item in enumerate(value) for p in check_value(item, field.items, f"{where}[{i}]")]
    return []


def rfc3339(text: str) -> bool:
    try:
        datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


# -- Ollama, api/types.go -------------------------------------------------------------------------------------------

INT, NUM = int, (int, float)
DONE_REASONS = frozenset({"stop", "length", "load", "unload"})
CAPABILITIES = frozenset({"completion", "tools", "insert", "vision", "embedding", "thinking", "image", "audio"})
TOKEN_LOGPROB = {"token": F(str), "logprob": F(NUM), "bytes": opt(list)}
LOGPROB = {**TOKEN_LOGPROB, "top_logprobs": opt(list, items=F(dict, shape=TOKEN_LOGPROB))}
TOOL_CALL = {"id": opt(str), "function": F(dict, shape={"index": F(INT), "name": F(str), "arguments": F(dict)})}
MESSAGE = {"role": F(str, values=frozenset({"assistant"})), "content": F(str), "thinking": opt(str),
           "images": opt(list), "tool_calls": opt(list, items=F(dict, shape=TOOL_CALL)), "tool_name": opt(str),
           "tool_call_id": opt(str)}
METRICS = {"total_duration": opt(INT), "load_duration": opt(INT), "prompt_eval_count": opt(INT),
           "prompt_eval_duration": opt(INT), "eval_count": opt(INT), "eval_duration": opt(INT)}
_ANSWER = {"model": F(str), "remote_model": opt(str), "remote_host": opt(str), "created_at": F(str),
           "done": F(bool), "done_reason": opt(str, values=DONE_REASONS), "_debug_info": opt(dict),
           "logprobs": opt(list, items=F(dict, shape=LOGPROB)), **METRICS}
CHAT_RESPONSE = {**_ANSWER, "message": F(dict, shape=MESSAGE)}
GENERATE_RESPONSE = {**_ANSWER, "response": F(str), "thinking": opt(str), "context": opt(list, items=F(INT)),
                     "tool_calls": opt(list, items=F(dict, shape=TOOL_CALL))}
DETAILS = {"parent_model": F(str), "format": F(str), "family": F(str), "families": F((list, type(None))),
           "parameter_size": F(str), "quantization_level": F(str), "context_length": opt(INT),
           "embedding_length": opt(INT)}
LIST_MODEL = {"name": F(str), "model": F(str), "remote_model": opt(str), "remote_host": opt(str),
              "modified_at": F(str), "size": F(INT), "digest": F(str), "details": F(dict, shape=DETAILS),
              "capabilities": opt(list, items=F(str, values=CAPABILITIES))}
LIST_RESPONSE = {"models": F(list, items=F(dict, shape=LIST_MODEL))}
PROCESS_MODEL = {"name": F(str), "model": F(str), "size": F(INT), "digest": F(str),
                 "details": F(dict, shape=DETAILS), "expires_at": F(str), "size_vram": F(INT),
                 "context_length": F(INT)}
PROCESS_RESPONSE = {"models": F(list, items=F(dict, shape=PROCESS_MODEL))}
SHOW_RESPONSE = {"license": opt(str), "modelfile": opt(str), "parameters": opt(str), "template": opt(str),
                 "system": opt(str), "renderer": opt(str), "parser": opt(str), "details": opt(dict, shape=DETAILS),
                 "messages": opt(list), "remote_model": opt(str), "remote_host": opt(str), "model_info": F(dict),
                 "projector_info": opt(dict), "tensors": opt(list),
                 "capabilities": opt(list, items=F(str, values=CAPABILITIES)), "modified_at": opt(str),
                 "requires": opt(str)}
EMBED_RESPONSE = {"model": F(str), "embeddings": F(list, items=F(list, items=F(NUM))),
                  "total_duration": opt(INT), "load_duration": opt(INT), "prompt_eval_count": opt(INT)}
EMBEDDING_RESPONSE = {"embedding": F(list, items=F(NUM))}
VERSION_RESPONSE = {"version": F(str)}
ERROR = {"error": F(str)}  # StatusError's `json:"error"`


# -- OpenAI, the `openai` package's models --------------------------------------------------------------------------

# Names OpenAI-compatible servers add and clients read where present: the reasoning text, DeepSeek's name and
# vLLM's and Ollama's; a model's `meta`, llama-server's (crush reads its n_ctx).
EXTENSIONS = {"reasoning_content", "reasoning", "meta"}


def check_openai(obj: Any, model: type[pydantic.BaseModel], where: str = "$") -> list[str]:
    """Names (declared by `model`, or EXTENSIONS), required fields, then the model's strict validation."""
    problems = _names(obj, model, where)
    try:
        model.model_validate(obj, strict=True)
    except pydantic.ValidationError as e:
        problems += [f"{where}.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
    return problems


def _names(obj: Any, model: type[pydantic.BaseModel], where: str) -> list[str]:
    if not isinstance(obj, dict):
        return []  # the validation names it
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    problems = [f"{where}.{k}: not a field of {model.__name__}" for k in obj if k not in fields and
                k not in EXTENSIONS]
    problems += [f"{where}.{k}: missing" for k, f in fields.items() if f.is_required() and k not in obj]
    for name, field in fields.items():
        inner, many = _model_in(field.annotation)
        if inner is None or obj.get(name) is None:
            continue
        values = obj[name] if many and isinstance(obj[name], list) else [obj[name]]
        for i, value in enumerate(values):
            problems += _names(value, inner, f"{where}.{name}" + (f"[{i}]" if many else ""))
    return problems


def _model_in(annotation: Any) -> tuple[type[pydantic.BaseModel] | None, bool]:
    """The pydantic model inside Optional[...] / List[...] annotations, and whether it is a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (list, typing.List) and args:
        inner, _ = _model_in(args[0])
        return inner, True
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _model_in(args[0])
    return None, False
