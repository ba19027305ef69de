//! airlock-oci owns airlock's OCI images: building minimal images from a spec, importing
//! OCI layouts and `docker save` archives, pulling by digest from a registry, the local
//! content-addressed store, and unpacking images into a read-only rootfs cache, safely
//! against hostile archives. It must not run jobs, pull on a job's path (the native
//! backend only reads the store and unpacks what is already in it), trust a tag, or write
//! outside the store and the build's own scratch directories.
#![forbid(unsafe_code)]

pub mod build;
pub mod digest;
pub mod error;
pub mod export;
pub mod image;
pub mod import;
pub mod layer;
pub mod pull;
pub mod store;
pub mod unpack;

pub use digest::Digest;
pub use error::OciError;
pub use store::{ImageRecord, ImageStore};
