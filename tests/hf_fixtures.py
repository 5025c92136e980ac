"""Small Hugging Face sequence classifiers, built from a config with random weights and saved with
``save_pretrained`` (safetensors) and a fast tokenizer, as a tenant would bring them. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("the a an good bad great awful fine poor movie film plot acting story was is were not very really quite "
         "boring moving funny dull long short").split()
LABELS = ("negative", "neutral", "positive")
TEXTS = ["the movie was good", "a very boring and long film", "great acting but the plot was dull",
         "not bad", "really funny"]


def _vocab(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "and", "but", *WORDS]) + "\n")
    return path


def _bpe_tokenizer() -> object:
    """A byte-level BPE fast tokenizer over the words above (GPT-2 / RoBERTa style), trained here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 20 + TEXTS * 5, trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   mask_token="<mask>", unk_token="<pad>")


def save_classifier(directory: Path, model_type: str = "bert", seed: int = 0, hidden: int = 32,
                    scale: float | None = 0.3) -> Path:
    """A ``model_type`` classifier of three classes in ``directory`` (config.json, model.safetensors, tokenizer
    files); returns ``directory``. ``scale``: the standard deviation of every weight matrix (larger than
    transformers' initialisation, so that the logits differ between texts), or None for transformers' own."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertTokenizerFast,
        DistilBertConfig,
        DistilBertForSequenceClassification,
        GPT2Config,
        GPT2ForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    directory = Path(directory)
    labels = {"id2label": dict(enumerate(LABELS)), "label2id": {v: i for i, v in enumerate(LABELS)}}
    torch.manual_seed(seed)
    if model_type in ("bert", "distilbert"):
        tokenizer = BertTokenizerFast(vocab=str(_vocab(directory / "_vocab")))
        n = tokenizer.vocab_size
        if model_type == "bert":
            model = BertForSequenceClassification(BertConfig(
                vocab_size=n, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=2 * hidden, max_position_embeddings=64, **labels))
        else:
            model = DistilBertForSequenceClassification(DistilBertConfig(
                vocab_size=n, dim=hidden, n_layers=2, n_heads=2, hidden_dim=2 * hidden, max_position_embeddings=64,
                **labels))
    elif model_type in ("roberta", "gpt2"):
        tokenizer = _bpe_tokenizer()
        n = len(tokenizer)
        if model_type == "roberta":
            model = RobertaForSequenceClassification(RobertaConfig(
                vocab_size=n, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=2 * hidden, max_position_embeddings=66, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **labels))
        else:
            model = GPT2ForSequenceClassification(GPT2Config(
                vocab_size=n, n_embd=hidden, n_layer=2, n_head=2, n_positions=64, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **labels))
    else:
        raise ValueError(f"no fixture for {model_type!r}")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1 and scale is not None:
                p.normal_(0.0, scale)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    import shutil

    shutil.rmtree(directory / "_vocab", ignore_errors=True)
    return directory
