//! Hostile output finishes in linear time. A correctness bound, not a benchmark: a
//! super-linear blow-up on a megabyte takes minutes, these take well under a second in a
//! release build (`cargo nextest run --release -p airlock-redact hostile`).

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use super::common::{BASE64, builtin, chunks, pseudo_random, stream_all};

const MIB: usize = 1024 * 1024;
/// Generous: the unoptimised test build runs the regex engines 10-20x slower, and CI machines
/// are shared.
const BOUND: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(60)
} else {
    Duration::from_secs(5)
};

/// Redacts `text` whole and as a stream within the bound; returns both outputs.
fn timed(name: &str, text: &str) -> (String, String) {
    let started = Instant::now();
    let whole = builtin().redact(text).text;
    let took = started.elapsed();
    assert!(took < BOUND, "{name}: redact took {took:?}");
    let started = Instant::now();
    let (streamed, _) = stream_all(&chunks(text, 64 * 1024));
    let took = started.elapsed();
    assert!(took < BOUND, "{name}: stream took {took:?}");
    (whole, streamed)
}

fn check(name: &str, text: &str) {
    let (whole, streamed) = timed(name, text);
    assert!(
        streamed == whole,
        "{name}: the stream differs from the whole"
    );
}

#[test]
fn a_megabyte_of_one_letter() {
    check("a", &"a".repeat(MIB));
}

#[test]
fn a_megabyte_of_base64() {
    check("base64", &pseudo_random(MIB, 3, BASE64));
}

#[test]
fn a_megabyte_of_sk_dashes() {
    check("sk-", &"sk-".repeat(MIB / 3));
}

#[test]
fn a_megabyte_of_keyword_soup() {
    let soup =
        "ghp_ eyJ AKIA Bearer -----BEGIN password= postgres://a:b@ sk-ant- xoxb- [REDACTED:jwt] ";
    check("soup", &soup.repeat(MIB / soup.len()));
}

#[test]
fn a_megabyte_inside_one_open_match() {
    // A private key header followed by a megabyte of armour: one huge match.
    let text = format!(
        "-----BEGIN PRIVATE KEY-----\n{}",
        pseudo_random(MIB, 9, BASE64)
    );
    let (whole, streamed) = timed("open match", &text);
    assert_eq!(whole, "[REDACTED:private-key]");
    // The stream releases the open match every STREAM_MAX_PENDING_BYTES, each part redacted.
    assert_eq!(streamed.replace("[REDACTED:private-key]", ""), "");
}

#[test]
fn a_megabyte_of_near_misses() {
    // Token prefixes followed by almost enough characters.
    let near = "ghp_abcdefghijklmnopqrstuvwxyz0123 AKIA1234 sk-proj-short eyJabc.eyJ ";
    check("near misses", &near.repeat(MIB / near.len()));
}
