"""A small byte-level BPE tokenizer trained offline on a fixed built-in text, with a chat template.

Used by the ``tiny-llama`` named model: a tokenizer *different* from Qwen3's (other vocabulary, other special
tokens, other template) so that heterogeneous assignments are tested without any download. Training is
deterministic (same text, same settings) and takes a few milliseconds.
"""

from __future__ import annotations

import functools

__all__ = ["tiny_bpe_tokenizer", "TINY_CHAT_TEMPLATE"]

#: Special tokens of the tiny tokenizer, in id order (ids 0..4).
SPECIAL_TOKENS = ("<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>")

#: Chat template (Phi-style tags): each message is ``<|role|>\ncontent<|end|>\n``.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

_CORPUS = """
You are a careful solver. Solve the math problem step by step and put the final answer in \\boxed{}.
You are a verifier. Check the solution and answer with <verify>correct</verify> or <verify>incorrect</verify>.
Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May? Answer: 48 + 24 = 72. The answer is 72.
Search for information with <search>query</search> and answer with <answer>text</answer>.
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } < > ok yes no
previous: say hello world think step answer question solution correct incorrect verify search information
"""


@functools.lru_cache(maxsize=4)
def tiny_bpe_tokenizer(vocab_size: int = 384):
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, ``vocab_size`` entries) with :data:`TINY_CHAT_TEMPLATE`.

    EOS is ``<|end|>`` (id 1), PAD is ``<|pad|>`` (id 0). Any text round-trips (byte-level alphabet).
    Cached per process: callers must not mutate it.

    Raises:
        ValueError: ``vocab_size`` smaller than the byte alphabet plus the special tokens (261).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {len(alphabet) + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.strip().splitlines() * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|end|>",
        pad_token="<|pad|>",
        additional_special_tokens=list(SPECIAL_TOKENS[2:]),
        chat_template=TINY_CHAT_TEMPLATE,
    )
