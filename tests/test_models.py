"""Shipped model configs (``diagnose/data/models/``): each one loads offline by name, cites its
model card, and its derived parameter counts match the size the card states.

Parameter counts are derived by hand below from the config values (norms and biases are
not counted: diagnose/accounting.py, domain.md section 2).
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
from click.testing import CliRunner

from diagnose.accounting import (
    load_model_config,
    model_weights,
    read_model_config,
    shipped_model_configs,
)
from diagnose.cli import main

NAMES = ("deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "llama-3.1-8b", "mixtral-8x7b", "qwen1.5-0.5b", "qwen3-0.6b", "qwen3-8b")


def test_the_shipped_set() -> None:
    assert shipped_model_configs() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_each_cites_its_model_card(name: str) -> None:
    raw = json.loads(resources.files("diagnose.data").joinpath("models", f"{name}.json").read_text())
    assert raw["_source"].startswith("https://huggingface.co/") and raw["_source"].endswith("/config.json")
    assert raw["_model_card"].startswith("https://")
    assert raw["_source"].split("/")[3:5] == raw["_name_or_path"].split("/")  # org/name
    _, label = read_model_config(name)
    assert label == raw["_name_or_path"]
    assert load_model_config(name.upper()).name == raw["_name_or_path"]  # names ignore case


def test_llama_3_1_8b() -> None:
    s = load_model_config("llama-3.1-8b")
    # attention 2*4096*4096 + 2*4096*(8*128) = 33,554,432 + 8,388,608 = 41,943,040
    # MLP 3*4096*14336 = 176,160,768; per layer 218,103,808; x32 = 6,979,321,856
    # embedding + LM head 2 * 128256 * 4096 = 1,050,673,152
    assert s.params_total == 6_979_321_856 + 1_050_673_152 == 8_029_995_008
    assert round(s.params_total / 1e9, 2) == 8.03  # model card: 8.03B
    assert s.params_active_per_token == 8_029_995_008 - 525_336_576  # all but the embedding table


def test_qwen3_8b() -> None:
    s = load_model_config("qwen3-8b")
    # attention 41,943,040 (as Llama, head_dim 128); MLP 3*4096*12288 = 150,994,944;
    # per layer 192,937,984; x36 = 6,945,767,424 (card: 6.95B non-embedding)
    # embedding + LM head 2 * 151936 * 4096 = 1,244,659,712
    assert s.params_body == 6_945_767_424
    assert s.params_total == 8_190_427_136
    assert round(s.params_total / 1e9, 1) == 8.2 and round(s.params_body / 1e9, 2) == 6.95  # card
    assert s.layer_windows == ()  # use_sliding_window false


def test_mixtral_8x7b() -> None:
    s = load_model_config("mixtral-8x7b")
    # per layer: attention 41,943,040 + router 4096*8 = 32,768 + 8 experts * 3*4096*14336
    # (8 * 176,160,768 = 1,409,286,144) = 1,451,261,952; x32 = 46,440,382,464;
    # + embedding and LM head 2 * 32000 * 4096 = 262,144,000
    assert s.params_total == 46_440_382_464 + 262_144_000 == 46_702_526_464
    assert round(s.params_total / 1e9, 1) == 46.7  # Mistral: 46.7B total
    # active: 32 * (41,943,040 + 32,768 + 2 * 176,160,768) = 12,617,515,008 + LM head 131,072,000
    assert s.params_active_per_token == 12_748_587_008
    # Mistral's "12.9B per token" also counts the embedding table: + 131,072,000 = 12.88B
    assert round((s.params_active_per_token + 131_072_000) / 1e9, 1) == 12.9


def test_gpt_oss_20b() -> None:
    s = load_model_config("gpt-oss-20b")
    # attention per layer: q 2880*(64*64) = 11,796,480, k and v 2880*(8*64) = 1,474,560 each,
    # o 11,796,480 -> 26,542,080; x24 = 637,009,920
    # experts 32 * 3*2880*2880 = 32 * 24,883,200 = 796,262,400 per layer; x24 = 19,110,297,600
    # routers 2880*32 = 92,160 per layer; x24 = 2,211,840
    # embedding + LM head 2 * 201088 * 2880 = 1,158,266,880
    assert s.params_experts == 19_110_297_600
    assert s.params_total == 637_009_920 + 19_110_297_600 + 2_211_840 + 1_158_266_880 == 20_907_786_240
    # active: 637,009,920 + 2,211,840 + 24 * 4 * 24,883,200 (2,388,787,200) + LM head 579,133,440
    assert s.params_active_per_token == 3_607_142_400
    assert (round(s.params_total / 1e9, 1), round(s.params_active_per_token / 1e9, 1)) == (20.9, 3.6)  # card
    assert s.layer_windows == (128, None) * 12
    w = model_weights(s)
    # stored: experts at 4.25 bit: 19,110,297,600 * 4.25 / 8 = 10,152,345,600 B; the rest bf16:
    # 2 * (637,009,920 + 2,211,840 + 1,158,266,880) = 3,594,977,280 B -> 13.75 GB (the 13.8 GB checkpoint)
    assert w.bytes == 10_152_345_600 + 3_594_977_280 == 13_747_322_880


def test_gpt_oss_120b() -> None:
    s = load_model_config("gpt-oss-120b")
    # attention 26,542,080 * 36 = 955,514,880; experts 128 * 24,883,200 * 36 = 114,661,785,600;
    # routers 2880*128 * 36 = 13,271,040; embedding + LM head 1,158,266,880
    assert s.params_total == 955_514_880 + 114_661_785_600 + 13_271_040 + 1_158_266_880 == 116_788_838_400
    # active: 955,514,880 + 13,271,040 + 36 * 4 * 24,883,200 (3,583,180,800) + 579,133,440
    assert s.params_active_per_token == 5_131_100_160
    assert (round(s.params_total / 1e9, 1), round(s.params_active_per_token / 1e9, 1)) == (116.8, 5.1)  # card


def test_deepseek_v3_and_its_mtp_layer() -> None:
    s = load_model_config("deepseek-v3")
    # MLA per layer: q_a 7168*1536 = 11,010,048; q_b 1536*128*(128+64) = 37,748,736;
    # kv_a 7168*(512+64) = 4,128,768; kv_b 512*128*(128+128) = 16,777,216; o 128*128*7168 =
    # 117,440,512 -> 187,105,280; x61 = 11,413,422,080
    assert s.params_attention_per_layer == 187_105_280
    # 3 dense layers: 3 * 3*7168*18432 = 3 * 396,361,728 = 1,189,085,184
    # 58 MoE layers: 256 experts * 3*7168*2048 (44,040,192) = 11,274,289,152 + 1 shared
    # 44,040,192 + router 7168*256 = 1,835,008 -> 11,320,164,352; x58 = 656,569,532,416
    # embedding + LM head 2 * 129280 * 7168 = 1,853,358,080
    assert (s.num_dense_layers, s.num_moe_layers) == (3, 58)
    assert s.params_total == 11_413_422_080 + 1_189_085_184 + 656_569_532_416 + 1_853_358_080 == 671_025_397_760
    assert round(s.params_total / 1e9) == 671  # card: 671B main model
    # active: 11,413,422,080 + 1,189,085,184 + 58 * (9 * 44,040,192 + 1,835,008) (23,095,410,688)
    # + LM head 926,679,040 = 36,624,596,992 -> 37B on the card (36.6B; 37.6B with the embedding)
    assert s.params_active_per_token == 36_624_596_992
    assert round(s.params_active_per_token / 1e9) == 37
    # MTP (num_nextn_predict_layers = 1): one more MoE layer 187,105,280 + 11,320,164,352 and
    # eh_proj 2*7168*7168 = 102,760,448 -> 11,610,030,080; kept out of params_total (the card's
    # 685B = 671B + 14B MTP module, which also counts its own copy of embedding and head)
    assert s.params_mtp == 11_610_030_080
    w = model_weights(s)
    assert w.weight_format.startswith("fp8 (8 bit) on linear weights")


def test_qwen1_5_0_5b() -> None:
    s = load_model_config("qwen1.5-0.5b")
    # attention 4 * 1024 * 1024 = 4,194,304 (MHA, 16 heads of 64); MLP 3*1024*2816 = 8,650,752;
    # per layer 12,845,056; x24 = 308,281,344; embedding + LM head (untied) 2 * 151936 * 1024 = 311,164,928
    assert s.params_total == 308_281_344 + 311_164_928 == 619_446_272
    assert round(s.params_total / 1e6, -1) == 620.0  # the Hub's safetensors metadata: 620M
    assert s.layer_windows == ()  # use_sliding_window false, although sliding_window is set


def test_run_accepts_a_shipped_name(tmp_path) -> None:
    """`diagnose bounds --model-config NAME` works offline; a wrong name lists the shipped ones."""
    res = CliRunner().invoke(main, ["bounds", "--model-config", "qwen3-8b", "--gpu", "H100-SXM", "--batch", "1",
                                    "--prompt-len", "128", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["model"]["params_total"] == 8_190_427_136
    res = CliRunner().invoke(main, ["bounds", "--model-config", "llama-9", "--gpu", "H100-SXM"])
    assert res.exit_code == 2
    line = res.output.strip()
    assert line.startswith("error: model config not found: llama-9") and "gpt-oss-20b" in line and "\n" not in line
