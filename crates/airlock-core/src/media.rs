//! Media types of released files, sniffed from their first bytes (never from the name
//! alone: a job can name anything `.png`).

/// Whether bytes are text worth redacting: valid UTF-8 without NUL bytes.
pub fn is_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

/// The media type of a file: magic numbers first, then text kinds by a light look at the
/// content and the name, else `application/octet-stream`.
pub fn sniff_media_type(name: &str, bytes: &[u8]) -> &'static str {
    const MAGIC: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"%PDF-", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
        (b"\x1f\x8b", "application/gzip"),
        (b"BZh", "application/x-bzip2"),
        (b"\xfd7zXZ\x00", "application/x-xz"),
        (b"\x28\xb5\x2f\xfd", "application/zstd"),
        (b"SQLite format 3\x00", "application/vnd.sqlite3"),
        (b"\x7fELF", "application/x-executable"),
        (b"OggS", "audio/ogg"),
        (b"fLaC", "audio/flac"),
        (b"ID3", "audio/mpeg"),
        (b"\x1a\x45\xdf\xa3", "video/webm"),
        (b"wOFF", "font/woff"),
        (b"wOF2", "font/woff2"),
        (b"\x00\x00\x01\x00", "image/vnd.microsoft.icon"),
        (b"BM", "image/bmp"),
    ];
    for (magic, media_type) in MAGIC {
        if bytes.starts_with(magic) {
            return media_type;
        }
    }
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" {
        match &bytes[8..12] {
            b"WEBP" => return "image/webp",
            b"WAVE" => return "audio/wav",
            _ => {}
        }
    }
    if bytes.len() >= 12 && &bytes[4..8] == b"ftyp" {
        return "video/mp4";
    }
    if !is_text(bytes) {
        return "application/octet-stream";
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]);
    let start = text.trim_start().to_ascii_lowercase();
    let extension = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    if start.starts_with("<svg") || (start.starts_with("<?xml") && start.contains("<svg")) {
        return "image/svg+xml";
    }
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        return "text/html";
    }
    if start.starts_with("<?xml") {
        return "application/xml";
    }
    match extension.as_deref() {
        Some("json") if start.starts_with('{') || start.starts_with('[') => "application/json",
        Some("jsonl" | "ndjson") => "application/x-ndjson",
        Some("csv") => "text/csv",
        Some("tsv") => "text/tab-separated-values",
        Some("md" | "markdown") => "text/markdown",
        Some("html" | "htm") => "text/html",
        Some("py") => "text/x-python",
        Some("js" | "mjs") => "text/javascript",
        Some("yaml" | "yml") => "application/yaml",
        _ => "text/plain",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers_win_over_names() {
        assert_eq!(
            sniff_media_type("x.txt", b"\x89PNG\r\n\x1a\n...."),
            "image/png"
        );
        assert_eq!(sniff_media_type("x.png", b"hello"), "text/plain");
        assert_eq!(sniff_media_type("r.pdf", b"%PDF-1.7"), "application/pdf");
        assert_eq!(
            sniff_media_type("d", b"\x00\x01\x02"),
            "application/octet-stream"
        );
    }

    #[test]
    fn text_kinds() {
        assert_eq!(
            sniff_media_type("a.json", b"{\"a\": 1}"),
            "application/json"
        );
        assert_eq!(sniff_media_type("a.csv", b"a,b\n1,2\n"), "text/csv");
        assert_eq!(
            sniff_media_type("p.svg", b"<svg xmlns=..."),
            "image/svg+xml"
        );
        assert_eq!(
            sniff_media_type("r.html", b"<!DOCTYPE html><html>"),
            "text/html"
        );
        assert!(is_text("héllo".as_bytes()));
        assert!(!is_text(b"a\0b"));
    }
}
