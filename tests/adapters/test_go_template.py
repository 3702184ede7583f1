"""The Go template subset Ollama's model templates use, rendered for /api/generate's `template` override."""
import time

import pytest

from adapters import go_template, model_card
from adapters.errors import BadRequest
from engine.fim import FIM_MARKERS


def test_classic_template_with_system_branch():
    t = "{{ if .System }}<|system|>{{ .System }}\n{{ end }}<|user|>{{ .Prompt }}\n<|assistant|>{{ .Response }}"
    assert go_template.render(t, "hi", "be brief") == "<|system|>be brief\n<|user|>hi\n<|assistant|>"
    assert go_template.render(t, "hi") == "<|user|>hi\n<|assistant|>"


def test_messages_range_trim_markers_and_else_if():
    chatml = model_card.go_template("<|im_start|>", FIM_MARKERS[0])
    assert go_template.render(chatml, "hi", "sys") == \
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert go_template.render(chatml, "def f(", suffix="\n  return 1") == \
        "<|fim_prefix|>def f(<|fim_suffix|>\n  return 1<|fim_middle|>"
    t = "{{- if .Suffix }}S{{ else if eq .Prompt \"x\" }}X{{ else if not .System }}N{{ else }}E{{ end -}}  !"
    assert [go_template.render(t, p, s, x) for p, s, x in [("a", None, "b"), ("x", None, None), ("y", None, None),
                                                           ("y", "s", None)]] == ["S!", "X!", "N!", "E!"]
    gemma = model_card.FAMILIES["gemma"].turns
    assert go_template.render(gemma, "q") == "<start_of_turn>user\nq<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize("template", ["{{ template \"x\" }}", "{{ if .System }}never closed",
                                      "{{ .Prompt | nosuchfunc }}", "{{ end }}", "{{ break }}", "{{ $undeclared }}",
                                      "{{ len 3 }}",
                                      # a ValueError and an AttributeError: 500s
                                      '{{ if eq .Prompt "x }}X{{ end }}', "{{ range .Prompt }}{{ end }}"])
def test_what_it_cannot_render_is_a_400(template):
    with pytest.raises(BadRequest, match="template"):
        go_template.render(template, "x")


def test_a_legacy_template_ends_where_the_answer_begins():
    """Ollama deletes what follows {{ .Response }} in a template without .Messages (template.go): rendered whole,
    the assistant's turn was closed before the model wrote it."""
    legacy = ("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n"
              "{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n")
    assert go_template.render(legacy, "Hi", "Be brief") == \
        "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("template, expected", [
    ("{{ range .Messages }}{{ if eq .Role `user` }}U:{{ .Content }}{{ end }}{{ end }}", "U:a\nb"),  # a raw string
    ('{{ if eq .Prompt "a\\nb" }}match{{ end }}', "match"),  # Go's escapes
    ("{{/* a comment */}}{{ if\n.Prompt }}P{{ end }}", "P"),
    ("A\u00a0{{- .Prompt }}", "A\u00a0a\nb"),  # Go trims ASCII white space only
])
def test_eq_compares_what_go_compares(template, expected):
    """`eq` compared against its second word's text: a raw string, an escape or a field never matched."""
    assert go_template.render(template, "a\nb", "sys") == expected
    fields = "{{ range .Messages }}{{ if eq .Role $.Prompt }}same{{ else }}diff{{ end }}{{ end }}"
    assert go_template.render(fields, "user", "sys") == "diffsame"


def test_a_fill_in_the_middle_prompt_has_no_system_prompt():
    """As Ollama fills one in (its suffix path passes no System)."""
    assert go_template.render("{{ if .System }}SYS {{ end }}<PRE>{{ .Prompt }}<SUF>{{ .Suffix }}<MID>", "a", "sys",
                              "b") == "<PRE>a<SUF>b<MID>"


