//! Redaction cost on realistic job output: logs, a traceback, JSON, a table, with a few
//! secrets. Issue 4 asks for well under 1 ms per 8 KB and under 20 ms per 1 MB (release).
//! Run: `cargo bench -p airlock-redact`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use airlock_redact::Redactor;
use divan::{Bencher, black_box};

fn main() {
    divan::main();
}

const KIB: usize = 1024;

/// Ordinary output, about 2 KiB, no secret.
const BLOCK: &str = r#"epoch 3 step 117: loss=0.4213 acc=0.871 lr=3.0e-4 elapsed=12.5s
epoch 3 step 118: loss=0.4198 acc=0.873 lr=3.0e-4 elapsed=12.6s
Collecting numpy==2.1.0
  Downloading numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl (16.0 MB)
Successfully installed numpy-2.1.0 pandas-2.2.2
   col_a  col_b     label
0   0.12   3.40  positive
1   0.98  -1.20  negative
{"status": "ok", "token_count": 812, "model": "gpt-4o", "items": [1, 2, 3], "path": "/work/out/report.json"}
GET https://api.example.com/v1/items?page=2&sort=desc 200 OK (123 ms)
sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  data.csv
uuid 123e4567-e89b-12d3-a456-426614174000 written to /tmp/tmpk2x9/part-00003.parquet
Traceback (most recent call last):
  File "/work/main.py", line 14, in <module>
    result = fetch(url, retries=3)
  File "/usr/lib/python3/dist-packages/requests/api.py", line 73, in get
    return request("get", url, params=params, **kwargs)
requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.example.com', port=443): Max retries exceeded
résumé: naïve café — 東京 ✓ █████▌ 73%
WARNING: the task queue is 93% full; 17 tasks skipped, 4 retried after 0.25s backoff
INFO  2026-11-29T11:52:06Z worker-3 finished job 01JE5Q8N3V7M2K9X4R6T1W0YZB in 812 ms
DEBUG cache hit ratio 0.9731 (hits=19462 misses=538) evictions=12 bytes=83886080
"#;

/// Secrets dropped into the output now and then.
const SECRETS: &[&str] = &[
    "export AWS_ACCESS_KEY_ID=AKIA454ML6LG4TJFCZ4K\n",
    "client = OpenAI(api_key=\"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\")\n",
    "DATABASE_URL=postgres://app:Wq9x2LmP4vR8tZ@db.internal/jobs\n",
    "> Authorization: Bearer BGJyLF4gwdvpjITdNi7bAiUbHF-ZNm9Z0GdbsDPX\n",
    "GITHUB_TOKEN ghp_JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F loaded\n",
];

/// `len` bytes of output with `secrets` secrets spread evenly through it.
fn output(len: usize, secrets: usize) -> String {
    let mut text = String::with_capacity(len + 1024);
    let every = len / (secrets + 1);
    let mut next = every;
    let mut i = 0;
    while text.len() < len {
        text.push_str(BLOCK);
        if text.len() >= next && i < secrets {
            text.push_str(SECRETS[i % SECRETS.len()]);
            i += 1;
            next += every;
        }
    }
    let mut end = len;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

fn redactor() -> Redactor {
    Redactor::builtin().unwrap()
}

#[divan::bench(args = [8 * KIB, 1024 * KIB])]
fn redact_mixed(bencher: Bencher, len: usize) {
    let r = redactor();
    let secrets = if len <= 8 * KIB { 3 } else { 16 };
    let text = output(len, secrets);
    assert_eq!(r.redact(&text).count, secrets as u64);
    bencher
        .counter(divan::counter::BytesCount::new(len))
        .bench_local(|| r.redact(black_box(&text)));
}

#[divan::bench(args = [8 * KIB, 1024 * KIB])]
fn redact_clean(bencher: Bencher, len: usize) {
    let r = redactor();
    let text = output(len, 0);
    assert_eq!(r.redact(&text).count, 0);
    bencher
        .counter(divan::counter::BytesCount::new(len))
        .bench_local(|| r.redact(black_box(&text)));
}

#[divan::bench(args = [1024 * KIB])]
fn stream_mixed_4k_reads(bencher: Bencher, len: usize) {
    let r = redactor();
    let text = output(len, 16);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + 4 * KIB).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&text[at..end]);
        at = end;
    }
    bencher
        .counter(divan::counter::BytesCount::new(len))
        .bench_local(|| {
            let mut s = r.stream();
            let mut n = 0;
            for p in &pieces {
                n += s.push(black_box(p)).len();
            }
            n + s.finish().len()
        });
}

/// Building a redactor with policy values; the built-in rules compile once per process.
#[divan::bench]
fn build_with_policy_values() -> Redactor {
    Redactor::new(&airlock_redact::RedactionConfig {
        builtin: true,
        extra: vec![r"ACME-[0-9]{8}".to_owned()],
        exact: vec!["tr0ub4dor&3".to_owned()],
    })
    .unwrap()
}
