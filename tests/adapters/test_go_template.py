"""The Go template subset Ollama's model templates use, rendered for /api/generate's `template` override."""
import pytest

from adapters import go_template, model_card
from adapters.errors import BadRequest


def test_classic_template_with_system_branch():
    t = "{{ if .System }}<|system|>{{ .System }}\n{{ end }}<|user|>{{ .Prompt }}\n<|assistant|>{{ .Response }}"
    assert go_template.render(t, "hi", "be brief") == "<|system|>be brief\n<|user|>hi\n<|assistant|>"
    assert go_template.render(t, "hi") == "<|user|>hi\n<|assistant|>"


def test_messages_range_trim_markers_and_else_if():
    chatml = model_card.go_template("<|im_start|>", model_card.FIM_STYLES[0])
    assert go_template.render(chatml, "hi", "sys") == \
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert go_template.render(chatml, "def f(", suffix="\n  return 1") == \
        "<|fim_prefix|>def f(<|fim_suffix|>\n  return 1<|fim_middle|>"
    t = "{{- if .Suffix }}S{{ else if eq .Prompt \"x\" }}X{{ else if not .System }}N{{ else }}E{{ end -}}  !"
    assert [go_template.render(t, p, s, x) for p, s, x in [("a", None, "b"), ("x", None, None), ("y", None, None),
                                                           ("y", "s", None)]] == ["S!", "X!", "N!", "E!"]
    gemma = model_card.FAMILIES["gemma"].turns
    assert go_template.render(gemma, "q") == "<start_of_turn>user\nq<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize("template", ["{{ range $i, $m := .Messages }}{{ end }}", "{{ if .System }}never closed",
                                      "{{ json .Prompt }}", "{{ end }}"])
def test_what_it_cannot_render_is_a_400(template):
    with pytest.raises(BadRequest, match="template"):
        go_template.render(template, "x")
