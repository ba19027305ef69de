//! airlock-testkit: dev-only helpers for tests.
