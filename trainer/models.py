"""The policy model and its tokenizer: a HF checkpoint, or one built locally with no download.

``cfg.model`` is one of

* ``"tiny-random"``: a 2-layer, 64-wide Qwen2 with tied embeddings, initialised from
  ``cfg.seed``, with a tokenizer made here by the ``tokenizers`` library: the synthetic
  task's word vocabulary when ``cfg.dataset == "synthetic"`` (a random policy must hit
  the answer often enough for GRPO groups to carry signal, which a byte vocabulary does
  not), else byte-level, so that GSM8K text round-trips;
* ``"random:<shape>"``: a random-init model of a real architecture's shape (see
  :data:`RANDOM_SHAPES`) with a byte-level tokenizer padded to that vocabulary, for
  throughput benchmarks without a download, built and initialised on the run's device;
* anything else: a local path or hub name for ``AutoModelForCausalLM``;
  ``local_files_only`` is set when ``HF_HUB_OFFLINE`` is.

Every tokenizer returned is a ``PreTrainedTokenizerFast`` with pad and eos tokens and
left padding (generation appends on the right).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from trainer.config import ConfigError, TrainerConfig
from trainer.shapes import RANDOM_PREFIX, RANDOM_SHAPES, TINY_MODEL, TINY_SHAPE
from trainer.tasks import SYNTHETIC_WORDS

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"

_ARCHITECTURES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
}


def load_model_and_tokenizer(
    cfg: TrainerConfig,
    *,
    device: Union[str, torch.device],
    dtype: Union[str, torch.dtype],
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """The policy (in train mode, on ``device`` in ``dtype``) and its tokenizer."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if cfg.model == TINY_MODEL:
        tokenizer = builtin_tokenizer(cfg)
        model = random_model(TINY_SHAPE, tokenizer, seed=cfg.seed, vocab_size=len(tokenizer))
    elif cfg.model.startswith(RANDOM_PREFIX):
        name = cfg.model[len(RANDOM_PREFIX):]
        if name not in RANDOM_SHAPES:
            known = ", ".join(RANDOM_PREFIX + n for n in RANDOM_SHAPES)
            raise ConfigError(f"model: unknown random shape {cfg.model!r}; known: {known}")
        shape = RANDOM_SHAPES[name]
        tokenizer = builtin_tokenizer(cfg, vocab_size=shape["vocab_size"])
        model = random_model(shape, tokenizer, seed=cfg.seed, device=device,
                             vocab_size=len(tokenizer) if cfg.dataset == "synthetic" else None)
    else:
        model, tokenizer = pretrained(cfg.model, dtype=dtype)
    model.to(device=device, dtype=dtype)
    model.train()
    return model, tokenizer


def full_attention_only(config) -> bool:
    """Whether every layer of a HF config's model is full causal attention: no sliding window,
    which a mask built by hand (left padding's, a shared prompt's) would have to carry too."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return layer_types == {"full_attention"} and getattr(config, "sliding_window", None) is None


def encode_prompts(tokenizer, prompts: list[str], max_length: int) -> list[list[int]]:
    """Each prompt's own ids (no special tokens added), left-truncated to its last
    ``max_length`` (a question's end holds the ask). One batch call: the tokenizers library
    encodes the batch in parallel, where a call a prompt pays the wrapper's overhead each time."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
    return [row[-max_length:] for row in ids]


def decode_texts(tokenizer, rows: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(rows, skip_special_tokens=True)``, in the tokenizers library's
    own batch decode where that gives the same text (no clean-up of tokenization spaces):
    it decodes the rows in parallel in Rust, where transformers' goes row by row."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tokenizer.batch_decode(rows, skip_special_tokens=True)
    return backend.decode_batch(rows, skip_special_tokens=True)


def builtin_tokenizer(cfg: TrainerConfig, *, vocab_size: int | None = None):
    """The tokenizer of a model built here: the synthetic task's own eight tokens (so a
    random policy is right about one time in ten, see trainer.tasks), else bytes."""
    if cfg.dataset == "synthetic":
        return word_tokenizer(SYNTHETIC_WORDS)
    return byte_tokenizer(vocab_size=vocab_size)


def pretrained(name_or_path: str, *, dtype: torch.dtype):
    """A HF causal LM and its tokenizer, offline when ``HF_HUB_OFFLINE`` is set."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        tokenizer = _tokenizer_class(name_or_path).from_pretrained(name_or_path, local_files_only=offline)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, local_files_only=offline)
    except OSError as exc:
        hint = " (HF_HUB_OFFLINE is set: pass a local path or pre-stage the hub cache)" if offline else ""
        raise ConfigError(f"model: cannot load {name_or_path!r}{hint}: {exc}") from None
    if not isinstance(tokenizer, transformers.PreTrainedTokenizerFast):
        raise ConfigError(f"model: {name_or_path!r} has no fast tokenizer (tokenizer.json)")
    if tokenizer.eos_token is None:
        raise ConfigError(f"model: the tokenizer of {name_or_path!r} has no eos token")
    if tokenizer.pad_token is None:
        # Padding is masked out everywhere, so reusing eos is safe and adds no new embedding.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _tokenizer_class(name_or_path: str):
    """The generic fast class for tokenizers saved as such (ours), else ``AutoTokenizer``.

    transformers 5 maps a checkpoint's ``model_type`` to its tokenizer class (Qwen2Tokenizer
    for our Qwen2 models), which rebuilds the pre-tokenizer and would lose the word
    vocabulary's whitespace splitting; the saved ``tokenizer.json`` is the truth.
    """
    config = Path(name_or_path) / "tokenizer_config.json"
    if config.is_file():
        saved_class = json.loads(config.read_text()).get("tokenizer_class")
        if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return transformers.PreTrainedTokenizerFast
    return transformers.AutoTokenizer


def random_model(shape: dict, tokenizer, *, seed: int, vocab_size: int | None = None,
                 device: Union[str, torch.device, None] = None):
    """A randomly initialised causal LM of ``shape``, the same weights for the same seed and
    kind of device. ``device``: where its parameters are created and initialised (None: the
    current default device); a CUDA device draws them from its own generator, so a shape
    built there differs from the same seed's on the CPU."""
    shape = dict(shape)
    config_class, model_class = _ARCHITECTURES[shape.pop("architecture")]
    if vocab_size is not None:
        shape["vocab_size"] = vocab_size
    config = config_class(
        **shape,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    device = torch.get_default_device() if device is None else torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _wrap(backend: Tokenizer) -> transformers.PreTrainedTokenizerFast:
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN if backend.token_to_id(UNK_TOKEN) is not None else None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return tokenizer


def word_tokenizer(words: tuple[str, ...]) -> transformers.PreTrainedTokenizerFast:
    """Whitespace-separated words; decoding joins tokens with single spaces."""
    vocab = {token: i for i, token in enumerate((PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *words))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([PAD_TOKEN, EOS_TOKEN, UNK_TOKEN])
    return _wrap(backend)


def byte_tokenizer(vocab_size: int | None = None) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE without merges: every text round-trips, one token per byte.

    With ``vocab_size``, unreachable filler tokens pad the vocabulary so that every id a
    model of that vocabulary samples still decodes (to the filler's name).
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(alphabet)}
    specials = [PAD_TOKEN, EOS_TOKEN]
    if vocab_size is not None:
        fillers = vocab_size - len(vocab) - len(specials)
        if fillers < 0:
            raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab) + 2} byte tokens")
        for i in range(fillers):
            vocab[f"<|filler_{i}|>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    return _wrap(backend)
