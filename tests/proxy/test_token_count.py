"""The estimate that spares a backend its exact count: "surely under" only where no prompt of that size could not be."""
from adapters.protocol import ChatRequest, CompletionRequest, Message
from proxy.token_count import estimate, surely_under

PNG = "iVBORw0KGgo="


def test_an_image_counts_as_the_most_tokens_a_vision_model_gives_one():
    """A short question and a screenshot was "surely under" a window of 4,096 by its text alone; Qwen2-VL reads one
    image as up to 16,384 tokens."""
    question = Message(role="user", content="what is on this screen?")
    assert surely_under(ChatRequest(model="m", messages=[question]), 4096)
    seen = Message(role="user", content=question.content, images=[PNG])
    assert not surely_under(ChatRequest(model="m", messages=[seen]), 4096)
    assert not surely_under(ChatRequest(model="m", messages=[seen, seen]), 32768)
    assert surely_under(ChatRequest(model="m", messages=[seen]), 32768)
    assert not surely_under(CompletionRequest(model="m", prompt="what is this?", images=[PNG]), 4096)


def test_an_estimate_counts_an_image_as_ollama_does():
    """A server that cannot count (SGLang, LM Studio) gets the estimate: a question and a screenshot were its 6
    tokens of text, under any window."""
    question = Message(role="user", content="what is on this screen?")
    seen = Message(role="user", content=question.content, images=[PNG, PNG])
    assert estimate(ChatRequest(model="m", messages=[seen])) == estimate(ChatRequest(model="m", messages=[question])) \
        + 2 * 768 == 6 + 2 * 768
    assert estimate(CompletionRequest(model="m", prompt="what is this?", images=[PNG])) == 4 + 768


def test_an_estimate_counts_a_raw_prompts_images_once_per_tag():
    """A raw prompt's images are read where its "[img-N]" tags are, as Ollama's runner reads them (a tag used twice,
    its image twice; one no tag names, not at all), and a tag is no text: the estimate counted each image once, and
    the tags as characters."""
    tagged = CompletionRequest(model="m", prompt="[img-0] and [img-0]: same?", images=[PNG, PNG], raw=True)
    assert estimate(tagged) == len(" and : same?") // 4 + 2 * 768
    assert estimate(CompletionRequest(model="m", prompt="same?", images=[PNG], raw=True)) == 2
    assert estimate(CompletionRequest(model="m", prompt="[img-0] same?", raw=True)) == 4
