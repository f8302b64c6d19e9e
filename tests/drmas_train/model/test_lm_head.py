"""Chunked LM-head log-probs and the lean forward paths equal the plain full-vocabulary computation."""

from __future__ import annotations

import pytest
import torch

from drmas_train.model.lm_head import chunked_token_logprobs, default_chunk
from drmas_train.model.logprobs import can_share_prompts, forward_logprobs, split_lm_head
from drmas_train.model.models import load_model


def _plain(hidden, weight, bias, targets, temperature):
    z = (hidden @ weight.T + (bias if bias is not None else 0)) / temperature  # (N, V)
    lp = torch.log_softmax(z, dim=-1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("with_bias", [False, True])
def test_gradcheck_float64_logprob_and_entropy(with_bias):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 11, (7,), generator=g)

    def f(h, w, *b):
        lp, ent = chunked_token_logprobs(h, w, targets, bias=b[0] if b else None, temperature=0.7, chunk=3,
                                         with_entropy=True)  # fmt: skip
        return lp, ent

    inputs = (hidden, weight, bias) if with_bias else (hidden, weight)
    assert torch.autograd.gradcheck(f, inputs)
    lp, ent = f(*inputs)
    ref_lp, ref_ent = _plain(hidden, weight, bias, targets, 0.7)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)


def test_float32_values_and_grads_match_plain_and_entropy_grad_is_optional():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(50, 16, generator=g, requires_grad=True)
    weight = torch.randn(300, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 300, (50,), generator=g)
    upstream = torch.randn(50, generator=g)
    grads = []
    for chunked in (True, False):
        hidden.grad = weight.grad = None
        if chunked:
            lp, ent = chunked_token_logprobs(hidden, weight, targets, temperature=1.3, chunk=8, with_entropy=True)
        else:
            lp, ent = _plain(hidden, weight, None, targets, 1.3)
        (lp * upstream).sum().backward()  # entropy not in the loss: no gradient through it
        grads.append((lp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    lp, ent = chunked_token_logprobs(hidden.detach(), weight.detach(), targets)
    assert ent is None and lp.shape == (50,) and (lp <= 0).all()


def test_errors_and_default_chunk():
    h, w = torch.zeros(3, 4), torch.zeros(10, 4)
    with pytest.raises(ValueError, match=r"need hidden \(N, H\)"):
        chunked_token_logprobs(h, w, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        chunked_token_logprobs(h, w, torch.zeros(3, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_token_logprobs(h, w, torch.zeros(3, dtype=torch.long), chunk=0)
    assert default_chunk(49152) == 170 and default_chunk(10**9) == 16


def _batch(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    p1, p2 = torch.randint(5, vocab, (7,), generator=g).tolist(), torch.randint(5, vocab, (4,), generator=g).tolist()
    prompts = [p1, p1, p2, p1, p2, [3, 9]]  # a group of three, a group of two, a single row
    responses = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (5, 3, 0, 6, 2, 4)]
    return prompts, responses


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
def test_chunked_and_shared_prompt_paths_equal_plain(name):
    """Values and gradients of the chunked and shared-prompt paths = the plain path, to float32 rounding."""
    model = load_model(name).model
    prompts, responses = _batch(model)
    results = {}
    for mode in ("plain", "chunked", "shared"):
        model.zero_grad(set_to_none=True)
        lp, mask, ent = forward_logprobs(
            model, prompts, responses, pad_token_id=0, temperature=0.7, with_entropy=True,
            lm_head_chunk=0 if mode == "plain" else 3, share_prompts=mode == "shared",
        )  # fmt: skip
        weights = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)
        ((lp * weights).sum() + 0.3 * ent.sum()).backward()  # entropy with gradient too
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results[mode] = (lp.detach(), mask, ent.detach(), grads)
    plain = results["plain"]
    assert plain[1].sum() == 20 and plain[1][2].sum() == 0  # the empty response has no token
    for mode in ("chunked", "shared"):
        lp, mask, ent, grads = results[mode]
        torch.testing.assert_close(mask, plain[1], rtol=0, atol=0)
        torch.testing.assert_close(lp, plain[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent, plain[2], rtol=1e-5, atol=1e-5)
        scale = plain[3].abs().max()
        torch.testing.assert_close(grads / scale, plain[3] / scale, rtol=0, atol=1e-5)
        assert (lp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()


def test_shared_path_computes_each_prompt_once():
    """The shared path feeds U distinct prefixes + B one-token-longer suffixes, not B whole prompts."""
    model = load_model("tiny-llama").model
    prompts, responses = _batch(model)
    decoder, _ = split_lm_head(model)
    seen = []
    hook = decoder.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        with torch.no_grad():
            forward_logprobs(model, prompts, responses, pad_token_id=0, lm_head_chunk=None, share_prompts=True)
    finally:
        hook.remove()
    assert seen == [(3, 6), (6, 6)]  # 3 distinct prompts minus their last token (longest 6); 6 rows x T = 6


def test_entropy_without_grad_and_fallbacks():
    model = load_model("tiny-llama").model
    prompts, responses = _batch(model)
    for chunk in (0, None):
        lp, _, ent = forward_logprobs(model, prompts, responses, pad_token_id=0, with_entropy=True,
                                      entropy_grad=False, lm_head_chunk=chunk)  # fmt: skip
        assert lp.requires_grad and not ent.requires_grad
    with pytest.raises(ValueError, match="lm_head_chunk must be >= 0"):
        forward_logprobs(model, prompts, responses, pad_token_id=0, lm_head_chunk=-1)
    assert can_share_prompts(model) and not can_share_prompts(model, lm_head_chunk=0)
    model.config.final_logit_softcapping = 30.0  # logits are not lm_head(h): the plain path
    assert split_lm_head(model) is None and not can_share_prompts(model)
