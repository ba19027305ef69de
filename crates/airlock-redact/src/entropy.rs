//! The Shannon-entropy gate of rules that carry `entropy`.

/// Shannon entropy of `bytes` in bits per byte: `-Σ p·log2(p)` over the byte frequencies.
///
/// gitleaks computes it over Unicode scalar values; secrets are ASCII, where the two agree.
pub(crate) fn shannon_entropy(bytes: &[u8]) -> f64 {
    if bytes.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::shannon_entropy;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn known_values() {
        assert!(close(shannon_entropy(b""), 0.0));
        assert!(close(shannon_entropy(b"aaaa"), 0.0));
        assert!(close(shannon_entropy(b"abab"), 1.0));
        assert!(close(shannon_entropy(b"abcd"), 2.0));
        assert!(close(shannon_entropy(b"0123456789abcdef"), 4.0));
    }

    #[test]
    fn random_tokens_pass_and_placeholders_fail_a_typical_gate() {
        assert!(shannon_entropy(b"JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F") > 4.0);
        assert!(shannon_entropy(b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx") < 3.0);
        assert!(shannon_entropy(b"aaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbb") < 3.0);
    }
}
