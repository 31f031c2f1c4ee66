"""GPT model: preset shapes and analytic parameter counts (big presets on the meta device), causality, ALiBi,
weight tying (initialisation: test_gpt_init.py), the Composer loss/metrics and the FSDP wrapping policy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from composer.distributed.fsdp2_utils import generate_composer_model_policy

from composer_qsdp.recipes.models import GPT, ComposerGPT, GPTBlock, GPTConfig, gpt_config
from composer_qsdp.recipes.models.alibi import alibi_slopes, causal_alibi_bias


def analytic_param_count(c: GPTConfig) -> int:
    """Parameters of a GPT-2-style model, counted by hand from its shape."""
    v, d, f = c.padded_vocab_size, c.d_model, c.mlp_ratio * c.d_model
    embeddings = v * d + (c.max_seq_len * d if c.position_embedding == "learned" else 0)
    head = 0 if c.tie_word_embeddings else v * d
    block = (2 * 2 * d            # two LayerNorms (weight + bias)
             + d * 3 * d + 3 * d  # fused q/k/v projection
             + d * d + d          # attention output projection
             + d * f + f          # MLP in
             + f * d + d)         # MLP out
    return embeddings + c.n_layers * block + 2 * d + head


@pytest.mark.parametrize("preset, d_model, n_layers, n_heads, nominal", [
    ("125m", 768, 12, 12, 125e6),
    ("350m", 1024, 24, 16, 350e6),
    ("1.3b", 2048, 24, 16, 1.3e9),
])
def test_paper_presets_on_meta_device(preset, d_model, n_layers, n_heads, nominal):
    config = gpt_config(preset)
    assert (config.d_model, config.n_layers, config.n_heads) == (d_model, n_layers, n_heads)
    assert config.max_seq_len == 2048 and config.vocab_size == 50257
    assert config.padded_vocab_size == 50304 and config.padded_vocab_size % 64 == 0
    with torch.device("meta"):
        model = GPT(config)
    params = list(model.parameters())
    assert all(p.is_meta for p in params)  # nothing was allocated
    count = sum(p.numel() for p in params)
    assert count == analytic_param_count(config)
    assert abs(count - nominal) / nominal < 0.05, f"{preset}: {count / 1e6:.1f}M parameters"
    assert len(model.blocks) == n_layers


@pytest.mark.parametrize("overrides", [
    {},
    {"tie_word_embeddings": False},
    {"position_embedding": "alibi", "n_heads": 2},
    {"vocab_size": 1000, "pad_vocab_to_multiple": 1, "mlp_ratio": 2},
])
def test_param_count_and_logits_shape(overrides):
    config = gpt_config("tiny", **overrides)
    model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == analytic_param_count(config)
    tokens = torch.randint(0, config.vocab_size, (3, 17))
    assert model(tokens).shape == (3, 17, config.padded_vocab_size)


@pytest.mark.parametrize("position_embedding", ["learned", "alibi"])
def test_causal_future_tokens_do_not_change_the_past(position_embedding):
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", position_embedding=position_embedding, vocab_size=300, pad_vocab_to_multiple=1))
    tokens = torch.randint(0, 300, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = torch.randint(0, 300, (2, 8))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_alibi_slopes_match_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    # 12 heads: the 8-head slopes, then the odd-indexed slopes of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    expected = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))
    with pytest.raises(ValueError, match="n_heads=0"):
        alibi_slopes(0)


def test_alibi_attention_equals_explicit_softmax():
    torch.manual_seed(0)
    config = gpt_config("tiny", position_embedding="alibi")
    block = GPTBlock(config)
    attn = block.attn
    x = torch.randn(2, 9, config.d_model)
    slopes = alibi_slopes(config.n_heads)
    out = attn(x, causal_alibi_bias(slopes, 9, x.dtype))

    h, hd = config.n_heads, config.head_dim
    q, k, v = attn.qkv(x).view(2, 9, 3, h, hd).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    i = torch.arange(9)[:, None]
    j = torch.arange(9)[None, :]
    scores = scores - slopes[:, None, None] * (i - j)
    scores = scores.masked_fill(j > i, float("-inf"))
    expected = attn.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, config.d_model))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_tied_head_shares_the_embedding():
    model = GPT(gpt_config("tiny"))
    assert model.lm_head is None
    tokens = torch.randint(0, 50257, (1, 8))
    model(tokens)[0, -1].sum().backward()
    # The head's gradient reaches every row of the shared matrix, not only the 8 embedded tokens.
    assert torch.count_nonzero(model.wte.weight.grad.abs().sum(1)) == model.config.padded_vocab_size
    untied = GPT(gpt_config("tiny", tie_word_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.wte.weight.data_ptr()


def test_sequence_longer_than_context_is_rejected():
    model = GPT(gpt_config("tiny"))
    with pytest.raises(ValueError, match="max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_composer_loss_and_metrics_match_shifted_cross_entropy():
    torch.manual_seed(0)
    model = ComposerGPT(gpt_config("tiny"))
    batch = torch.randint(0, 50257, (2, 16))
    logits = model(batch)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    torch.testing.assert_close(model.loss(logits, batch), expected)
    assert abs(expected.item() - math.log(50304)) < 0.1  # std-0.02 init: close to a uniform guess
    metrics = model.get_metrics(is_train=False)
    for metric in metrics.values():
        model.update_metric(batch, model.eval_forward(batch, logits), metric)
    torch.testing.assert_close(metrics["LanguageCrossEntropy"].compute(), expected)
    torch.testing.assert_close(metrics["LanguagePerplexity"].compute(), expected.exp())


def test_composer_fsdp_policy_shards_the_network_and_each_block():
    model = ComposerGPT(gpt_config("tiny", n_layers=3))
    policy = generate_composer_model_policy(model)
    wrapped = [m for m in model.modules() if policy._lambda_fn(m)]
    assert wrapped[0] is model.model
    assert wrapped[1:] == list(model.model.blocks)


@pytest.mark.parametrize("kwargs, match", [
    ({"preset": "2.7b"}, "unknown GPT preset '2.7b'"),
    ({"preset": "tiny", "n_heads": 3}, "n_heads=3 does not divide d_model=64"),
    ({"preset": "tiny", "position_embedding": "rope"}, "position_embedding='rope'"),
    ({"preset": "tiny", "d_modle": 8}, "unknown GPT config field"),
    ({"preset": "tiny", "d_model": 0}, "d_model=0"),
    ({"preset": "tiny", "init_std": -1.0}, "init_std=-1.0"),
    ({"d_model": 64}, "needs n_layers, n_heads"),
])
def test_bad_config_raises_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpt_config(**kwargs)



# ------------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("position_embedding", ["learned", "alibi"])
def test_cuda_logits_match_cpu(position_embedding):
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", position_embedding=position_embedding))
    tokens = torch.randint(0, 50257, (2, 64))
    with torch.no_grad():
        expected = model(tokens)
        # fp32 on the GPU may use TF32 matmuls: compare at that precision.
        got = model.cuda()(tokens.cuda()).cpu()
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("position_embedding", ["learned", "alibi"])
def test_paper_125m_trains_a_step_in_bf16_autocast(position_embedding):
    torch.manual_seed(0)
    model = ComposerGPT(gpt_config("125m", position_embedding=position_embedding)).cuda()
    batch = torch.randint(0, 50257, (2, 2048), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(model(batch), batch)
    loss.backward()
    assert abs(loss.item() - math.log(50304)) < 0.2
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
