//! Writes a file so that a crash leaves the old one or the new one, never half of one.
//!
//! `cargo run -p ringtune-files --example atomic_write`

fn main() -> Result<(), ringtune_files::WriteError> {
    let dir = std::env::temp_dir().join(format!("ringtune-files-example-{}", std::process::id()));
    let path = dir.join("summary.json");
    ringtune_files::write_atomically(&path, br#"{"steps": 1}"#)?;
    ringtune_files::write_atomically_with(&path, |file| std::io::Write::write_all(file, br#"{"steps": 2}"#))?;
    let text =
        std::fs::read_to_string(&path).map_err(|source| ringtune_files::WriteError { path: path.clone(), source })?;
    println!("{} now holds {text}", path.display());
    println!("cache folder: {} ({})", ringtune_files::cache_dir().path.display(), ringtune_files::cache_dir().origin);
    println!("sha-like hex of [1, 254]: {}", ringtune_files::hex(&[1, 254]));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
