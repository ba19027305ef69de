//! airlock-redact: replaces secret-shaped strings in job output with `[REDACTED:<rule>]`.
#![forbid(unsafe_code)]
