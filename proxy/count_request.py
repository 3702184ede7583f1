"""The request a count endpoint (Anthropic's `count_tokens`, the Responses API's `input_tokens`) counts: the prompt
as the pipeline sends it, not as the client wrote it. A preset's system prompt and messages go in (proxy/stages/
resolve.py), and images a model cannot see become notes (proxy/stages/fit.py): a count of an image on llama-server
was its 400 ("does not support vision") where the request itself answered, and the engine's was 13 tokens short."""
from __future__ import annotations

from adapters.protocol import ChatRequest, ModelInfo

from .router import Router, Target
from .stages.fit import as_seen
from .stages.resolve import with_prompt


async def as_sent(router: Router, req: ChatRequest, dialect: str) -> tuple[Target, ModelInfo | None, ChatRequest]:
    """(the backend that answers it, what the backend says of the model, the request as it would go there); the
    404 the request itself would get, wherever Velo can know it without generating (Router.served_info)."""
    preset = router.presets.get(req.model)
    target = await router.resolve(req.model)
    info = await router.served_info(target)
    if preset is not None:
        req = with_prompt(req, preset)  # type: ignore[assignment]
    if info is not None:
        req = as_seen(req, info, target.backend, dialect)  # type: ignore[assignment]
    return target, info, req
