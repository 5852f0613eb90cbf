"""Built-in workloads, each citing the source of its dimensions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from distsim.errors import UnknownNameError, suggest
from distsim.models.cnn import inception_v3, resnet50, vgg16, vgg19
from distsim.models.graph import Model
from distsim.models.transformer import decoder_only, encoder_decoder

GPT3 = "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1"


@dataclass(frozen=True)
class ZooEntry:
    build: Callable[[], Model]
    family: str


def _bert_large() -> Model:
    return decoder_only(
        "bert-large",
        24,
        1024,
        16,
        512,
        30522,
        source="Devlin et al. 2019, BERT-Large (L=24, H=1024, A=16); seq 512 as in DistSim/Megatron-LM",
    )


def _bert_exlarge() -> Model:
    return decoder_only(
        "bert-exlarge",
        48,
        1024,
        16,
        512,
        30522,
        source="DistSim (CF'23) Sec. 6: BERT with 48 transformer layers (DAPPLE's BERT-48, 640M)",
    )


def _gpt2_345m() -> Model:
    return decoder_only(
        "gpt2-345m",
        24,
        1024,
        16,
        1024,
        50257,
        source="Radford et al. 2019 GPT-2 medium; Megatron-LM's 345M config (24 x 1024, 16 heads)",
    )


def _t5_base() -> Model:
    return encoder_decoder(
        "t5-base",
        12,
        12,
        768,
        12,
        3072,
        512,
        128,
        32128,
        source="Raffel et al. 2020, T5-base (d_model 768, d_ff 3072, 12 heads, 12+12 layers); "
        "Megatron-LM T5 sequence lengths 512/128",
    )


def _gpt3(name: str, layers: int, h: int, heads: int, note: str = "") -> Callable[[], Model]:
    def build() -> Model:
        return decoder_only(name, layers, h, heads, 2048, 50257, source=GPT3 + note)

    return build


_ZOO: dict[str, ZooEntry] = {
    "bert-large": ZooEntry(_bert_large, "transformer"),
    "bert-exlarge": ZooEntry(_bert_exlarge, "transformer"),
    "gpt2-345m": ZooEntry(_gpt2_345m, "transformer"),
    "t5-base": ZooEntry(_t5_base, "transformer (encoder-decoder)"),
    "gpt3-1.3b": ZooEntry(_gpt3("gpt3-1.3b", 24, 2048, 16), "transformer"),
    "gpt3-6.7b": ZooEntry(_gpt3("gpt3-6.7b", 32, 4096, 32), "transformer"),
    "gpt3-13b": ZooEntry(
        _gpt3("gpt3-13b", 40, 5120, 40, "; d_model 5120 (the table's 5140 is not divisible by its 40 heads)"),
        "transformer",
    ),
    "gpt3-175b": ZooEntry(_gpt3("gpt3-175b", 96, 12288, 96), "transformer"),
    "vgg16": ZooEntry(vgg16, "cnn"),
    "vgg19": ZooEntry(vgg19, "cnn"),
    "resnet50": ZooEntry(resnet50, "cnn"),
    "inception-v3": ZooEntry(inception_v3, "cnn (branching)"),
}
ZOO = MappingProxyType(_ZOO)


def get_model(name: str) -> Model:
    """A zoo model by name (case-insensitive)."""
    entry = ZOO.get(name.lower())
    if entry is None:
        raise UnknownNameError(f"unknown model {name!r}{suggest(name, list(ZOO))}")
    return entry.build()
