"""The character-level tokenizer of minigrpo's tiny world.

Every character is one token, so a student can read a token sequence by eye:
``<bos> 3 4 7 + 5 8 6 =`` then the completion ``9 3 3 <eos>``. The vocabulary
is 18 tokens:

    <pad> <bos> <eos>          special: dropped by ``decode(..., skip_special_tokens=True)``
    <think> </think>           added as ordinary (non-special) tokens, so they survive decoding
    0-9 + = ,                  one token per character

Two details matter more than they look:

* ``decoders.Fuse()`` joins tokens with no separator. Without it ``decode`` returns
  ``"9 3 3"`` and every exact-match reward silently scores 0.
* ``<think>``/``</think>`` are *not* special. Rollouts decode with
  ``skip_special_tokens=True`` (to drop pad/eos), and the think task's grader needs
  the tags in the text it reads.

A post-processor puts ``<bos>`` in front of every encoded text (the prompt);
completions are encoded with ``add_special_tokens=False`` and end in ``<eos>``.
Padding is on the left, as generation needs.
"""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from ..tasks.think_addition import THINK_CLOSE, THINK_OPEN

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
CHARACTERS = list("0123456789+=,")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the 18-token character tokenizer (ids: pad 0, bos 1, eos 2, <think> 3, </think> 4)."""
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, THINK_OPEN, THINK_CLOSE] + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    # Split the text into single characters; added tokens such as <think> are matched before this runs.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.add_special_tokens([PAD, BOS, EOS])
    tok.add_tokens([THINK_OPEN, THINK_CLOSE])  # normal tokens: kept by skip_special_tokens=True

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
        model_max_length=512,
    )
