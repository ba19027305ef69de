mod common;
mod kill;
mod leak;
mod limits;
mod oom;
mod pids;
