"""A character-level ChatML tokenizer built locally, for tests and CPU debugging.

Ids are fixed by construction (no training, no downloads):

====  =================  ==========================================
id    token              role
====  =================  ==========================================
0     ``<|endoftext|>``  bos and unk
1     ``<|im_start|>``   starts a chat turn
2     ``<|im_end|>``     eos and pad
3     ``"\\n"``
4-98  printable ASCII    ``" "`` (32) to ``"~"`` (126), in code order
====  =================  ==========================================
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

__all__ = ["CHATML_TEMPLATE", "build_tiny_tokenizer"]

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then the assistant header."""


def _vocab() -> dict[str, int]:
    """Special tokens, newline, then printable ASCII: 99 entries, fixed ids."""
    symbols = [*_SPECIAL_TOKENS, "\n", *(chr(code) for code in range(32, 127))]
    return {symbol: i for i, symbol in enumerate(symbols)}


def build_tiny_tokenizer(model_max_length: int = 4096) -> PreTrainedTokenizerFast:
    """A deterministic character-level tokenizer with ChatML special tokens and template.

    Characters outside printable ASCII and newline map to ``<|endoftext|>`` (unk).
    """
    backend = Tokenizer(models.BPE(vocab=_vocab(), merges=[], unk_token=ENDOFTEXT))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS]
    )
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=ENDOFTEXT,
        unk_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=IM_END,
        additional_special_tokens=[IM_START],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
