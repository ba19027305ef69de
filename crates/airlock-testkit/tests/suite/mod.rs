//! Integration suites.

mod host_probe;
