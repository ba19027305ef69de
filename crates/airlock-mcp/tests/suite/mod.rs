mod cancel;
mod common;
mod files;
