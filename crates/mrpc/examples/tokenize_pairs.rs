//! Reads MRPC-format pairs, tokenizes them as BERT pairs (`[CLS] a [SEP] b [SEP]`, token types,
//! truncation) and pads a batch, with nothing but this crate: a small WordPiece vocabulary and a
//! two-row GLUE file are written to a temporary folder first.
//!
//! `cargo run -p ringtune-mrpc --example tokenize_pairs`

use ringtune_mrpc::{load_split, Batch, Padding, PairTokenizer, ReadOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ringtune-mrpc-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let vocab =
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "a", "dog", "ran", "on", "mat", "##s"];
    std::fs::write(dir.join("vocab.txt"), vocab.join("\n"))?;
    let tsv = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n\
               1\t1\t2\tThe cat sat on the mat.\tA cat sat on a mat.\n\
               0\t3\t4\tThe dog ran.\tThe cats sat.\n";
    std::fs::write(dir.join("dev.tsv"), tsv)?;

    let tokenizer = PairTokenizer::from_model_dir(&dir, 16)?;
    let (examples, pairs) = load_split(&dir.join("dev.tsv"), &tokenizer, ReadOptions::default())?;
    for (pair, example) in pairs.pairs.iter().zip(&examples) {
        println!(
            "{:?} / {:?} -> ids {:?} types {:?} label {:?}",
            pair.a, pair.b, example.ids, example.type_ids, example.label
        );
    }
    let batch = Batch::new(&examples, &[0, 1], Padding::Dynamic, 0);
    println!("batch of {} rows x {} tokens, mask {:?}", batch.rows, batch.seq, batch.attention_mask);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
