//! What keeps web pages out of a server that runs without tokens. Such a server listens on
//! loopback only, but a browser on the same machine can still reach it: a page can send a
//! "simple" cross-origin POST without a preflight, and a DNS-rebinding page can make its
//! own host name resolve to 127.0.0.1. So every request to it must name a loopback host
//! with the listening port in `Host` (a rebinding page's requests carry its own name), and
//! an `Origin`, when a browser sends one, must be loopback too. Run bodies must also be
//! `application/json` ([`require_json`]), which a page can only send after a preflight
//! this server never answers.
//!
//! This is the one place these rules live: `/mcp` goes through it like every other route
//! (rmcp's own host check is switched off).

use std::net::IpAddr;

/// Why a request to an unauthenticated server was refused.
pub type Refused = String;

/// True for `localhost` (any case, one trailing dot allowed), an IPv4 loopback address
/// (127.0.0.0/8) and `::1` (with or without brackets).
fn is_loopback_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Splits `host[:port]` (IPv6 literals in brackets) into host and port.
fn split_authority(authority: &str) -> Option<(&str, Option<&str>)> {
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        return match rest {
            "" => Some((host, None)),
            _ => Some((host, Some(rest.strip_prefix(':')?))),
        };
    }
    match authority.rsplit_once(':') {
        // A bare IPv6 address is not a valid Host; treat it as a name that fails below.
        Some((host, _)) if host.contains(':') => Some((authority, None)),
        Some((host, port)) => Some((host, Some(port))),
        None => Some((authority, None)),
    }
}

/// Checks a request's `Host` (or HTTP/2 `:authority`): a loopback name or address with
/// the port the server listens on (no port only when that is 80).
pub fn check_host(host: Option<&str>, listening_port: u16) -> Result<(), Refused> {
    let expected = format!("127.0.0.1:{listening_port}");
    let Some(host) = host else {
        return Err(format!(
            "a Host header is required (send Host: {expected}): without --tokens only \
             loopback callers are served"
        ));
    };
    let accepted = split_authority(host.trim()).is_some_and(|(name, port)| {
        let port_ok = match port {
            Some(port) => port.parse::<u16>() == Ok(listening_port),
            None => listening_port == 80,
        };
        port_ok && is_loopback_name(name)
    });
    if accepted {
        Ok(())
    } else {
        Err(format!(
            "Host {host:?} is not this server's loopback address (send Host: {expected}, or \
             localhost:{listening_port}): without --tokens only loopback callers are served, \
             which keeps DNS-rebinding web pages out"
        ))
    }
}

/// Checks a request's `Origin`: absent (not a browser, or a same-origin navigation), or
/// an `http`/`https` origin on a loopback host. `Origin: null` (sandboxed frames, `file:`
/// pages) is refused.
pub fn check_origin(origin: Option<&str>) -> Result<(), Refused> {
    let Some(origin) = origin else {
        return Ok(());
    };
    let authority = origin
        .trim()
        .strip_prefix("http://")
        .or_else(|| origin.trim().strip_prefix("https://"));
    let loopback = authority
        .filter(|a| !a.contains('/') && !a.contains('@'))
        .and_then(split_authority)
        .is_some_and(|(name, port)| {
            port.is_none_or(|p| p.parse::<u16>().is_ok()) && is_loopback_name(name)
        });
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "Origin {origin:?} is not a loopback origin: without --tokens this server serves \
             no web page from elsewhere (leave Origin out, or run with --tokens)"
        ))
    }
}

/// Checks a request body's `Content-Type`: `application/json`, parameters (charset)
/// allowed.
pub fn require_json(content_type: Option<&str>) -> Result<(), Refused> {
    let media = content_type
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or("");
    if media.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else if media.is_empty() {
        Err("the body must be JSON: send Content-Type: application/json".to_owned())
    } else {
        Err(format!(
            "Content-Type {media:?} is not accepted: the body must be JSON, sent with \
             Content-Type: application/json (with curl: -H 'Content-Type: application/json')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_with_the_listening_port() {
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "localhost.:8080",
            "127.1.2.3:8080",
            "[::1]:8080",
        ] {
            assert_eq!(check_host(Some(host), 8080), Ok(()), "{host}");
        }
        for host in [
            "evil.example:8080",
            "evil.example",
            "127.0.0.1",
            "127.0.0.1:8081",
            "localhost:80",
            "localhost.evil.example:8080",
            "127.0.0.1.nip.io:8080",
            "0.0.0.0:8080",
            "[::2]:8080",
            "::1",
            "127.0.0.1:8080x",
            "",
        ] {
            assert!(check_host(Some(host), 8080).is_err(), "{host}");
        }
        assert!(check_host(None, 8080).is_err());
        assert_eq!(check_host(Some("localhost"), 80), Ok(()));
        let message = check_host(Some("evil.example"), 8080).unwrap_err();
        assert!(message.contains("Host: 127.0.0.1:8080"), "{message}");
    }

    #[test]
    fn only_absent_or_loopback_origins() {
        for origin in [
            None,
            Some("http://localhost:3000"),
            Some("http://127.0.0.1"),
            Some("https://[::1]:8443"),
        ] {
            assert_eq!(check_origin(origin), Ok(()), "{origin:?}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "file://",
            "http://localhost.evil.example",
            "http://127.0.0.1@evil.example",
            "ftp://localhost",
            "http://localhost/x",
            "",
        ] {
            assert!(check_origin(Some(origin)).is_err(), "{origin}");
        }
    }

    #[test]
    fn bodies_must_be_labelled_json() {
        assert_eq!(require_json(Some("application/json")), Ok(()));
        assert_eq!(
            require_json(Some("Application/JSON; charset=utf-8")),
            Ok(())
        );
        for bad in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some(""),
            None,
        ] {
            let message = require_json(bad).unwrap_err();
            assert!(
                message.contains("Content-Type: application/json"),
                "{message}"
            );
        }
    }
}