def test_ollamas_own_templates_render_as_ollama_renders_them():
    """Variables, printf, `range $i, $_ :=`, continue, slice and len, and/or, with, json: Ollama's shipped templates
    (alpaca, llama2-chat, gemma3, falcon, mistral, command-r) use them, and each was a 400."""
    alpaca_like = (
        '{{- $system := "" }}{{- range .Messages }}{{- if eq .Role "system" }}'
        '{{- if not $system }}{{ $system = .Content }}{{- else }}{{ $system = printf "%s\\n\\n%s" $system .Content }}'
        '{{- end }}{{- else if eq .Role "user" }}{{- if $system }}{{ $system }}\n\n{{ $system = "" }}{{- end }}'
        '### Instruction:\n{{ .Content }}\n\n{{ end }}{{- end }}### Response:\n')
    assert go_template.render(alpaca_like, "Hi", "Be brief") == "Be brief\n\n### Instruction:\nHi\n\n### Response:\n"
    gemma3_like = ('{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}'
                   '{{- if eq .Role "user" }}<u>{{ if and (eq $i 1) $.System }}{{ $.System }} {{ end }}{{ .Content }}'
                   '{{ end }}{{- if $last }}<m>{{ end }}{{- end }}')
    assert go_template.render(gemma3_like, "Hi", "Sys") == "<u>Sys Hi<m>"
    assert go_template.render(gemma3_like, "Hi") == "<u>Hi<m>"
    falcon_like = '{{- range .Messages }}{{- if eq .Role "system" }}S{{ continue }}{{ end }}[{{ .Content }}]{{ end }}'
    assert go_template.render(falcon_like, "Hi", "Sys") == "S[Hi]"
    assert go_template.render("{{ with .System }}<{{ . }}>{{ else }}none{{ end }}{{ .Prompt | json }}", "a\"b", "S") \
        == '<S>"a\\"b"'
    assert go_template.render("{{ range $i, $m := .Messages }}{{ if gt $i 0 }}{{ break }}{{ end }}{{ $m.Role }}"
                              "{{ end }}{{ or .Suffix \"none\" }}", "x", "s") == "systemnone"


def test_a_literals_spaces_and_a_comments_braces_are_read_as_go_reads_them():
    """`else if` was read with its spaces squeezed, inside literals too; a comment holding "}}" ended there."""
    t = '{{ if eq .System "x" }}x{{ else if eq .System "a  b" }}yes{{ else }}no{{ end }}'
    assert go_template.render(t, "p", "a  b") == "yes"
    assert go_template.render("{{/* use {{ .Prompt }} */}}P={{ .Prompt }}", "p") == "P=p"


@pytest.mark.parametrize("template, expected", [
    ("{{ if $x := .Prompt }}[{{ $x }}]{{ end }}", "[p]"),  # a variable an if declares: "undefined" before
    ("{{ with $x := .Prompt }}[{{ $x }}]{{ end }}", "[p]"),
    ("{{ or .Prompt (index .Messages 5) }}", "p"),  # Go's short circuit: the out-of-range index is never read
    ('{{ print 1 2 }}|{{ print "a" 1 2 "b" }}', "1 2|a1 2b"),  # Go's Sprint spacing
    ("{{ 1.0 }} {{ .5 }}", "1 0.5"),  # numbers as Go prints them
    ('{{ printf "%q" "é" }}', '"é"'),
])
def test_go_semantics_the_review_found_missing(template, expected):
    assert go_template.render(template, "p") == expected


@pytest.mark.parametrize("template", [
    "{{" + "(" * 2000 + "1" + ")" * 2000 + "}}",  # a RecursionError: a 500
    "{{ if .Prompt }}" * 2000 + "{{ end }}" * 2000,
    '{{ printf "%.2f" 1.5 }}', '{{ printf "%x" 255 }}',  # verbs it would render otherwise than Go: its %.2f stayed
    "{{ eq 1 }}", "{{ index .Messages -1 }}",
    "{{ .Prompt " * 5000,  # unclosed: 40 KB of these took the lexer 27 s, the event loop held
])
def test_what_it_cannot_render_as_go_does_is_a_400(template):
    with pytest.raises(BadRequest, match="template"):
        go_template.render(template, "p")


@pytest.mark.parametrize("template", [
    "{{ range $.Messages }}" * 30 + "{{ .Content }}" + "{{ end }}" * 30,  # 2**30 passes over a system and a prompt
    "{{ range $.Messages }}" * 60 + "{{ end }}" * 60,  # as many, writing nothing
    "{{ $x := .Prompt }}" + "{{ range $.Messages }}" * 40 + "{{ $x = print $x $x }}" + "{{ end }}" * 40,  # doubling
    "{{ .Prompt }}" * 20_000,  # a 220 KB template writing a 100 KB prompt 20,000 times: 2 GB
    "{{ print" + " $.Messages" * 20_000 + " }}",
])
def test_a_render_that_would_not_end_or_not_fit_in_memory_is_a_400_at_once(template):
    """Each was rendered to its end, on the event loop for llama-server and OpenAI-compatible servers: the first, a
    0.9 KB /api/generate body, held every other request for hours and took the machine's memory."""
    started = time.monotonic()
    with pytest.raises(BadRequest, match="template: (renders too much text|runs more than)"):
        go_template.render(template, "p" * 100_000, "sys")
    assert time.monotonic() - started < 2


def test_a_long_prompt_through_a_real_template_renders_whole():
    chatml = model_card.go_template("<|im_start|>", FIM_MARKERS[0])
    prompt = "word " * 2_000_000
    assert prompt in go_template.render(chatml, prompt, "sys " * 100_000)
