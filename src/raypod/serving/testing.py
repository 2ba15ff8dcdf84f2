"""Small Llama-shaped models with random weights, built locally (no download): for tests, benchmarks and demos.

``tiny`` is a few MB and answers in milliseconds; ``110m`` is the ~110M-parameter model of the KV-cache baselines
(12 layers x 768, 73.7 MB of KV per 1k tokens in fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
    "small": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4},
    "110m": {"hidden_size": 768, "intermediate_size": 2880, "num_hidden_layers": 12, "num_attention_heads": 12},
}
VOCAB_SIZE = 1024  # the tokenizer's: every id the model can produce decodes to text
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = (
    "the quick brown fox jumps over the lazy dog. a cluster of nodes runs tasks and actors; "
    "training needs checkpoints, serving needs a cache of keys and values. "
)


def build_llama(directory: Path, size: str = "tiny", seed: int = 0, max_context: int = 8192) -> Path:
    """A model directory as Hugging Face writes one: config.json, model.safetensors and a byte-level tokenizer
    whose ids all fall inside the model's vocabulary."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=max_context
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    shape = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(fast),
        num_key_value_heads=shape["num_attention_heads"],
        max_position_embeddings=max_context,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **shape,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()  # type: ignore[no-untyped-call]
    model.save_pretrained(directory, safe_serialization=True)

    return directory
