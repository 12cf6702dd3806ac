//! Reads MRPC-format pairs, tokenizes them as BERT pairs (`[CLS] a [SEP] b [SEP]`, token types,
//! truncation) and pads a batch, then reads a CSV of single sentences with string labels, with
//! nothing but this crate: a small WordPiece vocabulary, a two-row GLUE file and a CSV are
//! written to a temporary folder first.
//!
//! `cargo run -p ringtune-data --example tokenize_pairs`

use ringtune_data::{load_file, Batch, FileLayout, GlueTask, LabelHint, LabelSet, Padding, PairTokenizer, ReadOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ringtune-data-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let vocab =
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "a", "dog", "ran", "on", "mat", "##s"];
    std::fs::write(dir.join("vocab.txt"), vocab.join("\n"))?;
    let tsv = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n\
               1\t1\t2\tThe cat sat on the mat.\tA cat sat on a mat.\n\
               0\t3\t4\tThe dog ran.\tThe cats sat.\n";
    std::fs::write(dir.join("dev.tsv"), tsv)?;

    let tokenizer = PairTokenizer::from_model_dir(&dir, 16)?;
    let mrpc = GlueTask::Mrpc;
    let layout = mrpc.file_layout("dev");
    let (examples, rows) =
        load_file(&dir.join("dev.tsv"), &layout, &mrpc.labels(), &tokenizer, ReadOptions::default())?;
    for (row, example) in rows.rows.iter().zip(&examples) {
        println!(
            "{:?} / {:?} -> ids {:?} types {:?} label {:?}",
            row.a, row.b, example.ids, example.type_ids, example.label
        );
    }
    let batch = Batch::new(&examples, &[0, 1], Padding::Dynamic, 0);
    println!("batch of {} rows x {} tokens, mask {:?}", batch.rows, batch.seq, batch.attention_mask);

    // Your own file: the text column found from the header, string labels in sorted order.
    std::fs::write(
        dir.join("reviews.csv"),
        "text,label
\"The mat, the cat.\",good
The dog ran.,bad
",
    )?;
    let layout = FileLayout::for_file(&dir.join("reviews.csv"), None, None, None)?;
    let rows = ringtune_data::read_rows(&dir.join("reviews.csv"), &layout)?;
    let written: Vec<&str> = rows.rows.iter().filter_map(|r| r.label.as_deref()).collect();
    let labels = LabelSet::infer(&written, LabelHint::Infer)?;
    let (examples, _) = ringtune_data::examples(&rows, &labels, &tokenizer)?;
    println!(
        "labels {:?}; {:?} -> ids {:?} label {:?}",
        labels.names(),
        rows.rows[0].a,
        examples[0].ids,
        examples[0].label
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
