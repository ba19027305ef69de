//! Raw syscalls for the in-sandbox test probe (feature `probe`).
