//! A secret split across two reads is still caught, wherever the split falls.

use pretty_assertions::assert_eq;

use airlock_redact::{STREAM_HOLDBACK_BYTES, STREAM_SCAN_STEP_BYTES};

use super::common::{BASE64, CASES, builtin, chunks, noise, pseudo_random, stream_all};

/// Every split point of every case, in short output: two pushes, then finish.
#[test]
fn every_split_point_of_every_case() {
    let r = builtin();
    for case in CASES {
        let text = format!("start\n{}\nend\n", case.input);
        let expected = r.redact(&text);
        for split in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let (out, count) = stream_all(&[&text[..split], &text[split..]]);
            assert_eq!(out, expected.text, "{} split at {split}", case.id);
            assert_eq!(count, expected.count);
        }
    }
}

/// Split points of every case in output long enough that the stream scans while the secret
/// is around its cut: the second push makes the scan cut through the secret. Every third
/// split point (every one is covered by the test above), to keep the unoptimised build quick.
#[test]
fn split_points_with_the_cut_through_the_secret() {
    let lead = STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES;
    for case in CASES {
        let tail = STREAM_HOLDBACK_BYTES - case.input.len() / 2;
        let text = format!("{}\n{}\n{}", noise(lead), case.input, noise(tail));
        let expected = format!("{}\n{}\n{}", noise(lead), case.expected, noise(tail));
        for split in (lead..=lead + case.input.len() + 2).step_by(3) {
            let (out, count) = stream_all(&[&text[..split], &text[split..]]);
            assert_eq!(out, expected, "{} split at {split}", case.id);
            assert_eq!(count, 1);
        }
    }
}

/// Small reads of a long output with many secrets give the same text as redacting it whole.
#[test]
fn small_reads_of_long_output() {
    let mut text = String::new();
    for (i, case) in CASES.iter().enumerate() {
        text += &noise(300 + 97 * i);
        text.push('\n');
        text += case.input;
        text.push('\n');
    }
    let expected = builtin().redact(&text);
    assert_eq!(expected.count, CASES.len() as u64);
    for size in [1, 7, 64, 1000, 4096, 5000] {
        let (out, count) = stream_all(&chunks(&text, size));
        assert_eq!(out, expected.text, "chunks of {size}");
        assert_eq!(count, expected.count);
    }
}

/// A private key longer than the holdback, split anywhere in a window around the cut.
#[test]
fn a_long_private_key_straddling_the_cut() {
    let body: String = pseudo_random(6 * 1024, 5, BASE64)
        .as_bytes()
        .chunks(64)
        .map(|l| format!("{}\n", std::str::from_utf8(l).unwrap()))
        .collect();
    let key = format!("-----BEGIN RSA PRIVATE KEY-----\n{body}-----END RSA PRIVATE KEY-----");
    let text = format!("{}{key}\ndone\n{}", noise(3000), noise(6000));
    let expected = builtin().redact(&text);
    assert_eq!(expected.count, 1);
    for split in (3000..text.len() - 5000).step_by(97) {
        let (out, _) = stream_all(&[&text[..split], &text[split..]]);
        assert_eq!(out, expected.text, "split at {split}");
    }
    for size in [1, 500, 4097] {
        let (out, _) = stream_all(&chunks(&text, size));
        assert_eq!(out, expected.text, "chunks of {size}");
    }
}

/// A long JWT, read in pieces, never leaves a piece of its payload behind.
#[test]
fn a_long_jwt_read_in_pieces() {
    let payload = pseudo_random(
        9000,
        11,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
    );
    let jwt = format!("eyJhbGciOiJIUzI1NiJ9.eyJ{payload}.c2lnbmF0dXJlLXNpZ25hdHVyZQ");
    let text = format!("{}token={jwt}\n{}", noise(5000), noise(100));
    let expected = builtin().redact(&text);
    assert_eq!(
        expected.text,
        format!("{}token=[REDACTED:jwt]\n{}", noise(5000), noise(100))
    );
    for size in [3, 100, 4096] {
        let (out, _) = stream_all(&chunks(&text, size));
        assert_eq!(out, expected.text, "chunks of {size}");
    }
}

#[test]
fn by_rule_of_a_stream_adds_up() {
    let r = builtin();
    let text: String = CASES
        .iter()
        .map(|c| format!("{}\n{}\n", c.input, noise(900)))
        .collect();
    let mut s = r.stream();
    for piece in chunks(&text, 333) {
        s.push(piece);
    }
    s.finish();
    assert_eq!(s.by_rule(), r.redact(&text).by_rule);
}

/// One push whose scan cuts at every other position of the secret (and just around it).
#[test]
fn the_cut_through_every_part_of_every_case() {
    let lead = STREAM_HOLDBACK_BYTES + STREAM_SCAN_STEP_BYTES;
    for case in CASES {
        let len = case.input.len();
        // The scan cuts STREAM_HOLDBACK_BYTES before the end of the text.
        let tails = STREAM_HOLDBACK_BYTES.saturating_sub(len + 2)..=STREAM_HOLDBACK_BYTES + 1;
        for tail in tails.step_by(2) {
            let text = format!("{}\n{}\n{}", noise(lead), case.input, noise(tail));
            let expected = format!("{}\n{}\n{}", noise(lead), case.expected, noise(tail));
            let (out, count) = stream_all(&[&text]);
            assert_eq!(out, expected, "{} tail {tail}", case.id);
            assert_eq!(count, 1);
        }
    }
}
