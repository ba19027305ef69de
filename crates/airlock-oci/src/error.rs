//! The error type of airlock-oci: one variant per failed operation, with its context.

use std::path::PathBuf;

/// What can go wrong with images: building, importing, pulling, storing, unpacking.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// A digest is not `sha256:` and 64 lowercase hex digits.
    #[error("{text:?} is not a sha256:<64 hex> digest")]
    ParseDigest {
        /// The text.
        text: String,
    },
    /// Content does not have the digest it is addressed by.
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was checked (a blob, a layer's uncompressed content, a manifest).
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// Content does not have the size its descriptor says.
    #[error("{what}: size mismatch: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// What was checked.
        what: String,
        /// The size it should have.
        expected: u64,
        /// The size it has.
        actual: u64,
    },
    /// A bound on untrusted content was hit.
    #[error("{what} exceeds {limit}")]
    Bound {
        /// What grew too large.
        what: String,
        /// The bound, with its unit.
        limit: String,
    },
    /// A filesystem operation on the store failed.
    #[error("{op} {path}")]
    StoreIo {
        /// The operation, e.g. "create directory".
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Taking a lock failed.
    #[error("lock {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A layer entry was refused (hostile or unsupported archive content).
    #[error("layer {layer}: entry {entry:?}: {reason}")]
    UnpackEntry {
        /// The layer (its digest, or the archive's path).
        layer: String,
        /// The entry's path as written in the archive.
        entry: String,
        /// Why it was refused.
        reason: String,
    },
    /// Reading or writing a layer failed.
    #[error("layer {layer}: {op}")]
    UnpackIo {
        /// The layer.
        layer: String,
        /// What was being done.
        op: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A manifest, index or config is not valid JSON of its kind.
    #[error("parse {what}")]
    ParseJson {
        /// What was parsed.
        what: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// An image is not of a kind airlock can run.
    #[error("{what}: {reason}")]
    Unsupported {
        /// What.
        what: String,
        /// Why.
        reason: String,
    },
    /// An image whose layers have what jobs must not run, recorded for builds only.
    #[error(
        "image {image} is for builds only ({reason}): jobs run no setuid files or device nodes; build from it (base = \"image:NAME@{image}\"), which strips them"
    )]
    BuildBaseOnly {
        /// The image id.
        image: String,
        /// The first such entry.
        reason: String,
    },
    /// No image in the store matches.
    #[error("no image {query} in the store {store}")]
    ImageNotFound {
        /// What was asked for.
        query: String,
        /// The store.
        store: PathBuf,
    },
    /// A name matches more than one image, or an archive holds several images.
    #[error("{query} is ambiguous: {candidates}")]
    Ambiguous {
        /// What was asked for.
        query: String,
        /// What it could mean.
        candidates: String,
    },
    /// An image name is malformed.
    #[error("image name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// An archive or layout to import is malformed.
    #[error("import {path}: {reason}")]
    ImportFormat {
        /// The archive or directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Talking to a registry failed.
    #[error("pull {reference}")]
    Pull {
        /// The reference pulled.
        reference: String,
        /// The client's error.
        source: Box<oci_client::errors::OciDistributionError>,
    },
    /// Reading a registry's blob stream failed.
    #[error("pull {reference}: read {digest}")]
    PullStream {
        /// The reference pulled.
        reference: String,
        /// The blob.
        digest: String,
        /// The error.
        source: std::io::Error,
    },
    /// A reference to pull is malformed or not pinned by digest.
    #[error("pull reference {reference:?}: {reason}")]
    PullReference {
        /// The reference.
        reference: String,
        /// Why.
        reason: String,
    },
    /// A build spec cannot be read.
    #[error("read build spec {path}")]
    ReadSpec {
        /// The spec file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A build spec is not valid TOML of the expected shape.
    #[error("parse build spec {path}")]
    ParseSpec {
        /// The spec file.
        path: PathBuf,
        /// The parser's error.
        source: toml::de::Error,
    },
    /// A build spec value is invalid.
    #[error("build spec {path}: {field}: {reason}")]
    InvalidSpec {
        /// The spec file.
        path: PathBuf,
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// A build step's program could not be started.
    #[error("build step {step}: start {program}")]
    SpawnTool {
        /// The step.
        step: &'static str,
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A build step's program failed.
    #[error("build step {step}: {program} exited with {status}; last output:\n{output_tail}")]
    ToolFailed {
        /// The step.
        step: &'static str,
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// The end of its output.
        output_tail: String,
    },
    /// A build step found something wrong with the tree it built.
    #[error("build step {step}: {reason}")]
    Build {
        /// The step.
        step: &'static str,
        /// Why.
        reason: String,
    },
}

impl OciError {
    pub(crate) fn store_io(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        OciError::StoreIo {
            op,
            path: path.into(),
            source,
        }
    }
}
