//! Pair tokenization with the `tokenizers` crate, exactly as Hugging Face encodes
//! `(a, b)`: `[CLS] a [SEP] b [SEP]`, token types 0 then 1, truncation `longest_first`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::DataError;

/// One encoded pair, unpadded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Token types (segment ids).
    pub type_ids: Vec<u8>,
    /// Whether truncation cut tokens.
    pub truncated: bool,
}

/// A tokenizer for sentence pairs with fixed truncation settings.
pub struct PairTokenizer {
    inner: Tokenizer,
    max_len: usize,
    source: PathBuf,
    fingerprint: [u8; 32],
}

impl PairTokenizer {
    /// The tokenizer of a model folder: its `tokenizer.json`, else a BERT WordPiece pipeline
    /// built from `vocab.txt` (lower-casing unless `tokenizer_config.json` says otherwise).
    pub fn from_model_dir(dir: &Path, max_len: usize) -> Result<Self, DataError> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            return Self::from_tokenizer_json(&json, max_len);
        }
        let vocab = dir.join("vocab.txt");
        if vocab.exists() {
            let lowercase = read_lowercase(&dir.join("tokenizer_config.json"));
            return Self::from_vocab(&vocab, lowercase, max_len);
        }
        Err(DataError::Tokenizer {
            path: dir.into(),
            reason: "neither tokenizer.json nor vocab.txt is in the model folder".into(),
        })
    }

    /// From a `tokenizer.json`; its own padding and truncation settings are replaced.
    pub fn from_tokenizer_json(path: &Path, max_len: usize) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
        let inner = Tokenizer::from_bytes(&bytes)
            .map_err(|e| DataError::Tokenizer { path: path.into(), reason: e.to_string() })?;
        Self::configure(inner, max_len, path, &bytes)
    }

    /// A BERT WordPiece pipeline from `vocab.txt`.
    pub fn from_vocab(path: &Path, lowercase: bool, max_len: usize) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
        let bad = |reason: String| DataError::Tokenizer { path: path.into(), reason };
        let path_str = path.to_str().ok_or_else(|| bad("the path is not UTF-8".into()))?;
        let model = WordPiece::from_file(path_str)
            .unk_token("[UNK]".into())
            .continuing_subword_prefix("##".into())
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let special = |token: &str| {
            tokenizers::Model::token_to_id(&model, token)
                .ok_or_else(|| bad(format!("{token} is not in the vocabulary")))
        };
        let (cls, sep) = (special("[CLS]")?, special("[SEP]")?);
        let template = TemplateProcessing::builder()
            .try_single("[CLS]:0 $A:0 [SEP]:0")
            .and_then(|b| b.try_pair("[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1"))
            .map_err(|e| bad(e.to_string()))?
            .special_tokens(vec![("[CLS]", cls), ("[SEP]", sep)])
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let mut inner = Tokenizer::new(model);
        inner
            .with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)))
            .with_pre_tokenizer(Some(BertPreTokenizer))
            .with_post_processor(Some(template));
        let mut fingerprint_input = bytes;
        fingerprint_input.push(lowercase as u8);
        Self::configure(inner, max_len, path, &fingerprint_input)
    }

    fn configure(mut inner: Tokenizer, max_len: usize, path: &Path, source_bytes: &[u8]) -> Result<Self, DataError> {
        let bad = |reason: String| DataError::Tokenizer { path: path.into(), reason };
        if max_len < 4 {
            return Err(bad(format!("max length {max_len} leaves no room for a pair")));
        }
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| bad(e.to_string()))?;
        let mut h = Sha256::new();
        h.update(source_bytes);
        h.update((max_len as u64).to_le_bytes());
        h.update(b"longest_first");
        Ok(PairTokenizer { inner, max_len, source: path.into(), fingerprint: h.finalize().into() })
    }

    /// Maximum tokens per pair.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// A hash of the vocabulary, the pipeline and the truncation settings.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// The id of a token, when the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encodes one pair.
    pub fn encode(&self, a: &str, b: &str) -> Result<Encoded, DataError> {
        let e = self
            .inner
            .encode((a, b), true)
            .map_err(|e| DataError::Tokenizer { path: self.source.clone(), reason: e.to_string() })?;
        Ok(to_encoded(&e))
    }

    /// Encodes many pairs (in parallel), in order.
    pub fn encode_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Encoded>, DataError> {
        let texts: Vec<(&str, Option<&str>)> = pairs.iter().map(|&(a, b)| (a, Some(b))).collect();
        self.encode_texts(&texts)
    }

    /// Encodes many texts (in parallel), in order: a pair where the second is there
    /// (`[CLS] a [SEP] b [SEP]`), else one sentence (`[CLS] a [SEP]`, token types 0).
    pub fn encode_texts(&self, texts: &[(&str, Option<&str>)]) -> Result<Vec<Encoded>, DataError> {
        let inputs: Vec<tokenizers::EncodeInput<'_>> = texts
            .iter()
            .map(|&(a, b)| match b {
                Some(b) => (a, b).into(),
                None => a.into(),
            })
            .collect();
        let encodings = self
            .inner
            .encode_batch(inputs, true)
            .map_err(|e| DataError::Tokenizer { path: self.source.clone(), reason: e.to_string() })?;
        Ok(encodings.iter().map(to_encoded).collect())
    }
}

fn to_encoded(e: &tokenizers::Encoding) -> Encoded {
    Encoded {
        ids: e.get_ids().to_vec(),
        type_ids: e.get_type_ids().iter().map(|&t| t as u8).collect(),
        truncated: !e.get_overflowing().is_empty(),
    }
}

/// `do_lower_case` from a `tokenizer_config.json` (default: lower-case).
fn read_lowercase(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("do_lower_case").and_then(serde_json::Value::as_bool))
        .unwrap_or(true)
}
