mod cancel;
mod common;
mod files;
mod tasks;
