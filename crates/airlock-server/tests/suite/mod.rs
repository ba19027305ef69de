mod api;
mod auth;
mod common;
mod load;
mod shutdown;
mod slow;
mod sse;
mod warm;
