mod bad_input;
mod basics;
mod cleanup;
mod common;
mod limits;
mod policy_cmd;
mod probe;
mod rootfs_dir;
