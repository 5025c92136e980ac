"""Small bring-your-own inputs built inside the tests (nothing downloaded): a RoBERTa-style encoder with a
byte-level BPE tokenizer trained here, and MIND-format directories with and without labels."""

from __future__ import annotations

from pathlib import Path

from models.news.data import Impression, NewsItem, generate_synthetic, write_mind

SENTENCES = [
    "Lakers beat Celtics in overtime thriller", "Senate passes budget bill after long debate",
    "Apple unveils new smartphone with faster chip", "Doctors warn about rising flu cases this winter",
    "NASA astronomers discover distant planet that may hold water", "Tesla shares jump after strong earnings",
    "Taylor Swift announces world tour with new album", "Travelers find cheap flights to Paris in spring",
] * 4


def tiny_roberta(path: Path) -> Path:
    """A 1-layer RoBERTa whose byte-level BPE tokenizer is trained on a few sentences; saved with
    ``save_pretrained`` (a fast tokenizer with ``tokenizer.json``)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    if (path / "config.json").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                               cls_token="<s>", sep_token="</s>", pad_token="<pad>", unk_token="<unk>",
                               mask_token="<mask>")
    tok.save_pretrained(str(path))
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    RobertaModel(cfg).save_pretrained(str(path))
    return path


def mind_dir(root: Path, n_news: int = 120, n_users: int = 40, seed: int = 0, labels: bool = True) -> Path:
    """A small synthetic MIND-format directory ({train,valid,test}/); ``labels=False`` removes the sidecars."""
    if not (root / "train" / "behaviors.tsv").is_file():
        generate_synthetic(root, n_news=n_news, n_users=n_users, impressions_per_user=2, seed=seed)
        for p in root.glob("pairs_*.csv"):
            p.unlink()
    if not labels:
        for p in root.glob("*/labels.tsv"):
            p.unlink()
    return root


def unlabelled_test_split(path: Path) -> Path:
    """A MIND test split as published: no click labels on the impressions, no labels sidecar."""
    news = [NewsItem(f"N{i}", "sports", f"Team {i} wins the final game", f"Body {i}") for i in range(1, 7)]
    behaviors = [Impression("1", "U1", ["N1", "N2"], [("N3", None), ("N4", None)]),
                 Impression("2", "U2", ["N5"], [("N6", None), ("N1", None)])]
    write_mind(path, news, behaviors)
    return path
