"""Ollama's Go templates of ``/api/generate``'s ``template`` field, for the subset they use
(core/api/ollama_template.py): fields, conditions, trim markers, the cut at ``.Response``,
and a clear refusal for the rest."""

from __future__ import annotations

import pytest

from core.api.ollama_template import TemplateError, render

LLAMA3 = (
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>"
    "{{ end }}{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}"
    "<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}"
    "<|eot_id|>"
)


def test_an_ollama_template_renders_up_to_the_response():
    assert render(LLAMA3, "Be brief.", "Hi") == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render(LLAMA3, "", "Hi").startswith("<|start_header_id|>user")


def test_else_trim_markers_and_comments():
    template = (
        "{{/* a comment */}}{{ if .System }}S={{ .System }}{{ else }}none{{ end }}"
        "\n  {{- .Prompt -}}  \n!"
    )
    assert render(template, "", "p") == "nonep!"
    assert render(template, "x", "p") == "S=xp!"
    assert render("{{ if .System }}{{ if .Prompt }}both{{ end }}{{ end }}", "s", "p") == "both"


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ range .Messages }}{{ .Content }}{{ end }}", "range .Messages"),
        ("{{ .Tools }}", ".Tools"),
        ("{{ if .System }}open", "without its {{ end }}"),
        ("{{ json .Prompt }}", "json .Prompt"),
    ],
)
def test_what_is_not_rendered_is_refused_in_one_line(template, said):
    with pytest.raises(TemplateError) as refused:
        render(template, "s", "p")
    assert said in str(refused.value) and "\n" not in str(refused.value)
