//! The small file-system pieces every ringtune crate needs, each written once.
//!
//! Owns: writing a file so that a crash leaves the old file or the new one and never half of
//! one ([`write_atomically`], [`write_atomically_with`]: a temporary sibling, fsync of the file,
//! rename, fsync of the folder; [`write_secret_atomically`] for keys, readable by the owner
//! only), where the cache that `just setup` fills lives
//! ([`cache_dir`]), and lower-case hex for digests ([`hex`]).
//!
//! Does not own: what the files hold (checkpoints, tokenized data, libraries) or how they are
//! read back.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("sub/summary.json");
//! ringtune_files::write_atomically(&path, b"{}").unwrap();
//! assert_eq!(std::fs::read(&path).unwrap(), b"{}");
//! assert_eq!(ringtune_files::hex(&[0x0f, 0xa0]), "0fa0");
//! ```

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// A write that did not complete; the target is unchanged and no temporary file is left.
#[derive(Debug, thiserror::Error)]
#[error("writing {path}: {source}")]
pub struct WriteError {
    /// The file that was being written.
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

/// Who may read a written file.
#[derive(Clone, Copy)]
enum Readers {
    /// Whoever the umask lets, as `std::fs::write` would.
    Umask,
    /// The owner only, from creation on.
    Owner,
}

/// Writes `bytes` to `path` atomically (see [`write_atomically_with`]).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_atomically_with(path, |file| io::Write::write_all(file, bytes))
}

/// Writes a secret (a private key) to `path` atomically, readable by its owner only: the file
/// never exists with wider permissions, not even as the temporary sibling.
pub fn write_secret_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_for(path, Readers::Owner, |file| io::Write::write_all(file, bytes))
}

/// Creates `path`'s folder if needed, lets `write` fill a temporary file beside `path`, then
/// syncs it, renames it over `path` and syncs the folder, so the rename itself survives a
/// crash. On any failure the temporary file is removed and `path` keeps its old contents. The
/// file gets the permissions `std::fs::write` would give it.
pub fn write_atomically_with<T>(path: &Path, write: impl FnOnce(&mut File) -> io::Result<T>) -> Result<T, WriteError> {
    write_for(path, Readers::Umask, write)
}

fn write_for<T>(
    path: &Path,
    readers: Readers,
    write: impl FnOnce(&mut File) -> io::Result<T>,
) -> Result<T, WriteError> {
    let fail = |source| WriteError { path: path.to_path_buf(), source };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A hidden sibling: same file system (so the rename is atomic) and unique per writer, so
    // several processes may write the same target at once.
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".partial");
    // A temporary file is the owner's only; the result is as readable as a plain write's
    // (the mode is requested at creation, so the umask still applies).
    #[cfg(unix)]
    if let Readers::Umask = readers {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    #[cfg(not(unix))]
    let _ = readers;
    let mut temp = builder.tempfile_in(dir).map_err(fail)?;
    let value = write(temp.as_file_mut()).map_err(fail)?;
    temp.as_file().sync_all().map_err(fail)?;
    temp.persist(path).map_err(|e| fail(e.error))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(fail)?;
    Ok(value)
}

/// Where the cache lives and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDir {
    /// The folder.
    pub path: PathBuf,
    /// `RINGTUNE_CACHE`, or the workspace's cache folder.
    pub origin: &'static str,
}

/// The cache folder that `just setup` fills (libraries) and the data tools fill (tokenized
/// MRPC): `RINGTUNE_CACHE` when set, else `.cache` in the workspace these crates were built in.
pub fn cache_dir() -> CacheDir {
    cache_dir_from(std::env::var_os("RINGTUNE_CACHE"))
}

fn cache_dir_from(variable: Option<std::ffi::OsString>) -> CacheDir {
    match variable.filter(|v| !v.is_empty()) {
        Some(dir) => CacheDir { path: PathBuf::from(dir), origin: "RINGTUNE_CACHE" },
        None => {
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let workspace = workspace.canonicalize().unwrap_or(workspace);
            CacheDir { path: workspace.join(".cache"), origin: "the workspace cache folder" }
        }
    }
}

/// Lower-case hex of `bytes` (digests in file names, logs and manifests).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(2 * bytes.len()), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("model.bin");
        write_atomically(&path, b"old").expect("first");
        let err = write_atomically_with(&path, |file| {
            io::Write::write_all(file, b"half of the new")?;
            Err::<(), _>(io::Error::other("disk full"))
        })
        .expect_err("fails");
        assert!(err.to_string().contains("model.bin") && err.to_string().contains("disk full"), "{err}");
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        assert_eq!(entries(dir.path()), ["model.bin"]);
    }

    #[test]
    fn writes_replace_and_create_folders() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("a/b/c.json");
        write_atomically(&path, b"1").expect("create");
        let value =
            write_atomically_with(&path, |file| io::Write::write_all(file, b"22").map(|()| 7)).expect("replace");
        assert_eq!((value, std::fs::read(&path).expect("read")), (7, b"22".to_vec()));
        assert_eq!(entries(&dir.path().join("a/b")), ["c.json"]);
    }

    #[cfg(unix)]
    #[test]
    fn files_are_as_readable_as_plain_writes_and_secrets_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let mode =
            |name: &str| std::fs::metadata(dir.path().join(name)).expect("metadata").permissions().mode() & 0o777;
        std::fs::write(dir.path().join("plain"), b"1").expect("plain write");
        write_atomically(&dir.path().join("atomic"), b"1").expect("atomic write");
        write_secret_atomically(&dir.path().join("key"), b"1").expect("secret write");
        assert_eq!(mode("atomic"), mode("plain"));
        assert_eq!(mode("key"), 0o600);
    }

    #[test]
    fn cache_folder_from_the_variable_or_the_workspace() {
        let set = cache_dir_from(Some("/srv/cache".into()));
        assert_eq!((set.path, set.origin), (PathBuf::from("/srv/cache"), "RINGTUNE_CACHE"));
        let unset = cache_dir_from(Some("".into()));
        assert!(
            unset.path.ends_with(".cache") && unset.path.join("../Cargo.toml").exists(),
            "{}",
            unset.path.display()
        );
        assert_eq!(unset.origin, "the workspace cache folder");
    }

    #[test]
    fn hex_is_lower_case_and_padded() {
        assert_eq!(hex(&[0, 1, 0xab, 0xff]), "0001abff");
        assert_eq!(hex(&[]), "");
    }
}
