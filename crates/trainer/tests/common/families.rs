//! A tiny model of every encoder family with a `tokenizer.json` of its family's kind: RoBERTa's
//! and ModernBERT's byte-level BPE and XLM-R's and DeBERTa's Unigram trained here on the sentences of the test's MRPC slice (so
//! nothing derived from MRPC is kept), DistilBERT's and ELECTRA's WordPiece (MiniLM's).

use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::unigram::{Unigram, UnigramTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::processors::roberta::RobertaProcessing;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, TokenizerBuilder};

use super::{root, with_seeded_weights};

/// The families beyond BERT and MPNet, by `model_type`.
pub(crate) const FAMILIES: [&str; 6] = ["roberta", "xlm-roberta", "distilbert", "electra", "modernbert", "deberta-v2"];

/// RoBERTa's and XLM-R's special tokens, in id order (`<pad>` is 1).
const SPECIAL: [&str; 4] = ["<s>", "<pad>", "</s>", "<unk>"];

/// A tiny `model_type` model in `dir/tiny-<model_type>` (seeded weights, 3 heads of 8) with a
/// tokenizer of its family's kind; the trained ones learn from `mrpc`'s `train.tsv`.
pub(crate) fn tiny_family_model(dir: &Path, model_type: &str, mrpc: &Path) -> PathBuf {
    let model = dir.join(format!("tiny-{model_type}"));
    std::fs::create_dir_all(&model).expect("dir");
    let tokenizer = model.join("tokenizer.json");
    let layers = r#""num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 24, "intermediate_size": 48"#;
    let config = match model_type {
        "roberta" | "xlm-roberta" => {
            let vocab = if model_type == "roberta" {
                byte_level_bpe(&sentences(mrpc), &tokenizer)
            } else {
                unigram(&sentences(mrpc), &tokenizer)
            };
            format!(
                r#"{{"model_type": "{model_type}", "vocab_size": {vocab}, {layers}, "max_position_embeddings": 140,
                    "type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-5}}"#
            )
        }
        "modernbert" => {
            let vocab = byte_level_bpe(&sentences(mrpc), &tokenizer);
            // A global layer, then two of a window of 8 tokens either side.
            format!(
                r#"{{"model_type": "modernbert", "vocab_size": {vocab}, "num_hidden_layers": 3, "num_attention_heads": 3,
                    "hidden_size": 24, "intermediate_size": 48, "max_position_embeddings": 140,
                    "global_attn_every_n_layers": 3, "local_attention": 16, "pad_token_id": 1}}"#
            )
        }
        "deberta-v2" => {
            let vocab = unigram(&sentences(mrpc), &tokenizer);
            // DeBERTa-v3's settings: relative attention both ways over 16 log buckets.
            format!(
                r#"{{"model_type": "deberta-v2", "vocab_size": {vocab}, {layers}, "max_position_embeddings": 140,
                    "relative_attention": true, "position_buckets": 16, "norm_rel_ebd": "layer_norm",
                    "share_att_key": true, "pos_att_type": "p2c|c2p", "position_biased_input": false,
                    "type_vocab_size": 0, "layer_norm_eps": 1e-7, "pad_token_id": 1}}"#
            )
        }
        "distilbert" | "electra" => {
            std::fs::copy(root().join("models/all-MiniLM-L6-v2/tokenizer.json"), &tokenizer).expect("run `just setup`");
            if model_type == "distilbert" {
                r#"{"model_type": "distilbert", "vocab_size": 30522, "dim": 24, "n_layers": 2, "n_heads": 3,
                    "hidden_dim": 48, "max_position_embeddings": 512}"#
                    .to_string()
            } else {
                format!(
                    r#"{{"model_type": "electra", "vocab_size": 30522, "embedding_size": 16, {layers},
                        "max_position_embeddings": 512}}"#
                )
            }
        }
        other => panic!("no tiny model for {other}"),
    };
    with_seeded_weights(&model, &config);
    model
}

/// Both sentences of every row of `mrpc/train.tsv`.
fn sentences(mrpc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(mrpc.join("train.tsv")).expect("train.tsv");
    text.lines().skip(1).flat_map(|line| line.split('\t').skip(3).map(str::to_string).collect::<Vec<_>>()).collect()
}

fn special_tokens() -> Vec<AddedToken> {
    SPECIAL.iter().map(|t| AddedToken::from(*t, true)).collect()
}

/// RoBERTa's kind: byte-level BPE, `<s> A </s></s> B </s>`; its vocabulary size.
fn byte_level_bpe(text: &[String], out: &Path) -> usize {
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(ByteLevel::default()))
        .with_post_processor(Some(RobertaProcessing::new(("</s>".into(), 2), ("<s>".into(), 0))))
        .with_decoder(Some(ByteLevel::default()))
        .build()
        .expect("tokenizer");
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(600)
        .show_progress(false)
        .special_tokens(special_tokens())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    tokenizer.train(&mut trainer, text.iter()).expect("trained");
    tokenizer.save(out, false).expect("saved");
    tokenizer.get_vocab_size(true)
}

/// XLM-R's kind: a SentencePiece-style Unigram, `<s> A </s> </s> B </s>`; its vocabulary size.
fn unigram(text: &[String], out: &Path) -> usize {
    let template = TemplateProcessing::builder()
        .try_single("<s> $A </s>")
        .and_then(|b| b.try_pair("<s> $A </s> </s> $B </s>"))
        .expect("template")
        .special_tokens(vec![("<s>", 0), ("</s>", 2)])
        .build()
        .expect("template");
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(Unigram::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)))
        .with_post_processor(Some(template))
        .with_decoder(Some(Metaspace::new('▁', PrependScheme::Always, true)))
        .build()
        .expect("tokenizer");
    let mut trainer = UnigramTrainerBuilder::default()
        .vocab_size(600)
        .show_progress(false)
        .special_tokens(special_tokens())
        .unk_token(Some("<unk>".into()))
        .build()
        .expect("trainer");
    tokenizer.train(&mut trainer, text.iter()).expect("trained");
    tokenizer.save(out, false).expect("saved");
    tokenizer.get_vocab_size(true)
}
